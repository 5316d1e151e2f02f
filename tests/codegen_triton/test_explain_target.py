"""``torchloom explain --target sm_90``: kernels generated for an H100 and built ahead of
time on this CPU (no GPU, nothing runs); their grid and bytes counted from the plan,
their registers and spills read from the binary."""

from __future__ import annotations

import json

import pytest
from torchloom.cli import main

POINTWISE = """
import torch

def workload(device="cpu"):
    return (lambda x: torch.relu(x * 2.0 + 1.0)), [torch.randn(1000, 37, device=device)]
"""

ROW_SUM = """
import torch

def workload(device="cpu"):
    w = torch.randn(37, device=device)
    return (lambda x: (x * w).sum(-1)), [torch.randn(1000, 37, device=device)]
"""


def explain_target(tmp_path, capsys, text: str, *extra) -> dict:
    path = tmp_path / "work.py"
    path.write_text(text)
    assert main(["explain", str(path), "--target", "sm_90", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_pointwise_kernel_is_built_for_sm90_and_counted(tmp_path, capsys):
    data = explain_target(tmp_path, capsys, POINTWISE)
    assert data["target"] == "sm_90" and data["max_abs_error"] is None
    [kernel] = data["kernel_details"]
    numel, f32 = 1000 * 37, 4
    assert kernel["codegen"] == "triton" and kernel["graph"] == "graph0"
    assert kernel["grid"] == [-(-numel // 1024)]  # the default block of 1024 elements
    assert kernel["bytes_read"] == kernel["bytes_written"] == numel * f32
    assert kernel["bytes_compulsory"] == 2 * numel * f32
    assert data["bytes_moved"] == data["bytes_compulsory"] == 2 * numel * f32
    assert kernel["registers"] > 0 and kernel["spills"] == 0
    assert data["fallbacks"] == [] and data["unique_kernels"] == 1


def test_a_broadcast_weight_counts_once(tmp_path, capsys):
    data = explain_target(tmp_path, capsys, ROW_SUM)
    [kernel] = data["kernel_details"]
    assert kernel["bytes_read"] == (1000 * 37 + 37) * 4  # every program re-reads w
    assert kernel["bytes_written"] == 1000 * 4
    assert kernel["grid"][0] >= 1 and kernel["registers"] > 0


def test_without_a_target_the_same_fields_have_no_registers(tmp_path, capsys, monkeypatch):
    path = tmp_path / "work.py"
    path.write_text(ROW_SUM.replace("1000", "40"))
    assert main(["explain", str(path), "--json"]) == 0  # on the CPU: the interpreter
    data = json.loads(capsys.readouterr().out)
    [kernel] = data["kernel_details"]
    assert kernel["codegen"] == "triton" and kernel["registers"] is None
    assert kernel["bytes_read"] == (40 * 37 + 37) * 4 and data["max_abs_error"] < 1e-4


def test_the_text_report_shows_traffic_and_that_nothing_ran(tmp_path, capsys):
    (tmp_path / "work.py").write_text(POINTWISE)
    assert main(["explain", str(tmp_path / "work.py"), "--target", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert "compiled for sm_90, nothing ran" in out
    assert "traffic: 0.3 MB moved, 0.3 MB compulsory (1.00x)" in out


@pytest.mark.parametrize("target", ["h100", "sm90"])
def test_a_target_that_is_not_a_cuda_architecture_is_a_user_error(tmp_path, capsys, target):
    (tmp_path / "work.py").write_text(POINTWISE)
    assert main(["explain", str(tmp_path / "work.py"), "--target", target]) == 2
    assert "expected a CUDA architecture such as sm_90" in capsys.readouterr().err


def test_dump_writes_the_kernels_generated_for_the_target(tmp_path, capsys):
    dump = tmp_path / "dump"
    data = explain_target(tmp_path, capsys, ROW_SUM, "--dump", str(dump))
    [source] = (dump / "graph0").glob("group0-triton.txt")
    text = source.read_text()
    assert "@triton.jit" in text and f"def {data['kernel_details'][0]['name']}(" in text
