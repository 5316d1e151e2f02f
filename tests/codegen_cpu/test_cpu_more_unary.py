"""atanh, acosh, deg2rad, rad2deg, sinc and logaddexp in the cpu kernels (their groups ran
on eager): on special values (NaN, +-inf, +-0.0, denormals, +-3e38, the domain's ends) and
random ones, in f32, f64 and bf16, against eager: deg2rad and rad2deg bit for bit (a product
by eager's constant), the others within f32's tolerance (libm's or libmvec's functions where
eager calls Sleef's) with NaN and infinities where eager has them, and their gradients."""

from __future__ import annotations

import pytest
import torch

from conftest import codegens, compiled

SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1e-40,
           3e38, -3e38, 2.0, 100.0, -100.0, 1e-7, 0.9999999, -0.9999999]
FNS = {
    "atanh": lambda x, y: torch.atanh(x),
    "acosh": lambda x, y: torch.acosh(x),
    "deg2rad": lambda x, y: torch.deg2rad(x),
    "rad2deg": lambda x, y: torch.rad2deg(x),
    "sinc": lambda x, y: torch.sinc(x),
    "logaddexp": lambda x, y: torch.logaddexp(x, y),
}
EXACT = {"deg2rad", "rad2deg"}


def _inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.tensor(SPECIAL * 3), torch.randn(100, generator=g) * 3,
                   torch.rand(100, generator=g) * 2 - 1])
    y = torch.cat([torch.tensor(SPECIAL[::-1] * 3), torch.randn(200, generator=g) * 3])
    return x.to(dtype), y.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_values_as_eager(tmp_path, dtype):
    def f(x, y):
        return tuple(fn(x + 0, y) for fn in FNS.values())

    compiler, fn = compiled(f, tmp_path)
    x, y = _inputs(dtype)
    low = dtype == torch.bfloat16
    for name, got, want in zip(FNS, fn(x, y), f(x, y), strict=True):
        assert torch.equal(got.isnan(), want.isnan()), name
        assert torch.equal(got.isinf() & (got > 0), want.isinf() & (want > 0)), name
        assert torch.equal(got.isinf() & (got < 0), want.isinf() & (want < 0)), name
        if name in EXACT:
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(got, want, equal_nan=True,
                                       **({"rtol": 1e-2, "atol": 1e-2} if low else {}))
    assert set(codegens(compiler)) == {"cpu"}


def test_gradients_as_eager(tmp_path):
    def f(x, y):
        x, y = x.detach().requires_grad_(), y.detach().requires_grad_()
        out = (torch.atanh(x * 0.9) + torch.acosh(x.abs() + 1.5) + torch.sinc(x)
               + torch.logaddexp(x, y) + torch.deg2rad(y)).sum()
        return torch.autograd.grad(out, (x, y))

    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(257, generator=g) * 2 - 1, torch.randn(257, generator=g) * 4
    _, fn = compiled(f, tmp_path)
    for got, want in zip(fn(x, y), f(x, y), strict=True):
        torch.testing.assert_close(got, want)
