"""Integer division and remainder by a Python int in the cpu kernels (int_division.py):
``div`` with rounding_mode trunc and floor, ``//``, ``%`` (remainder) and ``fmod``, for
every signed integer dtype, by divisors of both signs, 1, -1 and the dtype's extremes, on
values including the extremes; bit for bit as eager, in one kernel. ``INT64_MIN / -1``
traps in C: the kernels give the negation, which wraps, as eager's floor division does
(eager's trunc division of INT64_MIN or INT32_MIN by -1 traps too, SIGFPE). A tensor
divisor stays with eager, which raises on a zero as eager does. One compiled function per
dtype (every divisor in it)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import codegens, compiled

DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8]
N = 64


def divisors(dtype: torch.dtype) -> list[int]:
    info = torch.iinfo(dtype)
    return [1, -1, 2, -3, 7, -16, 100 % (info.max + 1), info.max, info.min, info.min + 1]


def program(dtype: torch.dtype, reference: bool = False):
    """The divisions; ``reference``: trunc by -1 spelt as the negation (eager traps)."""
    def f(x):
        y = x + 0  # (a group of more than the divisions)
        out = []
        for b in divisors(dtype):
            trunc = -y if reference and b == -1 else torch.div(y, b, rounding_mode="trunc")
            out += [trunc, torch.div(y, b, rounding_mode="floor"), y // b, y % b,
                    torch.fmod(y, b), torch.remainder(y, b) * 2 + 1]
        return out
    return f


def edge_values(dtype: torch.dtype) -> torch.Tensor:
    info = torch.iinfo(dtype)
    edges = [info.min, info.min + 1, info.max, info.max - 1, 0, 1, -1, 2, -2, 3, -3, 7, -7,
             99, -100, 127, -128]
    return torch.tensor([edges[i % len(edges)] for i in range(N)]).to(dtype)


@pytest.fixture(scope="module", params=DTYPES, ids=str)
def divided(request, tmp_path_factory):
    dtype = request.param
    compiler, fn = compiled(program(dtype), tmp_path_factory.mktemp("division"))
    return dtype, program(dtype, reference=True), compiler, fn


def _same(divided, x: torch.Tensor) -> None:
    _, f, compiler, fn = divided
    for got, want in zip(fn(x), f(x), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want), (x, got, want)
    assert set(codegens(compiler)) == {"cpu"}


def test_edge_values_as_eager(divided):
    _same(divided, edge_values(divided[0]))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_drawn_values_as_eager(divided, data):
    info = torch.iinfo(divided[0])
    values = data.draw(st.lists(st.integers(info.min, info.max), min_size=N, max_size=N))
    _same(divided, torch.tensor(values, dtype=divided[0]))


def test_a_tensor_divisor_raises_on_zero_as_eager(tmp_path):
    def f(x, y):
        return (x + 1) % y, torch.div(x + 1, y, rounding_mode="trunc"), torch.fmod(x + 1, y)

    compiler, fn = compiled(f, tmp_path)
    x, y = torch.arange(-40, 24), torch.arange(64) % 9 - 4  # zeros among the divisors
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(x, y)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(x, y)
    y = torch.where(y == 0, 5, y)
    for got, want in zip(fn(x, y), f(x, y), strict=True):
        assert torch.equal(got, want)


def test_unsigned_and_out_of_range_divisors_stay_as_eager(tmp_path):
    """uint8 by a number (eager converts -3 to the unsigned type) and int8 by a number
    outside its range: eager's results whichever codegen runs them."""
    def f(u, i):
        return (u + 1) % 3, (u + 1) // 5, torch.fmod(i + 1, 1000), (i + 1) % -300

    compiler, fn = compiled(f, tmp_path)
    u = torch.arange(256 - 64, 256, dtype=torch.int64).to(torch.uint8)
    i = torch.arange(-64, 64, 2).to(torch.int8)
    for got, want in zip(fn(u, i), f(u, i), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("value", [-2 ** 63, -2 ** 63 + 1, 2 ** 63 - 1, 2 ** 53 + 1, -1, 0])
def test_int_constants_spelt_within_long_long(value):
    """Python ints as C constants (constants.int_constant): INT64_MIN as ``-MAX - 1``
    (``9223372036854775808LL`` does not fit a long long: gcc warns and types it unsigned),
    the same text in i64 and f64 literals, no constant outside a long long's range."""
    from torchloom_codegen_cpu.constants import int_constant, literal
    text = int_constant(value)
    assert "9223372036854775808" not in text
    assert eval(text.replace("LL", "")) == value  # noqa: S307 (our own integer text)
    assert int_constant(value) in literal(value, "i64").text


def test_int64_extremes_as_constants_in_a_kernel(tmp_path):
    """An i64 kernel with INT64_MIN and INT64_MAX as operands: eager's values (wrapping)."""
    def f(x):
        y = x + 0
        return (torch.where(y > 0, y, -2 ** 63), y + (2 ** 63 - 1), y.clamp(min=-2 ** 63 + 5),
                torch.remainder(y, -2 ** 63))
    x = torch.tensor([-2 ** 63, -5, -1, 0, 1, 7, 2 ** 63 - 1] * 9)
    compiler, fn = compiled(f, tmp_path)
    for got, want in zip(fn(x), f(x)):
        assert torch.equal(got, want)
    assert codegens(compiler) == ["cpu"]
