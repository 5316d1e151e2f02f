"""torchloom.api.expr: a kernel's expressions as nodes. Whether an expression is a literal,
needs parentheses or may be used without binding it to a name is asked of the node the
writer built (the cpu, triton and scalar_c codegens' sources are byte-identical to what
the regexes over their text gave; their tests run them end to end)."""

from __future__ import annotations

import pytest
from torchloom.api import expr, indexing


def test_names_and_literals_are_trivial_ops_are_not():
    x, half = expr.Name("x"), expr.Literal("0.5f", 0.5)
    assert x.trivial and half.trivial and not expr.Op("x * 2", expr.PRODUCT).trivial
    assert expr.is_literal(half) and not expr.is_literal(x)
    # a string is an expression of unknown shape: never a literal, always parenthesised
    assert not expr.is_literal("1") and expr.par("1") == "(1)"
    assert expr.code("a + b") == expr.Op("a + b", expr.LOWEST)
    # a literal is one whatever its spelling: a negative number, a C cast, an infinity
    for text in ("-1.5", "((float)0.5)", "(-(double)INFINITY)", 'float("-inf")', "True"):
        assert expr.par(expr.Literal(text)) == text


def test_par_follows_precedence():
    product = expr.Op("a * b", expr.PRODUCT)
    call = expr.Op("max(a, b)", expr.POSTFIX)
    assert expr.par(product) == "(a * b)"  # as an operand of anything
    assert expr.par(product, expr.SUM) == "a * b" and expr.par(product, expr.PRODUCT) == "a * b"
    assert expr.par(expr.Op("a + b", expr.SUM), expr.PRODUCT) == "(a + b)"
    assert expr.par(call, expr.POSTFIX) == "max(a, b)" and expr.par(call) == "(max(a, b))"
    assert f"{product} + 1" == "a * b + 1" and str(expr.Name("r")) == "r"


def test_wrapped_keeps_trivial_nodes_and_parenthesises_the_rest():
    assert expr.wrapped(expr.Name("x")) == expr.Name("x")
    w = expr.wrapped(expr.Op("(double)x"))
    assert w.text == "((double)x)" and not w.trivial and expr.par(w) == "((double)x)"


def test_fill_keeps_the_node_of_a_one_operand_template():
    x, two = expr.Name("x"), expr.Literal("2", 2)
    assert expr.fill("{self}", {"self": x}) is x  # an identity op is its operand
    assert expr.fill("{self}", {"self": "t + 1"}) == expr.Op("t + 1")
    assert expr.fill("{self} * {other}", {"self": x, "other": two}) == expr.Op("x * 2")
    assert expr.fill("1", {"self": x}) == expr.Literal("1")  # no operand: a constant
    with pytest.raises(KeyError):
        expr.fill("{self} + {other}", {"self": x})


def test_index_math_sizes_are_nodes_with_their_precedence():
    ix = indexing.IndexMath(indexing.C, {"s0": "ks0", "s1": "ks1"})
    assert ix.size_code(8) == expr.Literal("8", 8)
    assert ix.size_code("s0") == expr.Name("ks0")
    product = ix.size_code("2*s0")
    assert product.precedence == expr.PRODUCT and ix.size("2*s0") == product.text
    assert expr.par(ix.size_code("s0 + s1")) == "(ks0 + ks1)"
    assert ix.size_code("Max(s0, s1)").precedence == expr.POSTFIX
