"""``logsumexp`` is decomposed by ``fusion.decompose`` (amax, the maximum's infinities
masked to 0, exp of the difference, sum, log, + the maximum: eager's own composite) and
compiled by the cpu codegen (it ran on eager: "has no C template"). End to end through
``torch.compile`` against eager: rows of NaN, +-inf, all -inf, -0.0, empty rows, keepdim,
several dims, columns, low precision and integer inputs, static and dynamic shapes, and
the gradient."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import codegens, compiled

INF, NAN = float("inf"), float("nan")


def special_rows(cols: int, dtype: torch.dtype) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(8, cols) * 30
    x[1] = -INF  # every element -inf: -inf
    x[2, 3 % cols] = INF  # an inf: inf
    x[3, 5 % cols] = NAN  # NaN
    x[4, ::2] = -INF  # some -inf
    x[5] = -0.0
    x[6, 0], x[6, 1:] = 100.0, -INF  # one finite value: itself
    x[7] = 1e-40  # denormals
    return x.to(dtype)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12),
                                        (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("cols", [1, 7, 64, 1000])
def test_logsumexp_rows_match_eager(tmp_path, dtype, tol, cols):
    def fn(x):
        return torch.logsumexp(x * 1, dim=-1)
    x = special_rows(cols, dtype)
    compiler, c = compiled(fn, tmp_path)
    got = c(x)
    assert codegens(compiler) == ["cpu"]
    torch.testing.assert_close(got, fn(x), rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("dim, keepdim", [((-1,), True), ((0,), False), ((1, 2), False),
                                          ((0, 2), True)])
def test_logsumexp_over_other_dims(tmp_path, dim, keepdim):
    def fn(x):
        return torch.logsumexp(x + 1, dim=dim, keepdim=keepdim) * 2
    torch.manual_seed(1)
    x = torch.randn(6, 33, 40) * 10
    x[0, 0, :] = -INF
    x[1, 2, 3] = NAN
    compiler, c = compiled(fn, tmp_path)
    torch.testing.assert_close(c(x), fn(x), rtol=1e-5, atol=1e-5, equal_nan=True)
    assert codegens(compiler) == ["cpu"]


def test_logsumexp_of_an_integer_tensor_and_an_empty_row(tmp_path):
    def fn(x):
        return torch.logsumexp(x * 2, dim=-1)
    x = torch.arange(-40, 40, dtype=torch.int64).reshape(4, 20)
    compiler, c = compiled(fn, tmp_path)
    got = c(x)
    assert got.dtype == torch.float32 and codegens(compiler) == ["cpu"]
    torch.testing.assert_close(got, fn(x), rtol=1e-6, atol=1e-6)
    empty = torch.zeros(3, 0)
    compiler, c = compiled(lambda x: torch.logsumexp(x * 2, dim=-1), tmp_path / "e")
    torch.testing.assert_close(c(empty), torch.full((3,), -INF))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.integers(1, 9), cols=st.integers(1, 300), scale=st.sampled_from([1e-3, 1, 50]),
       seed=st.integers(0, 2**16))
def test_logsumexp_dynamic_shapes_match_eager(tmp_path_factory, rows, cols, scale, seed):
    def fn(x):
        return torch.logsumexp(x - 1, dim=-1, keepdim=True)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * scale
    compiler, c = compiled(fn, tmp_path_factory.mktemp("lse"), dynamic=True)
    torch.testing.assert_close(c(x), fn(x), rtol=1e-5, atol=1e-5)
    assert "cpu" in codegens(compiler)


def test_logsumexp_gradient_matches_eager(tmp_path):
    def fn(x):
        return torch.logsumexp(x * 3, dim=-1).sum()
    torch.manual_seed(2)
    x = torch.randn(16, 257)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    compiler, c = compiled(fn, tmp_path)
    c(a).backward()
    fn(b).backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
    assert "cpu" in codegens(compiler)
