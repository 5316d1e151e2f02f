"""The README's commands do what it says: ``./dev demo`` (``./dev test`` is CI itself)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_dev_demo_shows_ir_check_and_triton_source():
    env = dict(os.environ, TORCHLOOM_VENV=sys.prefix)
    out = subprocess.run(["./dev", "demo"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "before:" in text and "after:" in text
    assert "aten.gelu.default" in text and "torchloom.fusion_group" in text
    assert "1 fusion groups, 1 kernels per call" in text
    assert "(matches eager)" in text
    assert "=== generated Triton kernel" in text and "@triton.jit" in text
    assert "=== generated C kernel" in text and "#pragma omp simd" in text
    assert "torchloom" in text and "x eager" in text


def test_ci_runs_the_readme_test_commands_and_the_compat_lane_lists_real_paths():
    readme = (ROOT / "README.md").read_text()
    ci = [ln.split(" ||")[0].strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
          if ln.startswith("./dev ")]
    assert ci == ["./dev test", "./dev test-compat"]
    for command in ci:
        assert f"\n$ {command} " in readme, command
    lane = [ln for ln in (ROOT / "tests" / "compat_lane.txt").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")]
    paths = [p for ln in lane for p in ln.split()]
    assert "tests/codegen_triton" in paths and "tests/test_device_check.py" in paths
    files = [ROOT / p.split("::")[0] for p in paths]
    assert [f for f in files if not f.exists()] == []
    for p, f in zip(paths, files):  # a test id names a test of its file
        name = p.partition("::")[2].partition("[")[0]
        assert not name or f"def {name}(" in f.read_text(), p
    for ln in lane:  # one directory per run: the directories' conftests share names
        run = [ROOT / p.split("::")[0] for p in ln.split()]
        assert len({f.parent if f.is_file() else f for f in run}) == 1, ln
