"""Differences from eager a hostile tester found (session 18), end to end through
``torch.compile``: a NaN clamp bound ignored, ``x ** -0.5`` computed with pow where eager
takes rsqrt, and a float -> int -> float round trip giving -0.0 (gcc folds
``(float)(int)x`` into ``trunc(x)``). Values and signs of zero compared exactly."""

from __future__ import annotations

import pytest
import torch

from conftest import compiled

NAN, INF = float("nan"), float("inf")
SPECIALS = [NAN, INF, -INF, -0.0, 0.0, -0.5, 0.5, -1.5, 2.5, 1e-40, -3e38, 7.0, -7.0]
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal values, NaN where eager has NaN, and the same sign of every zero (a NaN's
    sign bit means nothing)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    numbers = ~want.isnan()
    assert torch.equal(torch.signbit(got[numbers]), torch.signbit(want[numbers])), (got, want)


def values(dtype: torch.dtype, n: int) -> torch.Tensor:
    """``n`` values cycling through SPECIALS (a vector body and a scalar remainder)."""
    return torch.tensor([SPECIALS[i % len(SPECIALS)] for i in range(n)]).to(dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bound", [NAN, -INF, 0.0, -0.0])
def test_clamp_bounds_as_eager(tmp_path, dtype, bound):
    fns = {
        "clamp_min": lambda x: x.clamp(min=bound),
        "clamp_max": lambda x: x.clamp(max=bound),
        "clamp_both": lambda x: x.clamp(bound, 1.0) * 2,
        "clamp_upper_nan": lambda x: x.clamp(-1.0, bound) + 1,
        "hardtanh": lambda x: torch.nn.functional.hardtanh(x, bound, 1.0),
        "hardtanh_upper": lambda x: torch.nn.functional.hardtanh(x, -2.0, bound),
    }
    x = values(dtype, 37)
    for name, fn in fns.items():
        if name.startswith("hardtanh") and bound == bound and (
                bound > 1.0 or name == "hardtanh_upper" and bound < -2.0):
            continue  # eager rejects min_val > max_val
        _, compiled_fn = compiled(fn, tmp_path / name)
        same(compiled_fn(x), fn(x))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("exponent", [-0.5, 0.5, -1, -2, 2, 3])
def test_pow_special_exponents_as_eager(tmp_path, dtype, exponent):
    fn = lambda x: x ** exponent  # noqa: E731
    x = values(dtype, 29)
    _, compiled_fn = compiled(fn, tmp_path)
    got, want = compiled_fn(x), fn(x)
    if dtype == torch.float32:
        same(got, want)
    else:  # f64: eager's pow where the kernel takes sqrt (1 ulp); bf16/f16: one rounding
        torch.testing.assert_close(got, want, equal_nan=True)
        zeros = want == 0
        assert torch.equal(torch.signbit(got[zeros]), torch.signbit(want[zeros]))


@pytest.mark.parametrize("n", [1, 6, 16, 17, 40])
@pytest.mark.parametrize("ints", [torch.int32, torch.int64, torch.int16, torch.int8,
                                  torch.uint8])
@pytest.mark.parametrize("floats", [torch.float32, torch.float64])
def test_float_int_float_round_trip_keeps_positive_zero(tmp_path, n, ints, floats):
    fn = lambda x: x.to(ints).to(floats) * 3  # noqa: E731
    x = torch.tensor([[-0.5, -0.0, 0.5, -0.99, -1.5, 2.5][i % 6] for i in range(n)],
                     dtype=floats)
    _, compiled_fn = compiled(fn, tmp_path)
    same(compiled_fn(x), fn(x))
