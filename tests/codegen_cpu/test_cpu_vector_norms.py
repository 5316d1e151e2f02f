"""``linalg_vector_norm`` over given dims is decomposed by ``fusion.decompose`` (torch's
own composite: abs, a power or max/min, sum, the root) and compiled by the cpu codegen (it
ran on eager: "has no C template"); order 0 and norms over every dim stay composites
(measured slower compiled: decompose_when.ONLY_WHEN). End to end through ``torch.compile``
against eager: orders 1, 2, 3, 0.5, +-inf, rows of NaN, +-inf, zeros, -0.0, values whose
squares overflow or underflow, low precision and a dtype argument, other dims, dynamic
shapes, F.normalize and the gradient."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import closer_than_eager, codegens, compiled

INF, NAN = float("inf"), float("nan")
ORDERS = [1, 2, 3, 0.5, INF, -INF]


def special_rows(cols: int, dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(cols)
    x = torch.randn(9, cols, dtype=torch.float64) * 3
    x[1] = 0.0  # every norm 0 (the -inf norm too)
    x[2, 3 % cols] = INF
    x[3, 5 % cols] = NAN
    x[4, ::2] = -INF
    x[5] = -0.0
    x[6] = 1e19 if dtype != torch.float64 else 1e160  # squares overflow
    x[7] = 1e-30 if dtype != torch.float64 else 1e-170  # squares underflow
    x[8, 0] = -5.0
    return x.to(dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12),
                                        (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("cols", [1, 7, 64, 1000])
@pytest.mark.parametrize("ord", ORDERS)
def test_norm_rows_match_eager(tmp_path, dtype, tol, cols, ord):
    def fn(x):
        return torch.linalg.vector_norm(x * 1, ord=ord, dim=-1)
    x = special_rows(cols, dtype)
    compiler, c = compiled(fn, tmp_path)
    got = c(x)
    assert codegens(compiler) == ["cpu"]
    want = fn(x)
    close = torch.isclose(got, want, rtol=tol, atol=tol)
    # or as accurate as eager against double precision (long f32 sums round differently)
    accurate = closer_than_eager(got, want, fn(x.double()), rel=1e-6, slack=0)
    assert (close | accurate).all(), (got, want)


@pytest.mark.parametrize("ord, dim, kept", [(0, -1, "composite"), (2, None, "composite"),
                                            (1, (0, 1), "cpu"), (2, -1, "cpu")])
def test_which_norms_are_decomposed(tmp_path, ord, dim, kept):
    def fn(x):
        return torch.linalg.vector_norm(x + 1, ord=ord, dim=dim) * 2
    x = special_rows(33, torch.float32)
    compiler, c = compiled(fn, tmp_path)
    torch.testing.assert_close(c(x), fn(x), equal_nan=True)
    # the composite has no C template: its group runs on eager
    assert ("eager" in codegens(compiler)) == (kept == "composite"), codegens(compiler)


@pytest.mark.parametrize("dim, keepdim", [((-1,), True), ((0,), False), ((1, 2), False),
                                          ((0, 2), True)])
def test_norms_over_other_dims(tmp_path, dim, keepdim):
    def fn(x):
        return torch.linalg.vector_norm(x - 1, ord=3, dim=dim, keepdim=keepdim) * 2
    torch.manual_seed(1)
    x = torch.randn(6, 33, 40)
    x[1, 2, 3] = NAN
    compiler, c = compiled(fn, tmp_path)
    torch.testing.assert_close(c(x), fn(x), rtol=1e-5, atol=1e-5, equal_nan=True)


def test_low_precision_with_a_dtype_and_integers(tmp_path):
    x = special_rows(50, torch.bfloat16)

    def fn(x):
        return torch.linalg.vector_norm(x, dim=-1, dtype=torch.float32), x.norm(dim=1)
    compiler, c = compiled(fn, tmp_path)
    for got, want in zip(c(x), fn(x)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, equal_nan=True)
    i = torch.arange(-40, 40, dtype=torch.int64).reshape(4, 20).float()
    compiler, c = compiled(lambda t: torch.linalg.vector_norm(t * 2, ord=1, dim=-1),
                           tmp_path / "i")
    torch.testing.assert_close(c(i), torch.linalg.vector_norm(i * 2, ord=1, dim=-1))


def test_normalize_and_its_gradient(tmp_path):
    def fn(x, w):
        return (torch.nn.functional.normalize(x * w, dim=-1) * 3).sum()
    torch.manual_seed(2)
    x = torch.randn(64, 96, requires_grad=True)
    w = torch.rand(96, requires_grad=True)
    compiler, c = compiled(fn, tmp_path)
    got = c(x, w)
    gx, gw = torch.autograd.grad(got, (x, w))
    want = fn(x, w)
    ex, ew = torch.autograd.grad(want, (x, w))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(gx, ex, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw, ew, rtol=1e-4, atol=1e-4)
    assert "cpu" in codegens(compiler)


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.integers(1, 9), cols=st.integers(1, 300), ord=st.sampled_from(ORDERS),
       seed=st.integers(0, 2**16))
def test_norm_dynamic_shapes_match_eager(tmp_path_factory, rows, cols, ord, seed):
    def fn(x):
        return torch.linalg.vector_norm(x - 1, ord=ord, dim=-1, keepdim=True)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    compiler, c = compiled(fn, tmp_path_factory.mktemp("n"), dynamic=True)
    torch.testing.assert_close(c(x), fn(x), rtol=1e-5, atol=1e-5)
