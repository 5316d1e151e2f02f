"""clamp, clamp_min and clamp_max with tensor bounds (the ``.Tensor`` overloads) fuse into
the cpu kernel (they ran as eager ops between kernels: not in the op table): bit for bit
eager's, NaN bounds and inputs, a minimum above the maximum, broadcast and 0-dim bounds,
mixed dtypes promoted as eager promotes them."""

from __future__ import annotations

import pytest
import torch

from conftest import compiled

CLAMPS = {
    "both": lambda x, lo, hi: torch.clamp(x * 2, min=lo, max=hi) + 1,
    "min_only": lambda x, lo, hi: torch.clamp(x * 2, min=lo) - hi,
    "max_only": lambda x, lo, hi: torch.clamp(x * 2, max=hi) * lo,
    "clamp_min": lambda x, lo, hi: torch.clamp_min(x * 2, lo) + 1,
    "clamp_max": lambda x, lo, hi: torch.clamp_max(x * 2, hi) + 1,
}
#: (x, min, max) dtypes: one dtype, then promotions (an int clamped by floats, f32 by f64)
DTYPES = [(torch.float32,) * 3, (torch.bfloat16,) * 3, (torch.int64,) * 3,
          (torch.int64, torch.float32, torch.float32), (torch.float32, torch.float64,
                                                        torch.float32),
          (torch.int32, torch.int64, torch.int64)]


def _inputs(dtypes, lo_shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g) * 3
    lo = torch.randn(lo_shape, generator=g) - 1
    hi = torch.randn(6, 1, generator=g) + 1
    if all(d.is_floating_point for d in dtypes):
        x[0, 0] = float("nan")
        hi[2, 0] = float("nan")
        if lo.dim():
            lo[1] = float("nan")
            lo[3] = 5.0  # above every maximum: the maximum wins, as in eager
    return [t.to(d) for t, d in zip((x, lo, hi), dtypes)]


@pytest.mark.parametrize("name", sorted(CLAMPS))
@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: "-".join(str(t)[6:] for t in d))
@pytest.mark.parametrize("lo_shape", [(5,), ()], ids=["row", "scalar"])
def test_tensor_bounds_fuse_and_match_eager_bit_for_bit(name, dtypes, lo_shape, tmp_path):
    f = CLAMPS[name]
    compiler, fn = compiled(f, tmp_path)
    args = _inputs(dtypes, lo_shape)
    got, want = fn(*args), f(*args)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    choices = [c for comp in compiler.compilations for c in comp.compiled.choices]
    assert choices and all(c.codegen == "cpu" for c in choices), [
        str(r) for c in choices for r in c.fallback_reasons]
