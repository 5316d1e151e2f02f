"""Multiply-adds round as eager's do (toolchain.py: ``-ffp-contract=off``): ``a * b + c``
rounds the product and then the sum, unless eager itself fuses them (add, sub and rsub
with an alpha, lerp: ``vec::fmadd``), where the kernel calls the prelude's ``tl_fma``.
gcc's default contraction made ``x * y - x * y`` the product's rounding error where eager
gives 0, and ``x + x * -4`` of 1e38 -3e38 where eager gives -inf. Compared bit for bit
with eager, end to end through ``torch.compile``, on edge values and on values hypothesis
draws (one compiled function per dtype: every example has the same shape)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import codegens, compiled

#: two of eager's widest vectors: eager's own loop has no scalar tail (which adds an alpha
#: times a tensor in two roundings where its vectors use one)
N = 64
FLOATS = [torch.float32, torch.float64]
EDGES = [3e38, -3e38, 1e38, -1e38, 1.7e308, -1.7e308, 0.1, 0.3, -0.0, 1e-40, float("inf"),
         float("nan")]


def same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal bits but for NaN's payload: values, NaN where eager has NaN, zeros' signs."""
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    numbers = ~want.isnan()
    assert torch.equal(torch.signbit(got[numbers]), torch.signbit(want[numbers]))


def programs(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, w: torch.Tensor):
    p = x * y
    return (p - x * y + z,            # eager: z (the products round alike)
            x + x * -4,               # eager: -inf of 1e38
            x * y + z, z - x * y,     # rounded twice
            torch.add(z, x, alpha=2.5), torch.sub(z, x, alpha=-3.0),  # fused: vec::fmadd
            torch.rsub(x, z, alpha=0.75), torch.add(z, 1e38, alpha=4),
            torch.lerp(x, y, w), torch.lerp(x, y, 0.3), torch.lerp(x, y, 0.8),
            torch.addcmul(z, x, y, value=0.5))


@pytest.fixture(scope="module", params=FLOATS, ids=["f32", "f64"])
def program(request, tmp_path_factory):
    compiler, fn = compiled(programs, tmp_path_factory.mktemp("contraction"))
    return request.param, compiler, fn


def _run(program, x, y, z, w) -> None:
    dtype, compiler, fn = program
    args = [torch.tensor(v, dtype=dtype) for v in (x, y, z, w)]
    for got, want in zip(fn(*args), programs(*args)):
        same(got, want)
    assert set(codegens(compiler)) == {"cpu"}


def test_edge_values_round_as_eager(program):
    cycle = lambda k: [EDGES[(i * k) % len(EDGES)] for i in range(N)]  # noqa: E731
    _run(program, cycle(1), cycle(5), cycle(7), [(i % 9 - 4) / 4 for i in range(N)])


def test_cancellation_and_overflow_as_eager(program):
    """The two differences gcc's contraction made: exact zeros and -inf."""
    dtype = program[0]
    big = 1e38 if dtype == torch.float32 else 1e308
    x = [0.1 * (i + 1) for i in range(N - 1)] + [big]
    _run(program, x, [0.3 - 0.01 * i for i in range(N)], [0.0] * N, [0.25] * N)
    got = program[2](*[torch.tensor(v, dtype=dtype) for v in (x, x, [0.0] * N, [0.5] * N)])
    assert (got[0][:-1] == 0).all() and got[1][-1].item() == -float("inf")


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=64,
                max_size=64))
def test_drawn_values_round_as_eager(program, values):
    """64 drawn values, 16 an operand, each operand going through its own at its own
    pace (x one value per 4 elements, y 3 per 4...), so each value meets several others."""
    _run(program, *([values[16 * k + (i * (2 * k + 1)) // 4 % 16] for i in range(N)]
                    for k in range(4)))
