"""The README's commands do what it says: ``./dev demo`` (``./dev test`` is CI itself)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
