"""torchloom.api.expr: a kernel's expressions as nodes. Whether an expression is a literal,
needs parentheses or may be used without binding it to a name is asked of the node the
writer built (the cpu, triton and scalar_c codegens' sources are byte-identical to what
the regexes over their text gave; their tests run them end to end)."""

from __future__ import annotations

import operator

import hypothesis
import hypothesis.strategies as st
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
    x = expr.Name("x")
    assert expr.fill("{self}", {"self": x}) is x  # an identity op is its operand
    assert expr.fill("{self}", {"self": "t + 1"}) == expr.Op("t + 1")
    assert expr.fill("1", {"self": x}) == expr.Literal("1")  # no operand: a constant
    with pytest.raises(KeyError):
        expr.fill("{self} + {other}", {"self": x})


def test_fill_builds_an_op_over_its_operands():
    x, two = expr.Name("x"), expr.Literal("2", 2)
    product = expr.fill("{self} * {other}", {"self": x, "other": two})
    assert product == expr.Op("{0} * {1}", expr.LOWEST, (x, two))
    assert product.operands == (x, two) and product.text == "x * 2"
    assert product != expr.Op("x * 2")  # the same text, opaque: another tree
    # an operand named twice is one operand; braces of the template stay text
    clamp = expr.fill("{min} != {min} ? {{0}} : {self}", {"self": x, "min": "m + 1"})
    assert clamp.operands == (expr.Op("m + 1"), x)
    assert clamp.text == "m + 1 != m + 1 ? {0} : x"


def test_an_op_prints_its_template_over_its_operands_text():
    x = expr.Name("x")
    inner = expr.Op("{0} + 1", expr.SUM, (x,))
    outer = expr.Op("f({0}) * {1}", expr.PRODUCT, (inner, expr.paren(inner, expr.PRODUCT)))
    assert str(outer) == f"{outer}" == "f(x + 1) * (x + 1)"
    assert expr.paren(inner, expr.SUM) is inner
    assert expr.Op("{0} + 1", expr.SUM, ("y",)).operands == (expr.Op("y"),)  # text: opaque
    assert repr(inner) == "Op('{0} + 1', 1, (Name('x'),))" and repr(expr.Op("a")) == "Op('a')"
    with pytest.raises(TypeError):
        expr.Op("{0}", expr.LOWEST, (3,))  # an operand is a node or text


def test_walk_names_and_substitute_follow_the_tree():
    x, y, n = expr.Name("x"), expr.Name("y"), expr.Literal("((double)ks0)")
    e = expr.Op("max({0}, {1}) / {2}", expr.PRODUCT, (x, expr.Op("y1 + r0"), n))
    assert list(expr.walk(e)) == [e, x, expr.Op("y1 + r0"), n]
    # names: the Name nodes and opaque text's identifiers; not the template's function
    # names, nor a literal's text
    assert expr.names(e) == {"x", "y1", "r0"} and expr.names("tl.exp(a)") == {"tl", "exp", "a"}
    swapped = expr.substitute(e, {"x": y})
    assert swapped.text == "max(y, y1 + r0) / ((double)ks0)" and swapped.operands[0] is y
    assert expr.substitute(e, {"z": y}) is e  # nothing to replace: the same node
    assert expr.substitute(x, {"x": n}) is n


def test_a_load_is_an_element_of_a_tensor_at_an_offset_tree():
    offset = expr.Op("{0} * {1}", expr.PRODUCT, (expr.Name("x"), expr.Literal("16", 16)))
    load = expr.Load("in_a", offset)
    assert load.text == "in_a[x * 16]" and load.precedence == expr.POSTFIX
    assert not load.trivial and expr.par(load) == "(in_a[x * 16])"
    assert expr.par(load, expr.POSTFIX) == "in_a[x * 16]"
    assert list(expr.walk(load)) == [load, offset, expr.Name("x"), expr.Literal("16", 16)]
    assert expr.names(load) == {"in_a", "x"}  # the array it reads is a name too
    moved = expr.substitute(load, {"x": expr.Name("row")})
    assert moved == expr.Load("in_a", expr.Op("{0} * {1}", expr.PRODUCT, (
        expr.Name("row"), expr.Literal("16", 16)))) and moved.text == "in_a[row * 16]"
    assert expr.substitute(load, {"r": expr.Name("j")}) is load
    assert expr.code(load) is load and expr.Load("b", "r / 4").offset == expr.Op("r / 4")


def test_index_math_sizes_are_nodes_with_their_precedence():
    ix = indexing.IndexMath(indexing.C, {"s0": "ks0", "s1": "ks1"})
    assert ix.size_code(8) == expr.Literal("8", 8)
    assert ix.size_code("s0") == expr.Name("ks0")
    product = ix.size_code("2*s0")
    assert product.precedence == expr.PRODUCT and ix.size("2*s0") == product.text
    assert expr.par(ix.size_code("s0 + s1")) == "(ks0 + ks1)"
    # C's conditional is one parenthesised whole (an atom); Triton's is a call
    assert ix.size_code("Max(s0, s1)").precedence == expr.ATOM
    assert indexing.IndexMath(indexing.TRITON, {"s0": "ks0", "s1": "ks1"}).size_code(
        "Max(s0, s1)").precedence == expr.POSTFIX


# ---- random integer-arithmetic trees print with the parentheses their precedence asks ----

_OPERATORS = {"+": (expr.SUM, operator.add), "-": (expr.SUM, operator.sub),
              "*": (expr.PRODUCT, operator.mul)}


def _leaf(draw):
    if draw(st.booleans()):
        name = draw(st.sampled_from(sorted(_ENV)))
        return expr.Name(name), _ENV[name]
    n = draw(st.integers(0, 9))
    return expr.Literal(str(n), n), n


@st.composite
def _trees(draw, depth=4):
    """(a tree of names, literals, +, -, * and negation; its value over _ENV)."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return _leaf(draw)
    if draw(st.integers(0, 4)) == 0:  # negation binds as an operand of nothing
        e, v = draw(_trees(depth - 1))
        return expr.Op("-{0}", expr.LOWEST, (expr.paren(e, expr.POSTFIX),)), -v
    symbol = draw(st.sampled_from(sorted(_OPERATORS)))
    level, apply = _OPERATORS[symbol]
    (a, x), (b, y) = draw(_trees(depth - 1)), draw(_trees(depth - 1))
    # left-associative: the right operand must bind tighter than the operator
    e = expr.Op(f"{{0}} {symbol} {{1}}", level,
                (expr.paren(a, level), expr.paren(b, level + 1)))
    return e, apply(x, y)


_ENV = {"a": 3, "b": -7, "c": 11}


@hypothesis.given(_trees())
@hypothesis.settings(max_examples=300, deadline=None)
def test_random_trees_print_with_correct_parentheses(tree):
    e, value = tree
    assert eval(str(e), {}, dict(_ENV)) == value  # noqa: S307 (our own arithmetic)
    assert expr.names(e) == {n.text for n in expr.walk(e) if isinstance(n, expr.Name)}
    # substituting each name by its value as a literal keeps the value, without _ENV
    literals = {k: expr.Literal(f"({v})", v) for k, v in _ENV.items()}
    assert eval(str(expr.substitute(e, literals)), {}, {}) == value  # noqa: S307


def test_arithmetic_builders_parenthesise_by_precedence_only_where_needed():
    # staging.py's block bounds, as its C has always read
    end = expr.times(expr.plus(expr.over("xs", 4), 1), 512)
    assert str(end) == "(xs / 4 + 1) * 512"
    assert str(expr.plus(expr.times(expr.over("xs", 4), 512),
                         expr.times(expr.modulo("xs", 4), 16))) == "xs / 4 * 512 + xs % 4 * 16"
    assert str(expr.minus("a", expr.minus("b", "c"))) == "a - (b - c)"
    assert str(expr.over("a", expr.times("b", "c"))) == "a / (b * c)"
    assert expr.names(end) == {"xs"}
    # operands: ints and digits are literals, identifiers names, other text opaque
    assert expr.as_node(3) == expr.Literal("3", 3) and expr.as_node("7") == expr.Literal("7", 7)
    assert expr.as_node("n_xb") == expr.Name("n_xb") and expr.as_node("a + b").opaque
    with pytest.raises(TypeError):
        expr.as_node(True)


_BUILDERS = {"+": (expr.plus, operator.add), "-": (expr.minus, operator.sub),
             "*": (expr.times, operator.mul), "/": (expr.over, operator.floordiv),
             "%": (expr.modulo, operator.mod)}


def _arithmetic_trees(depth: int):
    leaf = st.integers(min_value=1, max_value=9).map(lambda n: (expr.as_node(n), n))
    if depth == 0:
        return leaf

    def combine(parts):
        symbol, (a, va), (b, vb) = parts
        build, op = _BUILDERS[symbol]
        if symbol in "/%" and vb == 0:
            return a, va
        return build(a, b), op(va, vb)
    return st.one_of(leaf, st.tuples(st.sampled_from(sorted(_BUILDERS)), _arithmetic_trees(depth - 1),
                                     _arithmetic_trees(depth - 1)).map(combine))


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(_arithmetic_trees(4))
def test_a_tree_of_builders_prints_text_that_computes_its_value(tree):
    """Random trees of ``+ - * / %`` over small positive ints: the printed text, read
    with ``/`` as integer division (Python's floor division on both sides: a ``-`` can
    make an operand negative), computes what the tree computes: parentheses are never
    missing where precedence or left associativity needs them."""
    node, value = tree
    assert eval(str(node).replace("/", "//")) == value  # noqa: S307 (digits and operators)
