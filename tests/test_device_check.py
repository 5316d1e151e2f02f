"""The GPU device check (``benchmarks/gpu/device_check.sh``, issue 46) cannot rot unnoticed:
its dry run, on this CPU, prints the plan with each part's time budget, records the
machine, builds every workload at a tiny size and runs it eagerly, and records one
"skipped: no CUDA" row per GPU row, in ``results.md`` and ``results.jsonl``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: part -> the rows the issue asks for (a part may have more)
GPU_ROWS = {
    "cuda_tests": {"pytest -m cuda"},
    "copy_bandwidth": {"copy_512MiB"},
    "anchors": {"gelu_bookend", "transpose_bookend", "layer_norm", "softmax",
                "bias_gelu_bf16", "lstm_cell"},
    "training": {"layer_norm_gelu_train", "rms_norm_train"},
    "cudagraphs": {"mlp_batch1"},
    "compile_time": {"torchloom", "inductor"},
    "hf_models": {"gpt2_train", "llama_train"},
}


@pytest.mark.slow
def test_dry_run_prints_the_plan_records_the_machine_and_skips_every_gpu_row(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    done = subprocess.run(["bash", "benchmarks/gpu/device_check.sh", "--dry-run"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]

    # the plan: every part with its budget, cumulative times within the deadline
    plan = [ln.split("|")[1:-1] for ln in done.stdout.splitlines()
            if ln.startswith("| ") and not ln.startswith(("| part", "| ---"))]
    budgets = {cells[0].strip(): int(cells[1]) for cells in plan}
    assert set(budgets) == {"machine", *GPU_ROWS}
    assert all(b > 0 for b in budgets.values())
    deadline = int(done.stdout.split("global deadline ")[1].split(" s")[0])
    assert int(plan[-1][2]) == sum(budgets.values()) <= deadline < 480
    assert "## plan" in (tmp_path / "results.md").read_text()

    machine = json.loads((tmp_path / "machine.json").read_text())
    assert machine["dry_run"] is True and machine["python"] and machine["torch"]
    assert machine["plugin_errors"] == [] and "triton" in machine["codegens"]
    assert "cudagraphs" in machine["runtime_wrappers"]
    assert machine["install"]["action"] == "none"  # this venv already runs this checkout

    rows = [json.loads(ln) for ln in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["part"] for r in rows if r["status"] == "ok"] == ["machine"]
    gpu = [r for r in rows if r["part"] != "machine"]
    assert all(r["status"] == "skipped" and "no CUDA" in r["note"] for r in gpu), gpu
    for part, wanted in GPU_ROWS.items():
        assert wanted <= {r["row"] for r in gpu if r["part"] == part}, part
    markdown = (tmp_path / "results.md").read_text()
    assert markdown.count("skipped: no CUDA") == len(gpu)
    assert f"{len(rows)} rows" in done.stdout.splitlines()[-1]


def test_quick_plan_fits_four_minutes(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "gpu"))
    import device_check
    parts = device_check.all_parts()
    allowance = device_check.INSTALL_ALLOWANCE_S
    quick = [p for p in parts if p.quick_budget_s]
    assert {p.name for p in quick} >= {"machine", "cuda_tests", "anchors", "cudagraphs"}
    assert sum(p.quick_budget_s for p in quick) + allowance <= device_check.QUICK_DEADLINE_S
    assert device_check.QUICK_DEADLINE_S <= 240 - 10
    assert sum(p.budget_s for p in parts) + allowance <= device_check.FULL_DEADLINE_S
    assert device_check.FULL_DEADLINE_S <= 480 - 20
    # slow parts last
    assert [p.name for p in parts][-2:] == ["compile_time", "hf_models"]
