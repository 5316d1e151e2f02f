"""The IR text form: parse(print(g)) prints identically; malformed text -> ParseError."""

from __future__ import annotations

import math

import pytest
import torch

from torchloom.errors import ParseError
from torchloom.ir import DTYPES, Graph, InputRef, ScalarType, TensorType, parse_graph, print_graph
from torchloom.ir.text import format_attr

REGION_TEXT = """\
graph @g(%x: f32[4, 8], %y: f32[8]) {
  %e, %r = torchloom.fusion_group(%x, %y) : f32[4, 8], f32[4] region @group0(%a: f32[4, 8], %b: f32[8]) {
    %s = aten.add.Tensor(%a, %b) : f32[4, 8]
    %e = aten.exp.default(%s) : f32[4, 8]
    %r = aten.sum.dim_IntList(%e) {dim = [-1]} : f32[4]
    return %e, %r
  }
  return %e, %r
}
"""


def roundtrip(text: str) -> str:
    printed = print_graph(parse_graph(text))
    assert print_graph(parse_graph(printed)) == printed
    return printed


def test_region_graph_prints_exactly_as_written():
    assert roundtrip(REGION_TEXT) == REGION_TEXT


def test_nested_regions_and_empty_return_round_trip():
    text = """\
graph @outer(%x: f32[2]) {
  %o = torchloom.call_subgraph(%x) : f32[2] region @sub(%p: f32[2]) {
    %q = torchloom.fusion_group(%p) : f32[2] region @inner(%z: f32[2]) {
      %n = aten.neg.default(%z) : f32[2]
      return %n
    }
    return %q
  }
  aten.print.default(%o) {s = "done"} : ()
  return
}
"""
    assert roundtrip(text) == text


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_every_dtype_round_trips(dtype):
    g = Graph("dt")
    x = g.add_input(TensorType.make([3], DTYPES[dtype]), "x")
    n = g.create("aten.clone.default", [x], [x.type], names=["y"])
    g.set_outputs(n.outputs)
    text = print_graph(g)
    assert f"%x: {dtype}[3]" in text
    back = parse_graph(text)
    assert back.inputs[0].type == x.type
    assert back.inputs[0].type.torch_dtype is DTYPES[dtype]
    assert print_graph(back) == text


def test_types_strided_devices_symbolic_unknown_and_scalars_round_trip():
    g = Graph("types")
    ins = [
        g.add_input(TensorType.make([4, 8], "f32", "cpu", [1, 4]), "strided"),
        g.add_input(TensorType.make([4, 8], "bf16", "cuda:0"), "gpu"),
        g.add_input(TensorType.make([2, 3], "f16", "cuda:1", [1, 2]), "both"),
        g.add_input(TensorType.make(["s0", 8], "f32"), "sym"),
        g.add_input(TensorType.make([None, "s1"], "i64"), "unknown"),
        g.add_input(TensorType.make(["2*s0 + 1", "(s1//2)"], "f32", "meta"), "expr"),
        g.add_input(TensorType.make([], "f64"), "scalar_tensor"),
        *[g.add_input(ScalarType(k), k) for k in ("int", "float", "bool", "str", "none", "any")],
        g.add_input(ScalarType("int", size="s0"), "height"),
    ]
    g.set_outputs(ins)
    text = print_graph(g)
    assert "%int: int, " in text and "%height: int[s0])" in text
    assert 'f32[4, 8] strided[1, 4]' in text
    assert 'bf16[4, 8] @cuda:0' in text
    assert 'f16[2, 3] strided[1, 2] @cuda:1' in text
    assert 'f32["2*s0 + 1", "(s1//2)"] @meta' in text
    assert 'i64[?, s1]' in text
    back = parse_graph(text)
    assert [v.type for v in back.inputs] == [v.type for v in ins]
    assert print_graph(back) == text


@pytest.mark.parametrize("bad", ["int[4]", "int[s0, s1]", 'int["2*s0"]', "int[?]",
                                 "float[s0]", "bool[s0]"])
def test_only_an_int_is_a_size_and_only_one_bare_symbol(bad):
    with pytest.raises(ParseError):
        parse_graph(f"graph @g(%n: {bad}) {{\n  return %n\n}}")
    with pytest.raises(ValueError, match="only an int is a size"):
        ScalarType("float", size="s0")
    with pytest.raises(ValueError, match="only an int is a size"):
        ScalarType("int", size="2*s0")


def test_a_symint_s_type_is_the_size_it_is():
    """Dynamo passes a graph its sizes as SymInts: one that is a bare symbol types as
    ``int[s0]``; an expression or a plain int as ``int``."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torchloom.ir.types import type_of
    env = ShapeEnv()
    s = env.create_unbacked_symint()
    assert type_of(s) == ScalarType("int", size=str(s.node.expr))
    assert type_of(s * 2) == ScalarType("int") and type_of(3) == ScalarType("int")


def test_attribute_values_round_trip():
    attrs = {
        "ints": (1, -2, 0), "floats": (0.5, -1e-05, 1e+20, -0.0), "inf": math.inf,
        "ninf": -math.inf, "b": True, "f": False, "n": None, "s": 'quo"te\\ \u00e9',
        "empty": (), "nested": ((1, 2), (InputRef(0), None)), "ref": InputRef(1),
        "dtype": torch.bfloat16, "layout": torch.strided, "mf": torch.channels_last,
        "device": torch.device("cuda", 1), "cpu": torch.device("cpu"), "big": 2 ** 62,
    }
    g = Graph("attrs")
    a = g.add_input(TensorType.make([2], "f32"), "a")
    b = g.add_input(TensorType.make([2], "f32"), "b")
    n = g.create("my.op", [a, b], [TensorType.make([2], "f32")], attrs, names=["r"])
    g.set_outputs(n.outputs)
    text = print_graph(g)
    back = parse_graph(text)
    node = next(back.nodes)
    for key, value in attrs.items():
        got = node.attrs[key]
        assert got == value and type(got) is type(value), key
    assert math.copysign(1.0, node.attrs["floats"][3]) == -1.0
    assert isinstance(node.attrs["nested"][1][0], InputRef)
    assert print_graph(back) == text


def test_nan_attribute_round_trips():
    assert format_attr(math.nan) == "nan"
    g = parse_graph("graph @g(%x: f32[1]) {\n  %y = aten.fill.Scalar(%x) {value = nan} : f32[1]\n"
                    "  return %y\n}\n")
    assert math.isnan(next(g.nodes).attrs["value"])


def test_multi_output_node_and_zero_output_node():
    text = """\
graph @m(%x: f32[4, 8], %w: f32[8], %b: f32[8]) {
  %y, %mean, %rstd = aten.native_layer_norm.default(%x, %w, %b) {eps = 1e-05, normalized_shape = [8]} : f32[4, 8], f32[4, 1], f32[4, 1]
  aten._assert_async.msg(%y) {assert_msg = "x"} : ()
  return %y, %rstd, %mean
}
"""
    assert roundtrip(text) == text
    node = next(parse_graph(text).nodes)
    assert [v.index for v in node.outputs] == [0, 1, 2]


def _column(text: str, line: int, token: str) -> int:
    """1-based column of the first ``token`` on ``line`` (past the end when token is empty)."""
    lines = text.split("\n")
    return len(lines[line - 1]) + 1 if token == "" else lines[line - 1].index(token) + 1


@pytest.mark.parametrize("text, line, token, words", [
    ("graph @g(%x: f32[4]) {\n  %y = aten.neg.default(%z) : f32[4]\n  return %y\n}\n",
     2, "%z", "undefined value %z"),
    ("graph @g(%x: f32[4]) {\n  %y = aten.neg.default(%x) : q32[4]\n  return %y\n}\n",
     2, "q32", "unknown dtype 'q32'"),
    ("graph @g(%x: f32[4]) {\n  %y = aten.neg.default(%x) f32[4]\n  return %y\n}\n",
     2, "f32", "expected ':'"),
    ("graph @g(%x: f32[4]) {\n  %x = aten.neg.default(%x) : f32[4]\n  return %x\n}\n",
     2, "%x", "%x is defined twice"),
    ("graph @g(%x: f32[4]) {\n  %y = aten.neg.default(%x) : f32[4]\n  return %y\n",
     4, "", "expected '}', found end of input"),
    ("graph @g(%x: f32[4]) {\n  %y = aten.neg.default(%x) : f32[4 4]\n  return %y\n}\n",
     2, "4]", "expected ','"),
    ("graph @g(%x: f32[4]) {\n  %y, %z = aten.neg.default(%x) : f32[4]\n  return %y\n}\n",
     2, "%y", "names 2 results but gives 1"),
    ("graph @g(%x: f32[4]) {\n  %y = aten.neg.default(%x) {a = 1, a = 2} : f32[4]\n"
     "  return %y\n}\n", 2, "a = 2", "attribute 'a' given twice"),
    ("graph @g(%x: f32[4]) {\n  %y = aten.neg.default(%x) {a = } : f32[4]\n  return %y\n}\n",
     2, "}", "expected an attribute value"),
    ("graph @g(%x: f32[4]) {\n  %y = aten.neg.default(%x) ; f32[4]\n}\n",
     2, ";", "unexpected character ';'"),
    ("graph @g(%x: f32[4]) {\n  return %x\n}\n%x", 4, "%x", "expected end of input"),
    ("graph g(%x: f32[4]) {\n}\n", 1, "g(", "expected a graph name"),
    ("graph @g(%x: f32[4]) {\n  %y = aten.x(%x) {d = #nonsense} : f32[4]\n  return %y\n}\n",
     2, "#nonsense", "unknown enum value"),
    ("graph @g(%x: f32[4]) {\n  %y = aten.x(%x) {d = [1, 2} : f32[4]\n  return %y\n}\n",
     2, "}", "expected ','"),
    # a region may not read a value of the enclosing graph
    ("graph @g(%x: f32[4]) {\n  %y = torchloom.fusion_group(%x) : f32[4] region @r(%a: f32[4]) {\n"
     "    %b = aten.neg.default(%x) : f32[4]\n    return %b\n  }\n  return %y\n}\n",
     3, "%x", "undefined value %x"),
])
def test_malformed_text_raises_parse_error_with_line_and_column(text, line, token, words):
    column = _column(text, line, token)
    with pytest.raises(ParseError) as info:
        parse_graph(text, source="bad.tlir")
    message = str(info.value)
    assert message.startswith(f"bad.tlir:{line}:{column}: "), message
    assert words in message
    assert (info.value.line, info.value.column) == (line, column)


def test_graph_names_with_any_characters_round_trip():
    g = Graph("my graph/é")
    x = g.add_input(TensorType.make([2]), "x")
    region = Graph('k "0"')
    a = region.add_input(x.type, "a")
    region.set_outputs([region.create("aten.neg.default", [a], [a.type]).output])
    node = g.create("torchloom.fusion_group", [x], [x.type], region=region)
    g.set_outputs(node.outputs)
    text = print_graph(g)
    assert text.startswith('graph @"my graph/\\u00e9"(') and '@"k \\"0\\""(' in text
    back = parse_graph(text)
    assert back.name == "my graph/é" and next(back.nodes).region.name == 'k "0"'
    assert print_graph(back) == text


def _nested_attr(depth: int) -> str:
    return ("graph @g(%x: f32[4]) {\n"
            f"  %a = aten.add.Tensor(%x, %x) {{alpha = {'[' * depth}1{']' * depth}}} : f32[4]\n"
            "  return %a\n}\n")


def _nested_regions(depth: int) -> str:
    opened = "".join(f"  %r{i} = torchloom.fusion_group(%x) : f32[4] region @g{i}(%x: f32[4]) {{\n"
                     for i in range(depth))
    closed = "".join(f"  return %r{i}\n}}\n" for i in reversed(range(depth)))
    return f"graph @g(%x: f32[4]) {{\n{opened}  return %x\n}}\n{closed}"


def test_nesting_up_to_the_limit_round_trips_and_deeper_is_a_parse_error():
    from torchloom.ir.text import MAX_NESTING
    for make in (_nested_attr, _nested_regions):
        graph = parse_graph(make(MAX_NESTING))
        assert print_graph(parse_graph(print_graph(graph))) == print_graph(graph)
        for depth in (MAX_NESTING + 1, 100_000 if make is _nested_attr else 5_000):
            with pytest.raises(ParseError, match=f"nested more than {MAX_NESTING} levels deep"):
                parse_graph(make(depth))
