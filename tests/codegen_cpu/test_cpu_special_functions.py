"""lgamma, digamma, erfinv, special_entr, special_xlog1py and the Bessel functions i0,
i0e, i1, i1e in the cpu kernels (their groups ran on eager): on special values (NaN, +-inf, +-0.0, the poles 0, -1, -2, the ends
+-1 of erfinv's domain and values just inside them, denormals, +-3e38) and random ones in
f32, f64 and bf16, against eager: NaN where eager has NaN, infinities of its signs, values
within f32's tolerance (digamma and erfinv are written from their mathematics, special.py,
not from eager's source), and the gradients autograd takes through them."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import codegens, compiled

SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, -2.0, -3.0, 0.5,
           -0.5, -2.5, 1e-40, -1e-40, 3e38, -3e38, 9.999999, 10.0, 10.000001, 1e-7, 0.9999999,
           -0.9999999, 1 - 2 ** -24, -1 + 2 ** -24, 1e17, 1e20, -1e8 - 0.5, 123.456, 29.99,
           30.0, 30.01, -31.0, 88.0, 88.7, 89.0, 700.0, -709.0, 710.0]
FNS = {
    "lgamma": lambda x, y: torch.lgamma(x),
    "digamma": lambda x, y: torch.digamma(x),
    "erfinv": lambda x, y: torch.erfinv(x),
    "entr": lambda x, y: torch.special.entr(x),
    "xlog1py": lambda x, y: torch.special.xlog1py(x, y),
    "xlog1py_scalar": lambda x, y: torch.special.xlog1py(x, 0.5),
    "i0": lambda x, y: torch.special.i0(x),
    "i0e": lambda x, y: torch.special.i0e(x),
    "i1": lambda x, y: torch.special.i1(x),
    "i1e": lambda x, y: torch.special.i1e(x),
}


def _inputs(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.cat([torch.tensor(SPECIAL * 2, dtype=torch.float64),
                   torch.randn(100, generator=g, dtype=torch.float64) * 6,
                   torch.rand(100, generator=g, dtype=torch.float64) * 2 - 1])
    y = torch.cat([torch.tensor(SPECIAL[::-1] * 2, dtype=torch.float64),
                   torch.randn(200, generator=g, dtype=torch.float64) * 3])
    return x.to(dtype), y.to(dtype)


def _assert_as_eager(name, got, want, low: bool):
    assert got.dtype == want.dtype and got.shape == want.shape, name
    assert torch.equal(got.isnan(), want.isnan()), (name, got[got.isnan() != want.isnan()],
                                                   want[got.isnan() != want.isnan()])
    for sign in (1, -1):
        assert torch.equal(got.isinf() & (got * sign > 0), want.isinf() & (want * sign > 0)), \
            name
    finite = want.isfinite()
    torch.testing.assert_close(got[finite], want[finite],
                               **({"rtol": 1e-2, "atol": 1e-2} if low else {}), msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_values_as_eager(tmp_path, dtype):
    def f(x, y):
        return tuple(fn(x + 0, y) for fn in FNS.values())

    compiler, fn = compiled(f, tmp_path)
    x, y = _inputs(dtype)
    for name, got, want in zip(FNS, fn(x, y), f(x, y), strict=True):
        _assert_as_eager(name, got, want, dtype == torch.bfloat16)
    assert set(codegens(compiler)) == {"cpu"}


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """One compiled function over the ops, for values hypothesis draws."""
    def f(x):
        return (torch.lgamma(x), torch.digamma(x), torch.erfinv(x.tanh()), torch.special.entr(x),
                torch.special.i0(x), torch.special.i0e(x), torch.special.i1(x),
                torch.special.i1e(x))
    return f, compiled(f, tmp_path_factory.mktemp("special"))[1]


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.floats(-(2.0 ** 100), 2.0 ** 100, allow_nan=False, width=32), min_size=1,
                       max_size=40))
def test_drawn_values_as_eager(wide, values):
    f, fn = wide
    x = torch.tensor(values, dtype=torch.float32)
    names = ("lgamma", "digamma", "erfinv", "entr", "i0", "i0e", "i1", "i1e")
    for name, got, want in zip(names, fn(x), f(x), strict=True):
        _assert_as_eager(name, got, want, False)


def test_gradients_as_eager(tmp_path):
    def f(x, y):
        x, y = x.detach().requires_grad_(), y.detach().requires_grad_()
        # (digamma's gradient is polygamma(1, x), which stays on eager: its values at the
        # poles are eager's formula's, large finite numbers, not the mathematics')
        out = (torch.lgamma(x.abs() + 0.5) + torch.erfinv(x * 0.9) + torch.special.entr(x.abs())
               + torch.special.xlog1py(x, y.abs()) + torch.special.i0(x)
               + torch.special.i1e(x * 40)).sum()
        return torch.autograd.grad(out, (x, y))

    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(257, generator=g) * 2 - 1, torch.randn(257, generator=g) * 4
    compiler, fn = compiled(f, tmp_path)
    for got, want in zip(fn(x, y), f(x, y), strict=True):
        torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-5)
    assert "eager" not in codegens(compiler)
