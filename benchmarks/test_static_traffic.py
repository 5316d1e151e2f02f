"""Static traffic gates for an H100, checked without one (issue 15).

Every workload is traced on the meta device and compiled with ``explain --target sm_90``:
each kernel is generated for CUDA and built by Triton and ptxas on this CPU, nothing runs.
The gates read the kernels' own plans (bytes moved against each graph's compulsory
bytes, programs launched) and the binaries (spills): numbers that do not depend on the
machine, so they are gates, not measurements. Estimated times are ``bytes_moved`` at
2.97 TB/s (the copy bandwidth the issue uses for an H100): estimates, never measurements.

Gates (issue 15): the layer_norm -> GELU training step (forward and backward) on
8192 x 3072 f32 moves at most 1.3x its compulsory bytes (3.6x before); softmax and
layer_norm forward on 8192 x 8192 (rows that loop) at most 2.0x; the RMSNorm training
step at most 1.3x; ``x.sum()`` over 8192 x 3072 launches at least two programs per SM
(264); no kernel of these workloads (the GPU suite's seed workloads included) spills.

Run: ``python -m pytest benchmarks/test_static_traffic.py -s`` prints the table that
``benchmarks/RESULTS.md`` records.
"""

from __future__ import annotations

import math
import textwrap

import pytest

#: plans and binaries read, nothing timed: ./dev test runs these beside tests/
pytestmark = pytest.mark.counted

pytest.importorskip("triton")

from torchloom.report.explain import explain  # noqa: E402

#: H100 copy bandwidth used for the estimated times (bytes per second)
BANDWIDTH = 2.97e12
SMS = 132

_HEAD = "import torch\n\n\ndef workload(device='cpu'):\n    torch.manual_seed(0)\n"

#: name -> body of ``workload(device)`` (8192 x 3072 f32 unless said otherwise)
WORKLOADS = {
    "gelu_bookend": """
        x = torch.randn(8192, 3072, device=device)
        return (lambda x: torch.nn.functional.gelu(x.view(128, 64, 3072)).view(8192, 3072)), [x]
    """,
    "transpose_bookend": """
        x = torch.randn(768, 128, 64, device=device)
        return (lambda x: torch.relu(x.transpose(1, 2) * 2.0).transpose(1, 2)), [x]
    """,
    "layer_norm": """
        w, b = torch.rand(3072, device=device), torch.randn(3072, device=device)
        x = torch.randn(8192, 3072, device=device)
        return (lambda x: torch.nn.functional.layer_norm(x, (3072,), w, b)), [x]
    """,
    "softmax": """
        return (lambda x: torch.softmax(x, dim=-1)), [torch.randn(8192, 3072, device=device)]
    """,
    "bias_gelu_bf16": """
        y = torch.randn(8192, 3072, device=device, dtype=torch.bfloat16)
        b = torch.randn(3072, device=device, dtype=torch.bfloat16)
        return (lambda y, b: torch.nn.functional.gelu(y + b)), [y, b]
    """,
    "lstm_cell": """
        def cell(x, hx, cx, w_ih, w_hh, b_ih, b_hh):
            gates = x @ w_ih.t() + hx @ w_hh.t() + b_ih + b_hh
            i, f, g, o = gates.chunk(4, 1)
            cy = torch.sigmoid(f) * cx + torch.sigmoid(i) * torch.tanh(g)
            return torch.sigmoid(o) * torch.tanh(cy), cy
        b, h = 64, 1024
        t = lambda *shape: torch.randn(*shape, device=device)
        return cell, [t(b, h), t(b, h), t(b, h), t(4 * h, h), t(4 * h, h), t(4 * h), t(4 * h)]
    """,
    "layer_norm_gelu_train": """
        model = torch.nn.Sequential(torch.nn.LayerNorm(3072), torch.nn.GELU()).to(device)
        return model, [torch.randn(8192, 3072, device=device, requires_grad=True)]
    """,
    "rms_norm_train": """
        model = torch.nn.RMSNorm(3072).to(device)
        return model, [torch.randn(8192, 3072, device=device, requires_grad=True)]
    """,
    "softmax_8192x8192": """
        return (lambda x: torch.softmax(x, dim=-1)), [torch.randn(8192, 8192, device=device)]
    """,
    "layer_norm_8192x8192": """
        w, b = torch.rand(8192, device=device), torch.randn(8192, device=device)
        x = torch.randn(8192, 8192, device=device)
        return (lambda x: torch.nn.functional.layer_norm(x, (8192,), w, b)), [x]
    """,
    "sum_all": """
        return (lambda x: x.sum()), [torch.randn(8192, 3072, device=device)]
    """,
}

#: workload -> the largest bytes_moved / bytes_compulsory allowed
RATIO_GATES = {"layer_norm_gelu_train": 1.3, "rms_norm_train": 1.3,
               "softmax_8192x8192": 2.0, "layer_norm_8192x8192": 2.0}


@pytest.fixture(scope="module")
def static(tmp_path_factory) -> dict[str, dict]:
    """``explain --target sm_90 --json`` of every workload (kernels built one at a time)."""
    folder = tmp_path_factory.mktemp("static")
    results = {}
    for name, body in WORKLOADS.items():
        path = folder / f"{name}.py"
        path.write_text(_HEAD + textwrap.indent(textwrap.dedent(body).strip(), "    ") + "\n")
        results[name] = explain(path, target="sm_90").data
    return results


def ratio(data: dict) -> float:
    return data["bytes_moved"] / data["bytes_compulsory"]


def test_every_group_is_a_triton_kernel_built_for_sm90(static):
    for name, data in static.items():
        assert data["fallbacks"] == [], (name, data["fallbacks"])
        triton = [k for k in data["kernel_details"] if k["codegen"] == "triton"]
        assert triton and all(k["registers"] for k in triton), name
        assert data["max_abs_error"] is None and data["target"] == "sm_90"


@pytest.mark.parametrize("name", sorted(RATIO_GATES))
def test_traffic_gate(static, name):
    assert ratio(static[name]) <= RATIO_GATES[name], (name, ratio(static[name]))


def test_a_full_sum_launches_two_programs_per_sm(static):
    [kernel] = [k for k in static["sum_all"]["kernel_details"] if k["codegen"] == "triton"]
    assert math.prod(kernel["grid"]) >= 2 * SMS


def test_no_kernel_spills(static):
    spilled = [(name, k["name"], k["spills"]) for name, data in static.items()
               for k in data["kernel_details"] if k["spills"]]
    assert spilled == []


def test_print_the_static_table(static):
    """The table of benchmarks/RESULTS.md (estimated times: bytes at 2.97 TB/s)."""
    lines = ["| workload | kernels | bytes moved | compulsory | moved / compulsory | "
             "registers | spills | est. us at 2.97 TB/s |", "|" + " --- |" * 8]
    for name, data in static.items():
        kernels = data["kernel_details"]
        triton = [k for k in kernels if k["codegen"] == "triton"]
        lines.append(
            f"| {name} | {len(kernels)} | {data['bytes_moved'] / 1e6:.1f} MB | "
            f"{data['bytes_compulsory'] / 1e6:.1f} MB | {ratio(data):.2f} | "
            f"{', '.join(str(k['registers']) for k in triton)} | "
            f"{sum(k['spills'] or 0 for k in kernels)} | "
            f"{data['bytes_moved'] / BANDWIDTH * 1e6:.1f} |")
    print("\n" + "\n".join(lines))
    assert len(lines) == len(WORKLOADS) + 2
