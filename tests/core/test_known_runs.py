"""Offsets with known runs folded (torchloom.codegen.known_runs, ``IndexMath.address``): for
any shape, strides (broadcast, permuted, with gaps, sliced) and coordinates delinearised
from one index and from a run of it, the folded offset of every element is the unfolded
one; a run of one dim, or of dims not end to end, folds nothing."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.codegen import indexing
from torchloom.codegen.expr import Name

TRITON = indexing.IndexMath(indexing.TRITON, {})  # prints // (Python's integer division)


def _evaluate(code, values: dict) -> int:
    return eval(code.text, {}, dict(values))  # noqa: S307 (our own index text)


@st.composite
def _layouts(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 4)) for _ in range(rank))
    order = draw(st.permutations(range(rank)))
    strides = [0] * rank
    step = draw(st.integers(1, 3))
    for d in reversed(order):  # innermost first
        strides[d] = 0 if draw(st.integers(0, 5)) == 0 else step
        step *= shape[d] + draw(st.sampled_from([0, 0, 0, 1]))  # sometimes a gap
    start = draw(st.integers(0, rank - 1))  # the run: dims start.. delinearised as "rs"
    return shape, tuple(strides), start


@settings(max_examples=300, deadline=None)
@given(_layouts())
def test_a_folded_offset_is_the_unfolded_one_at_every_element(layout):
    shape, strides, start = layout
    coords = TRITON.delinear("i", shape)
    named = tuple(Name(f"c{k}") for k in range(len(shape)))
    known: dict = {}
    TRITON.remember(known, named, shape, "i")
    TRITON.remember(known, named[start:], shape[start:], "rs")
    folded = TRITON.address(named, strides, shape, known)
    plain = TRITON.address(named, strides, shape)
    run = 1
    for d in shape[start:]:
        run *= d
    for i in range(_total(shape)):
        values = {f"c{k}": _evaluate(c, {"i": i}) for k, c in enumerate(coords)}
        values.update(i=i, rs=i % run)
        assert _evaluate(folded, values) == _evaluate(plain, values), (folded.text, plain.text)


def _total(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_a_run_of_one_dim_folds_nothing():
    x, j = Name("x"), Name("j")
    known: dict = {}
    TRITON.remember(known, (x, j), (2, 2), "x * 2 + j")
    # columns read, rows broadcast: memory order j (stride 1), then x (stride 0)
    assert TRITON.address((x, j), (0, 1), (2, 2), known).text == "j"
    assert TRITON.address((x, j), (2, 0), (2, 2), known).text == "x * 2"
    for a, b in itertools.product(range(2), repeat=2):  # and the row-major case whole
        assert _evaluate(TRITON.address((x, j), (2, 1), (2, 2), known),
                         {"x": a, "j": b}) == a * 2 + b
