"""Program and lane coordinates as expression nodes (lanes.py): the text Triton reads,
parenthesised by precedence, and the names a statement's scan finds in the tree."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torchloom.api import expr, stmt

from torchloom_codegen_triton import lanes


def test_coordinates_print_as_triton_reads_them():
    pid = lanes.program(0)
    assert str(lanes.block_lanes(pid, "XBLOCK")) == \
        "tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)"
    assert str(lanes.program(0, wide=True)) == "tl.program_id(0).to(tl.int64)"
    assert str(lanes.column(lanes.block_lanes(pid, "FBLOCK"))) == \
        "(tl.program_id(0) * FBLOCK + tl.arange(0, FBLOCK))[:, None]"
    # a sum as the block number is parenthesised where it is multiplied
    block = lanes.plus(lanes.program(0, wide=True), lanes.times("it", 4))
    assert str(lanes.column(lanes.block_lanes(block, "XBLOCK"))) == \
        "((tl.program_id(0).to(tl.int64) + it * 4) * XBLOCK + tl.arange(0, XBLOCK))[:, None]"
    assert str(lanes.plus("roff", lanes.row(lanes.arange("RBLOCK")))) == \
        "roff + tl.arange(0, RBLOCK)[None, :]"
    assert str(lanes.to_int64("ks1")) == "tl.cast(ks1, tl.int64)"
    # a size expression (a node of indexing) is parenthesised as an operand of a product
    size = expr.Op("{0} + 1", expr.SUM, (expr.Name("ks0"),))
    assert str(lanes.times(lanes.program(1), size)) == "tl.program_id(1) * (ks0 + 1)"


def test_a_statement_over_coordinates_scans_as_its_text_does():
    """The scan of a statement over coordinate nodes finds what lexing their text finds
    (the tree's names, the template's own words and calls): moving the f-strings to trees
    changed no statement's facts."""
    value = lanes.column(lanes.block_lanes(lanes.plus(lanes.program(0), lanes.times("it", 8)),
                                           "XBLOCK"))
    for e in (value, lanes.plus("roff", lanes.row(lanes.arange("RBLOCK"))),
              lanes.to_int64("ks0"), lanes.program(1, wide=True)):
        assert stmt.scan(e) == stmt.lexed(str(e))
    assert {"it", "XBLOCK"} <= stmt.Assign("xindex", value).names
    assert "program_id" in stmt.scan(value).calls


def test_an_operand_is_a_node_a_name_or_an_int_never_text():
    with pytest.raises(ValueError, match="not a name"):
        lanes.arange("XBLOCK - 1")
    assert lanes.node(16) == expr.Literal("16", 16)


@given(st.integers(0, 2), st.booleans(), st.sampled_from(["XBLOCK", "RBLOCK", 128]))
def test_block_lanes_evaluate_as_python_does(axis, wide, size):
    """The printed coordinates evaluate (with stand-ins for Triton's functions) to the lanes
    a program has: block * size + 0 .. size - 1, as the f-strings they replaced."""
    blocks = {"XBLOCK": 64, "RBLOCK": 32}
    n = blocks.get(size, size)

    class Pid(int):
        def to(self, _):
            return self

    env = {"tl": type("tl", (), {"program_id": staticmethod(lambda a: Pid(a + 3)),
                                 "arange": staticmethod(lambda lo, hi: list(range(lo, hi))),
                                 "int64": None}),
           **blocks}
    text = str(lanes.times(lanes.program(axis, wide), size))
    assert eval(text, env) == (axis + 3) * n
    assert eval(str(lanes.arange(size)), env) == list(range(n))


def test_blocks_masks_and_calls_print_as_triton_reads_them():
    acc = lanes.full(["XBLOCK", "RBLOCK"], lanes.constant('float("-inf")'), "tl.float32")
    assert str(acc) == 'tl.full([XBLOCK, RBLOCK], float("-inf"), tl.float32)'
    assert str(lanes.full([1, "FBLOCK"], 0, "tl.int32")) == "tl.full([1, FBLOCK], 0, tl.int32)"
    masked = lanes.where(lanes.both("xmask", "rmask"), "x", lanes.constant("0.0"))
    assert str(masked) == "tl.where(xmask & rmask, x, 0.0)"
    assert str(lanes.plus("rindex", lanes.full(["XBLOCK", "RBLOCK"], 0, "tl.int32"))) == \
        "rindex + tl.full([XBLOCK, RBLOCK], 0, tl.int32)"
    running = lanes.times("osum", lanes.where(lanes.equal("omax", "onew"), lanes.constant("1.0"),
                                              lanes.call("tl.exp", lanes.minus("omax", "onew"))))
    assert str(running) == "osum * tl.where(omax == onew, 1.0, tl.exp(omax - onew))"
    assert str(lanes.over("d", lanes.plus("n", 1))) == "d / (n + 1)"
    assert str(lanes.minus("a", lanes.minus("b", "c"))) == "a - (b - c)"
    assert {"omax", "onew", "osum"} <= stmt.Assign("osum", running).names
    assert str(lanes.reduce_tuple(("m", "idx"), 1, "_argmax_combine")) == \
        "tl.reduce((m, idx), 1, _argmax_combine, keep_dims=True)"
    with pytest.raises(ValueError, match="not a function name"):
        lanes.call("tl.exp(x) + f", "y")


@st.composite
def _trees(draw, depth=3):
    """A random tree of the arithmetic nodes over small ints, and its value."""
    if depth == 0 or draw(st.booleans()):
        n = draw(st.integers(-4, 9))
        return lanes.node(n) if n >= 0 else lanes.constant(f"({n})"), n
    kind = draw(st.sampled_from(["plus", "minus", "times", "over", "where"]))
    (a, x), (b, y) = draw(_trees(depth - 1)), draw(_trees(depth - 1))
    if kind == "over" and y == 0:
        return a, x
    if kind == "where":
        (c, z), _ = draw(_trees(depth - 1)), None
        return lanes.where(lanes.equal(c, a), b, a), (y if z == x else x)
    values = {"plus": x + y, "minus": x - y, "times": x * y, "over": x / y if y else 0}
    return getattr(lanes, kind)(a, b), values[kind]


@given(_trees())
def test_arithmetic_nodes_are_parenthesised_as_python_evaluates_them(tree):
    """Printed, a tree evaluates (Python's precedence is Triton's) to the value its
    structure gives: no operand loses the parentheses it needs."""
    node, value = tree

    class Tl:
        @staticmethod
        def where(c, a, b):
            return a if c else b
    got = eval(str(node), {"tl": Tl})  # noqa: S307 (the test's own trees)
    assert got == pytest.approx(value)
