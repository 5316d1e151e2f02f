"""clamp with tensor bounds (the ``.Tensor`` overloads) in Triton kernels, on the Triton
interpreter: eager's values bit for bit, NaN bounds and inputs and a minimum above the
maximum included."""

from __future__ import annotations

import pytest
import torch
from torchloom.backend import torchloom_backend
from torchloom.tools import Compiler

CLAMPS = {
    "both": lambda x, lo, hi: torch.clamp(x * 2, min=lo, max=hi) + 1,
    "min_only": lambda x, lo, hi: torch.clamp(x * 2, min=lo) - hi,
    "clamp_max": lambda x, lo, hi: torch.clamp_max(x * 2, hi) + 1,
}


@pytest.mark.parametrize("name", sorted(CLAMPS))
def test_tensor_bounds_match_eager_in_a_triton_kernel(name, tmp_path):
    f = CLAMPS[name]
    compiler = Compiler("default", cache_dir=tmp_path, compile_cache=False)
    torch._dynamo.reset()
    fn = torch.compile(f, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    g = torch.Generator().manual_seed(0)
    x, lo, hi = torch.randn(6, 5, generator=g) * 3, torch.randn(5, generator=g) - 1, \
        torch.randn(6, 1, generator=g) + 1
    x[0, 0], lo[1], hi[2, 0], lo[3] = float("nan"), float("nan"), float("nan"), 5.0
    torch.testing.assert_close(fn(x, lo, hi), f(x, lo, hi), rtol=0, atol=0, equal_nan=True)
    assert [c.codegen for comp in compiler.compilations
            for c in comp.compiled.choices] == ["triton"]
