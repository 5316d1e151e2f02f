"""Index math (torchloom.codegen.indexing, shared by the cpu and triton codegens): the
coordinate expressions of every view rule, evaluated as Python at every element, must
address the element torch's own view returns, for static and for symbolic sizes (printed
over runtime size names, checked at several concrete sizes, 1 included)."""

from __future__ import annotations

import itertools
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchloom.api import expr, indexing, symbols
from torchloom.codegen.indexing import C, TRITON, IndexMath, Unsupported, prod, same


class _Tl:  # what Triton's size functions are, in Python
    maximum, minimum, abs = max, min, abs


def _python(text, language) -> str:
    """C integer division is Python's floor division for the non-negative values here,
    and C's casts to 32 and 64 bits change none of them (``text``: an index expression's
    node or its text)."""
    text = str(text).replace("(int32_t)", "").replace("(int64_t)", "")
    return re.sub(r"(?<=[\w)]) / (?=[\w(])", " // ", text) if language.floor_div == "/" \
        else text


def texts(coords) -> tuple[str, ...]:
    """Coordinates (expression nodes) as the text they print."""
    return tuple(map(str, coords))


def _eval(text: str, language, env: dict) -> int:
    return eval(_python(text, language), {"tl": _Tl}, env)  # noqa: S307 - our own text


#: C's division with size functions Python can evaluate (C's own are checked as text)
C_EVAL = indexing.Language("c", "/", TRITON.functions)

LANGUAGES = pytest.mark.parametrize("language", [C, TRITON], ids=["c", "triton"])

VIEWS = [  # (rule, attrs, input shape, torch view of x)
    ("reshape", {}, (4, 6), lambda x: x.view(2, 12)),
    ("reshape", {}, (2, 3, 4), lambda x: x.view(6, 4)),
    ("reshape", {}, (6, 4), lambda x: x.view(2, 3, 2, 2)),
    ("reshape", {}, (3, 1, 4), lambda x: x.view(3, 4)),
    ("reshape", {}, (3, 4), lambda x: x.view(1, 3, 1, 4, 1)),
    ("permute", {"dims": (2, 0, 1)}, (2, 3, 4), lambda x: x.permute(2, 0, 1)),
    ("transpose", {"dim0": 0, "dim1": -1}, (2, 3, 4), lambda x: x.transpose(0, -1)),
    ("expand", {}, (3, 1), lambda x: x.expand(2, 3, 5)),
    ("slice", {"dim": 1, "start": 2, "end": 9, "step": 3}, (2, 10), lambda x: x[:, 2:9:3]),
    ("slice", {"dim": 0, "start": -3, "end": None, "step": 1}, (5, 2), lambda x: x[-3:]),
    ("select", {"dim": 1, "index": -2}, (3, 4, 2), lambda x: x[:, -2]),
    ("split", {"dim": 1, "split_size": 3}, (2, 8), lambda x: x.split(3, 1)[2]),
    ("split_with_sizes", {"dim": 0, "split_sizes": (1, 3, 2)}, (6, 2),
     lambda x: x.split_with_sizes((1, 3, 2), 0)[1]),
    ("unbind", {"dim": 1}, (2, 3, 4), lambda x: x.unbind(1)[2]),
]


@LANGUAGES
@pytest.mark.parametrize("rule,attrs,in_shape,view", VIEWS,
                         ids=[f"{v[0]}-{i}" for i, v in enumerate(VIEWS)])
def test_view_coordinates_address_the_viewed_element(language, rule, attrs, in_shape, view):
    x = torch.arange(int(torch.tensor(in_shape).prod())).view(in_shape)
    y = view(x)
    output = {"split": 2, "split_with_sizes": 1, "unbind": 2}.get(rule, 0)
    names = [f"c{i}" for i in range(y.dim())]
    exprs = IndexMath(language).view_coords(rule, tuple(names), attrs, tuple(y.shape),
                                            in_shape, {}, output)
    for idx in itertools.product(*(range(d) for d in y.shape)):
        at = tuple(_eval(e, language, dict(zip(names, idx))) for e in exprs)
        assert x[at] == y[idx]


@LANGUAGES
def test_delinear_and_linear_round_trip(language):
    ix = IndexMath(language)
    shape = (3, 1, 4, 5)
    exprs = ix.delinear("i", shape)
    assert exprs[1] == indexing.ZERO and indexing.is_zero(exprs[1])
    for i in range(60):
        coords = tuple(_eval(e, language, {"i": i}) for e in exprs)
        assert coords == tuple(torch.unravel_index(torch.tensor(i), shape))
        names = ("a", "b", "c", "d")
        assert _eval(ix.linear(names, shape), language, dict(zip(names, coords))) == i


def test_division_is_the_language_s():
    """C divides indices of static shapes by sizes that are no powers of two in 32 bits
    (what gcc vectorizes), cast back to 64; by powers of two, and at symbolic or large
    sizes, in the index's own type."""
    assert texts(IndexMath(C).delinear("x", (4, 6))) == (
        "(int64_t)((int32_t)x / 6)", "(int64_t)((int32_t)x % 6)")
    assert texts(IndexMath(C).delinear("rb * 16 + rl", (3, 7, 16))) == (
        "(int64_t)((int32_t)(rb * 16 + rl) / 112)",
        "(int64_t)(((int32_t)(rb * 16 + rl) / 16) % 7)", "(rb * 16 + rl) % 16")
    assert texts(IndexMath(C).delinear("x", (4, 8))) == ("x / 8", "x % 8")
    big = 2 ** 16
    assert texts(IndexMath(C).delinear("x", (big, big // 2 + 1))) == (
        f"x / {big // 2 + 1}", f"x % {big // 2 + 1}")
    assert texts(IndexMath(C, {"s0": "s0"}).delinear("x", (4, "s0"))) == (
        "x / s0", "x % s0")
    assert texts(IndexMath(TRITON).delinear("x", (4, 6))) == ("x // 6", "x % 6")


def test_known_linear_index_is_reused():
    ix = IndexMath(TRITON)
    known: dict = {}
    ix.remember(known, ("x0", "x1"), (4, 6), "xindex")
    assert str(ix.linear(("x0", "x1"), (4, 6), known)) == "xindex"
    assert ix.reshape(("x0", "x1"), (4, 6), (24,), known) == (expr.Name("xindex"),)
    # a dense but permuted layout is addressed in memory order
    assert ix.address(("x1", "x0"), (1, 6), (6, 4),
                      {(("x0", "x1"), (4, 6)): "xindex"}) == "xindex"


@settings(max_examples=120, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, "s0", "s1"]), min_size=2, max_size=4),
       st.integers(1, 3), st.sampled_from([C_EVAL, TRITON]), st.integers(1, 3),
       st.integers(1, 3), st.booleans())
def test_runs_of_known_coordinates_linearise_to_their_index(shape, split, language, s0,
                                                            s1, merge):
    """Row coordinates ``x0..`` delinearised from ``x`` and a reduction index ``r``: the
    linear index of (rows, r) is ``x * n + r`` with no division left, and through a
    view merging the leading dims too; every element evaluates to its row-major index."""
    shape = tuple(shape)
    split = min(split, len(shape) - 1)
    rows, red = shape[:split], shape[split:]
    ix = IndexMath(language, NAMES)
    known: dict = {}
    xs = ix.delinear("x", rows)
    ix.remember(known, xs, rows, "x")
    rs = ix.delinear("r", red)
    ix.remember(known, rs, red, "r")
    coords, full = tuple(xs) + tuple(rs), shape
    if merge and len(rows) >= 2:  # viewed as (rows merged, red...)
        merged = (prod(list(rows)),) + red
        coords, full = ix.reshape(coords, shape, merged, known), merged
    text = str(ix.linear(coords, full, known))
    if any(d != 1 for d in rows) and any(d != 1 for d in red):
        assert "x" in text and "r" in text and language.floor_div not in text, text
    values = {"s0": s0, "s1": s1}
    env = {NAMES[k]: v for k, v in values.items()}
    n_rows = symbols.evaluate(prod(list(rows)), values)
    n_red = symbols.evaluate(prod(list(red)), values)
    for x in range(n_rows):
        for r in range(n_red):
            assert _eval(text, language, {**env, "x": x, "r": r}) == x * n_red + r


@LANGUAGES
def test_all_size_one_coordinates_are_element_zero(language):
    """A shape of only size-1 dims has no real coordinate: its element is 0, never the index
    a loop over another all-size-1 shape was recorded under (a [1, 1] sum stored at
    ``out[r]`` once did that)."""
    ix = IndexMath(language)
    known = {((), ()): expr.Name("r")}
    assert ix.linear(("0", "0"), (1, 1), known) == indexing.ZERO
    assert ix.address(("0",), (1,), (1,), known) == indexing.ZERO


@LANGUAGES
def test_strided_address_matches_torch(language):
    x = torch.arange(60).view(3, 4, 5).permute(2, 0, 1)[1:, :, ::2]
    exprs = IndexMath(language).address(("a", "b", "c"), x.stride(), x.shape)
    flat = x.storage_offset()
    for idx in itertools.product(*(range(d) for d in x.shape)):
        off = _eval(exprs, language, dict(zip("abc", idx)))
        assert torch.arange(60)[flat + off] == x[idx]


# ---- symbolic sizes --------------------------------------------------------------------

NAMES = {"s0": "S_0", "s1": "S_1", "s2": "S_2"}
_HALF = "CeilToInt(IntTrueDiv(s0, 2))"  # math.ceil(s0 / 2) of a size (MobileViT's patches)


def test_sizes_print_over_the_size_arguments():
    ix = IndexMath(C, NAMES)
    assert ix.size(7) == "7"
    assert ix.size("s0") == "S_0"
    assert ix.size("2*s0 + s1") == "2 * S_0 + S_1"
    assert ix.size("(s0 + 1)*s1") == "(S_0 + 1) * S_1"
    assert ix.size("s0 - (s1 - 1)") == "S_0 - (S_1 - 1)"
    assert ix.size("(s0//2)") == "S_0 / 2"
    assert ix.size("Max(s0, s1)") == "(S_0 > S_1 ? S_0 : S_1)"
    assert IndexMath(TRITON, NAMES).size("FloorDiv(s0, 4)") == "S_0 // 4"
    with pytest.raises(Unsupported, match="true division"):
        ix.size("s0/2")
    with pytest.raises(Unsupported, match="no c form"):
        ix.size("floor(s0)")


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["s0", "2*s0", "s0*s1 + 3", "(s0 + 1)*(s1 - 1)", "s0 - s1 % 3",
                        "FloorDiv(s0*s1, 2)", "CeilDiv(s0, 3)", "Mod(s1, s0)",
                        "Max(s0, s1, 3)", "Min(2*s0, s1)", "s0**2", "-s0 + 3*s1"]),
       st.integers(1, 9), st.integers(1, 9))
def test_printed_sizes_evaluate_as_the_expression(expr, s0, s1):
    values = {"s0": s0, "s1": s1}
    want = symbols.evaluate(expr, values)
    assert _eval(IndexMath(TRITON, NAMES).size(expr), TRITON,
                 {NAMES[k]: v for k, v in values.items()}) == want


def test_prod_and_same():
    assert prod([2, 3]) == 6
    assert prod([2, "s0", "s1 + 1"]) == "2*s0*(s1 + 1)"
    assert prod([0, "s0"]) == 0
    assert same("2*s0", "s0*2") and same(prod(["s0", "s1"]), "s1*s0")
    assert not same("s0", "s1") and not same("s0", 2)


@pytest.mark.parametrize("language", [C_EVAL, TRITON], ids=["c", "triton"])
@pytest.mark.parametrize("dim", ["(s0//2)**2", f"{_HALF}**2", "3*(s0//4)**3 + 1",
                                 "(s0 + 1)**2", "(s0*s1)**2"])
def test_a_power_of_a_division_prints_each_factor_whole(language, dim):
    """MobileViT's ``CeilToInt(IntTrueDiv(A, 2))**2`` patches printed ``a / 2 * a / 2``,
    which is ``((a / 2) * a) / 2``: an output allocated 5 rows where 4 were due."""
    ix = IndexMath(language, NAMES)
    for s0, s1 in [(32, 3), (7, 2), (9, 9), (2, 5)]:
        assert _eval(ix.size(dim), language, {"S_0": s0, "S_1": s1}) == \
            symbols.evaluate(dim, {"s0": s0, "s1": s1})


def test_sizes_equal_past_a_threshold_only_are_not_the_same():
    """``64 - Max(0, 64 - s0)`` (the last ``s0`` of 64 positions) is ``s0`` only below 64,
    and strides ``[64, 1]`` are its contiguous ones only above: both were judged at large
    sizes alone."""
    assert not same("64-Max(0,64-s0)", "s0") and not same("64-Max(0,64-s0)", 64)
    assert not symbols.symbolic_contiguous([4, "64-Max(0,64-s0)"], [64, 1])
    assert symbols.symbolic_contiguous([4, "s0"], ["s0", 1])


def test_a_size_dividing_by_zero_at_sample_sizes_is_declined_in_words():
    """A Swin-like window reverse at dynamic shapes: ``s1 // (16*(s0//4)**2)`` is 0 where
    the symbols are drawn one by one (their relation is Dynamo's, not the IR's)."""
    size = "s0//((s1*s0)//(16*((s0//4))**2))"
    with pytest.raises(Unsupported, match="divides by zero at sample sizes") as caught:
        same(size, "s0")
    assert "Fraction" not in str(caught.value) and size in str(caught.value)


def _symbolic_shape(draw, rank):
    return tuple(draw(st.sampled_from([1, 2, 3, "s0", "s1"])) for _ in range(rank))


@st.composite
def _view_case(draw):
    """A symbolic input shape, a view of it (rule, attrs, output shape) and sizes."""
    shape = _symbolic_shape(draw, draw(st.integers(1, 4)))
    rank = len(shape)
    rule = draw(st.sampled_from(["merge", "split", "permute", "transpose", "slice",
                                 "select", "expand"]))
    if rule == "merge" and rank >= 2:  # two adjacent dims become one
        k = draw(st.integers(0, rank - 2))
        out = shape[:k] + (prod(shape[k:k + 2]),) + shape[k + 2:]
        return "reshape", {}, shape, out
    if rule == "split" and rank >= 2:  # the view's input is the merged shape
        k = draw(st.integers(0, rank - 2))
        merged = shape[:k] + (prod(shape[k:k + 2]),) + shape[k + 2:]
        return "reshape", {}, merged, shape
    if rule == "permute":
        dims = tuple(draw(st.permutations(range(rank))))
        return "permute", {"dims": dims}, shape, tuple(shape[d] for d in dims)
    if rule == "transpose" and rank >= 2:
        out = list(shape)
        out[0], out[-1] = out[-1], out[0]
        return "transpose", {"dim0": 0, "dim1": -1}, shape, tuple(out)
    if rule == "slice":  # x[..., start:] along dim 0, start from the front or the end
        start = draw(st.sampled_from([0, 1, -1]))
        d = shape[0]
        size = (max(d - start, 0) if start >= 0 else min(-start, d)) if isinstance(d, int) \
            else (f"{d} - {start}" if start >= 0 else f"Min({-start}, {d})")
        return "slice", {"dim": 0, "start": start, "step": 1}, shape, (size,) + shape[1:]
    if rule == "select":
        return "select", {"dim": 0, "index": -1}, shape, shape[1:]
    out = tuple(d for d in shape)  # expand size-1 dims to a symbol, add a leading dim
    return "expand", {}, shape, ("s1",) + tuple("s0" if d == 1 else d for d in out)


@settings(max_examples=150, deadline=None)
@given(_view_case(), st.sampled_from([C_EVAL, TRITON]), st.integers(1, 3), st.integers(1, 3))
def test_symbolic_view_coordinates_address_the_viewed_element(case, language, s0, s1):
    rule, attrs, in_shape, out_shape = case
    values = {"s0": s0, "s1": s1}
    concrete_in = [symbols.evaluate(d, values) for d in in_shape]
    concrete_out = [symbols.evaluate(d, values) for d in out_shape]
    x = torch.arange(int(torch.tensor(concrete_in).prod())).view(concrete_in)
    y = {"reshape": lambda: x.view(concrete_out),
         "permute": lambda: x.permute(attrs.get("dims", ())),
         "transpose": lambda: x.transpose(0, -1),
         "slice": lambda: x[attrs["start"]:],
         "select": lambda: x[-1],
         "expand": lambda: x.expand(concrete_out)}[rule]()
    assert list(y.shape) == concrete_out
    names = [f"c{i}" for i in range(len(out_shape))]
    ix = IndexMath(language, NAMES)
    known: dict = {}
    exprs = ix.view_coords(rule, tuple(names), attrs, out_shape, in_shape, known)
    env = {NAMES[k]: v for k, v in values.items()}
    for idx in itertools.product(*(range(d) for d in concrete_out)):
        at = tuple(_eval(e, language, {**env, **dict(zip(names, idx))}) for e in exprs)
        assert x[at] == y[idx]
    # and the element's address in the (contiguous) input agrees
    flat = x.reshape(-1)
    for idx in itertools.product(*(range(d) for d in concrete_out)):
        offset = ix.address(exprs, None, in_shape, known)
        assert flat[_eval(offset, language, {**env, **dict(zip(names, idx))})] == y[idx]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4).flatmap(lambda r: st.tuples(
    st.tuples(*[st.sampled_from([1, 3, "s0", "s1"])] * r), st.permutations(range(r)))),
    st.sampled_from([C_EVAL, TRITON]), st.integers(1, 3), st.integers(1, 3))
def test_symbolic_delinear_and_strided_address(case, language, s0, s1):
    """Row-major coordinates of an index, and the address of a permuted (symbolic-strided)
    tensor's element, at concrete sizes."""
    shape, perm = case
    values = {"s0": s0, "s1": s1}
    env = {NAMES[k]: v for k, v in values.items()}
    ix = IndexMath(language, NAMES)
    concrete = [symbols.evaluate(d, values) for d in shape]
    exprs = ix.delinear("i", shape)
    for i in range(int(torch.tensor(concrete).prod())):
        got = tuple(_eval(e, language, {**env, "i": i}) for e in exprs)
        assert got == tuple(int(c) for c in torch.unravel_index(torch.tensor(i), concrete))
    # a contiguous tensor permuted: its strides are products of symbols
    base = [shape[p] for p in perm]
    base_strides = [prod(base[k + 1:]) for k in range(len(base))]
    strides = [0] * len(shape)
    for k, p in enumerate(perm):
        strides[p] = base_strides[k]
    x = torch.arange(int(torch.tensor(concrete).prod())).view(
        [concrete[p] for p in perm]).permute([perm.index(d) for d in range(len(shape))])
    offset = ix.address(tuple(f"c{k}" for k in range(len(shape))), strides, shape)
    for idx in itertools.product(*(range(d) for d in concrete)):
        at = _eval(offset, language, {**env, **{f"c{k}": v for k, v in enumerate(idx)}})
        assert torch.arange(x.numel())[at] == x[idx]


def test_symbolic_broadcast_and_views_that_may_differ_are_declined():
    ix = IndexMath(C, NAMES)
    assert texts(ix.broadcast(("a", "b"), ("s0", "s1"), (1, "s1"))) == ("0", "b")
    with pytest.raises(Unsupported, match="sizes differ"):
        ix.broadcast(("a",), (4,), (3,))
    with pytest.raises(Unsupported, match="symbolic start"):  # (a length not start's)
        ix.view_coords("slice", ("a",), {"dim": 0, "start": "s1", "step": 2},
                       ("(s0 - s1 + 1)//2",), ("s0",))
    with pytest.raises(Unsupported, match="known only at run time"):
        ix.view_coords("slice", ("a",), {"dim": 0, "start": "s1", "end": "s2"},
                       ("s2 - s1",), ("s0",))
    with pytest.raises(Unsupported, match="unknown size"):
        ix.view_coords("slice", ("a",), {"dim": 0, "start": "s1"}, (None,), ("s0",))
    # a step-1 slice starts at its end less its length
    assert texts(ix.view_coords("slice", ("a",), {"dim": 0, "start": "s1"}, ("s0 - s1",),
                                ("s0",))) == ("a + S_1",)


def _clamped(bound: int | None, size: str, past: str) -> str:
    """Python's clamp of a slice bound to a dim of ``size``, as a size expression."""
    if bound is None:
        return past
    return f"Max({size} - {-bound}, 0)" if bound < 0 else f"Min({size}, {bound})"


@settings(max_examples=200, deadline=None)
@given(st.integers(-80, 80), st.one_of(st.none(), st.integers(-80, 80)), st.integers(0, 70),
       st.sampled_from([C_EVAL, TRITON]))
def test_a_slice_start_known_at_run_time_is_its_end_less_its_length(start, end, n, language):
    """A step-1 slice's start given by a graph value: wherever the slice holds an element,
    the derived start is where Python's slicing starts."""
    ix = IndexMath(language, NAMES)
    first, last = _clamped(start, "s0", "0"), _clamped(end, "s0", "s0")
    length = f"Max(0, ({last}) - ({first}))"
    attrs = {"dim": 0, "start": "%t's start", "end": end}
    (c,) = ix.view_coords("slice", ("a",), attrs, (length,), ("s0",))
    want = list(range(n))[start:end]
    for a, element in enumerate(want):
        assert _eval(str(c), language, {"a": a, "S_0": n}) == element


@pytest.mark.parametrize("language", [C_EVAL, TRITON], ids=["c", "triton"])
def test_views_whose_sizes_line_up_only_under_guards_are_one_group(language):
    """A view of ``[s0, s1]`` as ``[ceil(s0/2), s0//ceil(s0/2), s1]`` has equal sizes only
    where ``s0`` is even (Dynamo guards it; the IR does not say it): its dims are one group,
    each element at its row-major index (was declined: "the sizes may differ"); a view of
    ``[s1]`` as ``[s0]`` (equal where it is valid) reads the same index."""
    ix = IndexMath(language, NAMES)
    assert texts(ix.reshape(("a",), ("s0",), ("s1",))) == ("a",)
    out_shape = (_HALF, f"(s0//({_HALF}))", "s1")
    got = ix.reshape(("a", "b", "c"), out_shape, ("s0", "s1"))
    for s0, s1 in [(2, 3), (8, 5), (14, 1), (6, 4)]:
        sizes = {"S_0": s0, "S_1": s1}
        half = symbols.evaluate(_HALF, {"s0": s0})
        for a, b, c in itertools.product(range(half), range(s0 // half), range(s1)):
            env = {**sizes, "a": a, "b": b, "c": c}
            flat = (a * (s0 // half) + b) * s1 + c  # the element's row-major index
            assert [_eval(x, language, env) for x in got] == [flat // s1, flat % s1]
    assert IndexMath(language, NAMES).size(_HALF) in ("(S_0 + 2 - 1) / 2", "(S_0 + 2 - 1) // 2")


@pytest.mark.parametrize("language", [C_EVAL, TRITON], ids=["c", "triton"])
@pytest.mark.parametrize("dim, out", [("s1", "s0"), (f"2*{_HALF}", "s0"), (_HALF, 1),
                                      (2, "s0"), ("s1", 3)])
def test_a_broadcast_dim_not_judged_equal_reads_modulo_its_size(language, dim, out):
    """MobileViT's ``2*ceil(n/2)`` broadcast to ``n`` (equal where ``n`` is even, as
    Dynamo guards): the dim is the output's or 1 wherever the op is valid, and the
    coordinate modulo its size is right in both cases (was declined: "the sizes may
    differ")."""
    ix = IndexMath(language, NAMES)
    (got,) = ix.broadcast(("a",), (out,), (dim,))
    for s0 in (2, 4, 10):
        sizes = {"S_0": s0, "S_1": s0 if out == "s0" else 3}
        size = symbols.evaluate(dim, {"s0": s0, "s1": sizes["S_1"]})
        n = symbols.evaluate(out, {"s0": s0})
        if size not in (1, n):
            continue  # (the op is invalid there: eager raises, Dynamo's guards keep it out)
        for a in range(n):
            assert _eval(got, language, {**sizes, "a": a}) == (a if size == n else 0)
    with pytest.raises(Unsupported, match="sizes differ"):
        ix.broadcast(("a",), (4,), (3,))


def test_the_api_exposes_the_module():
    assert indexing.IndexMath is IndexMath and indexing.C is C


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 5, "s0", "s1"]), min_size=1, max_size=4),
       st.sampled_from([C, TRITON]), st.data())
def test_coordinates_and_offsets_are_trees_without_text(shape, language, data):
    """From names, every coordinate, view coordinate and offset the math returns is a
    tree of names, literals and operators: nothing in it is text to read again."""
    ix = IndexMath(language, NAMES)
    known: dict = {}
    coords = ix.delinear("x", shape)
    ix.remember(known, coords, shape, "x")
    perm = data.draw(st.permutations(range(len(shape))))
    permuted = ix.view_coords("permute", coords, {"dims": perm}, [shape[d] for d in perm],
                              shape, known)
    offsets = [ix.linear(coords, shape, known), ix.address(permuted, None, shape),
               ix.address(coords, [prod(shape[k + 1:]) for k in range(len(shape))], shape)]
    for e in (*coords, *permuted, *offsets):
        assert isinstance(e, (expr.Name, expr.Literal, expr.Op)), e
        assert not any(isinstance(n, expr.Op) and n.opaque for n in expr.walk(e)), e
    assert all(indexing.is_zero(c) for c, d in zip(coords, shape) if d == 1)
