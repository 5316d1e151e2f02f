"""Symbolic sizes: expressions read as data and evaluated safely, the canonical form that
numbers symbols by first appearance, and the guards that check a symbolic graph's inputs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.codegen.eager import EagerCodegen
from torchloom.errors import ParseError
from torchloom.ir import parse_graph, print_graph, structural_hash
from torchloom.ir.symbols import (SymbolicDimError, evaluate, guard_namespace, parse_dim,
                                  python_source, rename_dim, sample_points, symbols_of)
from torchloom.ops.aten import default_registry
from torchloom.runtime.executor import CompiledGraph


@pytest.fixture(scope="module")
def registry():
    return default_registry()


# torch's printed forms (str of the ShapeEnv's sympy expressions) and their meaning
EXPRESSIONS = [
    ("s0", lambda a, b: a),
    ("2*s0", lambda a, b: 2 * a),
    ("s0*s1+3", lambda a, b: a * b + 3),
    ("(s0//4)", lambda a, b: a // 4),
    ("((s0+3)//4)", lambda a, b: -(-a // 4)),
    ("Mod(s0,3)", lambda a, b: a % 3),
    ("PythonMod(s1,5)", lambda a, b: b % 5),
    ("Max(s0,s1)", lambda a, b: max(a, b)),
    ("Min(s0,s1)", lambda a, b: min(a, b)),
    ("floor(s0/3)", lambda a, b: a // 3),
    ("floor(s0/2-1/2)", lambda a, b: (a - 1) // 2),
    ("1-s0", lambda a, b: 1 - a),
    ("s0**2", lambda a, b: a * a),
]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_expressions_evaluate_as_torch_means_them(a, b):
    for text, meaning in EXPRESSIONS:
        want = meaning(a, b)
        assert evaluate(text, {"s0": a, "s1": b}) == want, text
        source = python_source(text, lambda s: f"v_{s}")
        assert eval(source, guard_namespace(), {"v_s0": a, "v_s1": b}) == want, text


@pytest.mark.parametrize("text", ['__import__("os")', "s0.real", "Max", "s0(1)", "[s0]", "lambda: 1",
                                  "s0 if s1 else 2", "1.5", "s0**s1", "2**99999",
                                  "open(s0)", "Max(s0, key=s1)", "s0; s1"])
def test_anything_but_size_arithmetic_is_rejected(text):
    with pytest.raises(SymbolicDimError):
        parse_dim(text)


def test_unbound_and_unknown_dims_have_no_value():
    assert evaluate("2*s0", {"s1": 3}) is None and evaluate(None, {}) is None
    assert evaluate(7, {}) == 7


def test_symbols_are_found_and_renamed_in_order_of_appearance():
    assert symbols_of("2*s27*s3+s27") == ["s27", "s3"]
    assert symbols_of(8) == [] and symbols_of(None) == []
    assert rename_dim("2*s27*s3+s27", {"s27": "s0", "s3": "s1"}) == "2*s0*s1+s0"
    assert rename_dim("Max(s3,4)", {"s3": "s9"}) == "Max(s9,4)"  # function names untouched
    assert symbols_of("Max(N,2*batch)") == ["N", "batch"]  # hand-written IR names its own


def _graph(a: str, b: str, c: str) -> str:
    return f"""\
graph @g(%x: f32[{a}, 8], %y: f32[{b}, "2*{c}"]) {{
  %z = aten.neg.default(%x) : f32[{a}, 8]
  return %z
}}
"""


def test_graphs_equal_up_to_symbol_names_hash_the_same():
    first = structural_hash(parse_graph(_graph("s3", "s3", "s7")))
    assert structural_hash(parse_graph(_graph("s9", "s9", "s1"))) == first
    # which dims share a symbol is structure: it changes the hash
    assert structural_hash(parse_graph(_graph("s9", "s1", "s1"))) != first
    assert structural_hash(parse_graph(_graph("s9", "s9", "s9"))) != first
    assert structural_hash(parse_graph(_graph("4", "4", "s1"))) != first


def test_symbolic_types_round_trip_through_text():
    text = _graph("s3", "s3", "s7")
    assert print_graph(parse_graph(text)) == text


@pytest.mark.parametrize("dim", ['"__import__(\'os\')"', '"s0.real"', '"s0 if s1 else 2"'])
def test_text_with_a_dim_that_is_not_size_arithmetic_does_not_parse(dim):
    with pytest.raises(ParseError, match="not allowed|not an expression"):
        parse_graph(_graph(dim, "s3", "s7"))


SYMBOLIC = """\
graph @g(%x: f32[s0, s1], %y: f32[s1] strided[2], %z: f32["2*s0", s1]) {
  %a = aten.add.Tensor(%x, %y) : f32[s0, s1]
  %b = aten.cat.default(%a, %x) {tensors = [$0, $1]} : f32["2*s0", s1]
  %c = aten.mul.Tensor(%b, %z) : f32["2*s0", s1]
  return %c
}
"""


def _compiled(registry, text: str):
    calls = []

    def fallback(*args):
        calls.append(args)
        return (torch.cat([args[0] + args[1], args[0]]) * args[2],)

    g = parse_graph(text)
    return CompiledGraph(g, registry, [EagerCodegen()], fallback=fallback), calls


def test_inputs_that_keep_the_relations_run_compiled_at_any_size(registry):
    compiled, calls = _compiled(registry, SYMBOLIC)
    for rows, cols in [(2, 3), (5, 7), (1, 1), (0, 4)]:
        x, z = torch.randn(rows, cols), torch.randn(2 * rows, cols)
        y = torch.randn(2 * cols)[::2]
        got = compiled(x, y, z)[0]
        torch.testing.assert_close(got, torch.cat([x + y, x]) * z)
    assert calls == [] and compiled.fallback_calls == 0


@pytest.mark.parametrize("bad, words", [
    ((3, 4, 4, 5, 4), "%z: compiled for f32[\"2*s0\", s1]"),     # z rows != 2 * x rows
    ((3, 4, 4, 1, 4), "%z: compiled for f32[\"2*s0\", s1]"),     # ... though it broadcasts
    ((3, 4, 5, 6, 4), "%y: compiled for f32[s1] strided[2]"),    # y size != x cols
    ((3, 4, 4, 6, 5), "%z"),                                      # z cols != x cols
    ((3, 4, 4, 6, 4, "f64"), "%x: compiled for f32[s0, s1]"),    # dtype
    ((3, 4, 4, 6, 4, "contiguous y"), "%y"),                      # strides of y
])
def test_inputs_breaking_a_relation_fall_back_with_the_reason(registry, bad, words, caplog):
    compiled, calls = _compiled(registry, SYMBOLIC)
    rows, cols, ycols, zrows, zcols, *what = bad
    x = torch.randn(rows, cols, dtype=torch.float64 if what == ["f64"] else torch.float32)
    y = torch.randn(ycols) if what == ["contiguous y"] else torch.randn(2 * ycols)[::2]
    z = torch.randn(zrows, zcols)
    try:
        want = torch.cat([x + y, x]) * z
    except RuntimeError:
        want = None  # eager rejects these inputs too: so must the fallback
    if want is None:
        with pytest.raises(RuntimeError):
            compiled(x, y, z)
    else:
        torch.testing.assert_close(compiled(x, y, z)[0], want)
    assert len(calls) == 1 and compiled.fallback_calls == 1
    assert words in compiled.fallback_reason


def test_a_graph_without_symbolic_inputs_has_no_symbolic_guard(registry):
    compiled, _ = _compiled(registry, """\
graph @g(%x: f32[4]) {
  %a = aten.neg.default(%x) : f32[4]
  return %a
}
""")
    assert "_symbolic_guard" not in compiled.source
    compiled_sym, _ = _compiled(registry, SYMBOLIC)
    assert "_symbolic_guard" in compiled_sym.source


@pytest.mark.parametrize("shape, strides, contiguous", [
    (("s0", 32), (32, 1), True),
    (("s0", "s1", 8), ("8*s1", 8, 1), True),
    (("s0", "s1", 8), ("s1*8", 8, 1), True),          # any printed order
    (("s0", "s1"), (1, "s0"), False),                 # transposed
    (("s0", 1, "s1"), ("s1", 7, 1), True),            # a size-1 dim's stride never matters
    (("s0", "2*s1"), ("2*s1", 1), True),
    (("s0", "s1"), ("s1+1", 1), False),               # padded rows
    (("s0", None), (None, 1), False),                 # unknown: not known contiguous
    # transposed, its dim 1 at every point drawn but 2 at s0 = 2: not known contiguous
    ((4, "1+Max(0,3-s0)", "s0"), ("s0*(1+Max(0,3-s0))", 1, "1+Max(0,3-s0)"), False),
    # MobileViT's patch grid transposed: X // CeilToInt(X / 2) is 1 for odd X, 2 for even
    ((8, "s0//CeilToInt(IntTrueDiv(s0,2))", "CeilToInt(IntTrueDiv(s0,2))", 4),
     ("4*CeilToInt(IntTrueDiv(s0,2))*(s0//CeilToInt(IntTrueDiv(s0,2)))", 4,
      "4*(s0//CeilToInt(IntTrueDiv(s0,2)))", 1), False),
    # a chunk of at most 8 rows of 3 (the last one shorter) is contiguous at any size; two
    # chunks laid out 24 apart are so only where a chunk has 8 rows (s0 >= 8: at every
    # sample point, so they were taken for contiguous)
    (("Max(1,Min(8,s0))", 3), (3, 1), True),
    ((2, "Max(1,Min(8,s0))", 3), (24, 3, 1), False),
])
def test_symbolic_contiguity_is_decided_by_value(shape, strides, contiguous):
    from torchloom.ir.symbols import symbolic_contiguous
    from torchloom.ir.types import TensorType
    assert symbolic_contiguous(shape, strides) is contiguous
    # a contiguous type keeps no strides (prints like a hand-written one)
    assert (TensorType.make(shape, "f32", "cpu", strides).strides is None) is contiguous


def test_plugins_reach_symbolic_sizes_through_the_public_api():
    from torchloom import api
    assert "symbols" in api.__all__
    assert api.symbols.evaluate("2*s0+s1", {"s0": 3, "s1": 4}) == 10
    assert api.symbols.symbolic_contiguous(("s0", 8), (8, 1))


def test_bind_symbols_reads_each_symbol_from_its_first_bare_dim():
    from torchloom.ir.symbols import bind_symbols
    shapes = [None, ("2*s0", 8), (4, "s1", "s0"), ("s0", "s2")]
    assert bind_symbols(shapes) == {"s1": (2, 1), "s0": (2, 2), "s2": (3, 1)}


@pytest.mark.parametrize("text, wrapped", [("2*s0 + FloorDiv(s1, 3)", False),
                                           ("Max(s0, Mod(s1, 4)) - 1", False),
                                           ("IntTrueDiv(s0, 2)", True), ("s0/2", True),
                                           ("s0**2", True)])
def test_only_a_division_or_power_is_checked_for_an_integer(text, wrapped):
    """Integer arithmetic gives integers: only expressions that can give a fraction are
    passed through ``_sym_int`` (which raises on a non-integer), the rest run bare."""
    assert ("_sym_int" in python_source(text, lambda s: f"v_{s}")) == wrapped


def test_sample_points_fix_each_symbol_by_its_name_and_point():
    """One point generator serves every judgment at sample sizes (indexing's ``points``,
    wholes, ``symbolic_contiguous``): a symbol's value depends on its name, the point and
    the salt only, and the last point is small where asked."""
    a = sample_points({"s0", "s1"}, 4, small_last=True)
    b = sample_points({"s1", "s7", "s0"}, 4, small_last=True)
    assert [p["s0"] for p in a] == [p["s0"] for p in b] and len(a) == 4
    assert all(2 <= p[s] < 1 << 20 for p in a[:3] for s in p)
    assert all(8 <= v < 64 for v in a[-1].values())
    assert sample_points({"s0"}, 2, salt="x") != sample_points({"s0"}, 2)
    assert sample_points(set(), 3) == [{}, {}, {}]


@pytest.mark.parametrize("a, b, equal", [
    ("Max(1,Min(8,s0))", 8, False),          # a chunk's rows: 8 only from s0 = 8
    ("Min(100,s0)", 100, False),             # a threshold past the small random point
    ("Max(3,s0)", "s0", False),
    ("Max(2,s0)", "s0", True),               # symbols are 2 or more: no threshold bites
    ("Min(s0,s1)", "Min(s1,s0)", True),
    ("s0//2*2", "s0", False),                # odd sizes
    ("Mod(s0,1)", 0, True),
    ("2*s0+s1", "s1+s0*2", True),            # polynomials: the random points decide
])
def test_dims_with_thresholds_are_compared_at_small_sizes(a, b, equal):
    """Two dims equal at large random sizes may differ below a threshold (the rows of the
    last chunk of a chunked loss: ``Max(1, Min(8, s0))`` rows were walked as 8, leaving an
    output's other rows unwritten); polynomials equal at the random points are equal."""
    from torchloom.codegen.samples import same
    from torchloom.ir.symbols import agree_at_small_sizes, is_polynomial
    assert same(a, b) is equal and same(b, a) is equal
    assert agree_at_small_sizes(a, b) is equal or not (is_polynomial(a) and is_polynomial(b))
    assert is_polynomial("2*s0+s1*s1-3") and not is_polynomial("Max(1,s0)")
    assert not is_polynomial("s1**2")  # (a power: compared at small sizes too)
    assert not is_polynomial("s0//2") and is_polynomial(4)


def test_small_size_points_turn_at_each_constant_of_the_dims():
    from torchloom.ir.symbols import small_size_points
    points = small_size_points(("Min(1000,s0)", "s1"))
    values = {p["s0"] for p in points}
    assert {2, 8, 999, 1000, 1001} <= values and all(v >= 2 for v in values)
    assert any(p["s0"] != p["s1"] for p in points)  # staggered points too
