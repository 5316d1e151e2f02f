"""Size arguments that hold whole expressions (torchloom.codegen.wholes, through
IndexMath.size): dims and strides printed from them must compute, at every size, what the
expression they stand for computes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torchloom.api import symbols
from torchloom.codegen.indexing import C, TRITON, IndexMath, Unsupported, prod

from test_codegen_indexing import C_EVAL, _eval


def test_a_whole_expression_may_be_a_size_argument():
    """A flattened batch ``s0*s1`` whose factors have no argument of their own is one
    argument, used wherever the whole product occurs; a lone factor has no value."""
    ix = IndexMath(C, {"s0*s1": "S_0", "s2": "S_1"})
    assert ix.size("s0*s1") == "S_0"
    assert ix.size(prod(["s0*s1", 48])) == "48 * S_0"
    assert str(ix.linear(("a", "b"), ("s0*s1", "s2"))) == "a * S_1 + b"
    with pytest.raises(Unsupported, match="s0 has no value"):
        ix.size("s0")
    assert IndexMath(C).size("s0") == "s0"  # no names given: symbols print as themselves


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([("s0 + 1", "16*s0 + 16"), ("(s0//20) - 1", "Max(1, (s0//20))"),
                        ("(s0//20) - 1", "64*Max(1, (s0//20))"), ("1 + s0", "s0*s1"),
                        ("s0 - 3", "2*s0")]),
       st.integers(4, 200), st.integers(1, 9))
def test_a_part_of_a_whole_expression_is_its_argument_plus_a_constant(case, s0, s1):
    """A dim ``s0 + 1`` is an argument; a stride naming ``s0`` alone (a cache grown by one
    token, a slice's stride over its unsliced length) is that argument minus 1."""
    whole, stride = case
    ix = IndexMath(TRITON, {whole: "S_0", "s1": "S_1"})
    argument = symbols.evaluate(whole, {"s0": s0})
    assert _eval(ix.size(stride), TRITON, {"S_0": argument, "S_1": s1}) == \
        symbols.evaluate(stride, {"s0": s0, "s1": s1})
    with pytest.raises(Unsupported, match="has no value"):
        IndexMath(C, {"s0//2": "S_0"}).size("s0")  # a floor division: no constant offset
    assert IndexMath(C, {"2*s0": "S_0"}).size("s0") == "S_0 / 2"  # (an exact division)


_SEGFORMER = "((((s0-1)//4))+1)*((((s1-1)//4))+1)"  # a strided conv's output, flattened


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([f"16*{_SEGFORMER}", f"{_SEGFORMER}*16", "3*s2*(s0*s1)",
                        "(s1*s0)*(s2 // 3)*s2", f"2*{_SEGFORMER}*(s2 + 1)"]),
       st.sampled_from([C, TRITON]), st.integers(1, 300), st.integers(1, 300),
       st.integers(1, 50))
def test_a_product_holding_a_whole_expression_is_its_argument_times_the_rest(
        stride, language, s0, s1, s2):
    """SegFormer's layer_norm over a flattened strided-conv output at dynamic shapes: the
    input's stride ``16*A*B`` holds the argument ``A*B`` (its dim): it prints as 16 times
    the argument (was "size symbol s0 has no value in the kernel")."""
    names = {_SEGFORMER: "S_0", "s2": "S_1"} if "s0-1" in stride else \
        {"s0*s1": "S_0", "s2": "S_1"}
    whole = next(k for k in names if not k.isidentifier())
    ix = IndexMath(language, names)
    point = {"s0": s0, "s1": s1, "s2": s2}
    got = _eval(ix.size(stride), language, {"S_0": symbols.evaluate(whole, point), "S_1": s2})
    assert got == symbols.evaluate(stride, point)
    assert "s0" not in ix.size(stride)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([("s0 - s1", "48*s0 - 48*s1"), ("s0 - s1", "16*Max(1, s0 - s1)"),
                        ("s0 - s1", "3 - s0 + s1"), ("s0 + 2*s1", "4*s1 + 2*s0 + 6"),
                        ("s0*s1 - 1", "8*s1*s0 - 8"), ("2*s0", "s0"), ("4*s0 + 2", "6*s0 + 3"),
                        ("2*s0*s1", "s1*s0*3")]),
       st.sampled_from([C_EVAL, TRITON]), st.integers(0, 300), st.integers(0, 300))
def test_a_polynomial_affine_in_a_whole_expression_is_printed_from_it(case, language, s0,
                                                                     s1):
    """Falcon's cache at dynamic lengths: a dim ``s0 - s1`` (positions after the past
    tokens) is an argument, its tensor's stride ``48*s0 - 48*s1`` is 48 times it (was "size
    symbol s0 has no value in the kernel"); DeBERTa-v2's heads ``2*s0`` split in two: ``s0``
    is the argument halved (an exact division)."""
    whole, dim = case
    ix = IndexMath(language, {whole: "S_0"})
    point = {"s0": s0, "s1": s1}
    printed = ix.size(dim)
    assert "s0" not in printed and "s1" not in printed
    assert _eval(printed, language, {"S_0": symbols.evaluate(whole, point)}) == \
        symbols.evaluate(dim, point)


@pytest.mark.parametrize("whole, dim", [
    ("s0 - s1", "s0*s0 - s1*s1"),  # a polynomial, not affine in it
    ("s0 - s1", "2*s0 - s1"),  # not a function of it
    ("s0 - s1", "s0 - s1 + s2"),  # a symbol it does not hold
    ("(s0//20) - 1", "2*(s0//20)*2 + s0"),  # floor division: equal at large sizes only
])
def test_what_is_not_affine_in_a_whole_expression_has_no_value(whole, dim):
    with pytest.raises(Unsupported, match="has no value"):
        IndexMath(C, {whole: "S_0"}).size(dim)


_CEIL = "CeilToInt(IntTrueDiv((((s1-1)//8))+1,2))*CeilToInt(IntTrueDiv((((s2-1)//8))+1,2))"
_PATCHES = ("s0*((((((s1-1)//8))+1)//(CeilToInt(IntTrueDiv((((s1-1)//8))+1,2)))))"
            "*((((((s2-1)//8))+1)//(CeilToInt(IntTrueDiv((((s2-1)//8))+1,2)))))")


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([f"({_PATCHES})*({_CEIL})", f"(2*({_PATCHES})*({_CEIL}))*({_CEIL})",
                        f"(2*({_PATCHES})*({_CEIL}))*CeilDiv({_CEIL}, 4096)",
                        f"({_CEIL})*({_CEIL})*3"]),
       st.sampled_from([C_EVAL, TRITON]), st.integers(1, 5), st.integers(1, 300),
       st.integers(1, 300))
def test_a_product_of_several_whole_expressions_is_their_arguments_product(
        stride, language, s0, s1, s2):
    """MobileViT's attention over patches at dynamic image sizes: ``s1``, the width, is no
    dim of any input; the dims are the patch count and the patch grid, and a contiguous
    stride is their product (the grid twice): each whole is its argument (was "size symbol
    s1 has no value in the kernel")."""
    ix = IndexMath(language, {_PATCHES: "P", _CEIL: "G", "s0": "S_0"})
    printed = ix.size(stride)
    assert "s1" not in printed and "s2" not in printed
    point = {"s0": s0, "s1": s1, "s2": s2}
    env = {"P": symbols.evaluate(_PATCHES, point), "G": symbols.evaluate(_CEIL, point),
           "S_0": s0}
    assert _eval(printed, language, env) == symbols.evaluate(stride, point)


def test_a_product_without_all_of_a_whole_expression_has_no_value():
    ix = IndexMath(C, {"s0*s1*s2": "S_0"})
    with pytest.raises(Unsupported, match="has no value"):
        ix.size("4*s0*s1")
    with pytest.raises(Unsupported, match="has no value"):
        IndexMath(C, {"s0*s0": "S_0"}).size("s0*s1")


@pytest.mark.parametrize("order", [0, 1])
@settings(max_examples=20, deadline=None)
@given(st.integers(1, 300), st.integers(1, 300), st.integers(1, 300))
def test_wholes_that_share_a_factor_are_taken_so_the_rest_has_values(order, s0, s1, s2):
    """``s0*s1*s2`` of the arguments ``s0*s1``, ``s1*s2`` and ``s0``: taking ``s0*s1``
    first leaves ``s2``, which has no value; ``s1*s2`` first leaves ``s0``, which has. The
    wholes' order (the kernel's argument order) does not decide."""
    names = [("s0*s1", "X"), ("s1*s2", "Y")]
    ix = IndexMath(C_EVAL, {**dict(names[::-1] if order else names), "s0": "S_0"})
    printed = ix.size("s0*s1*s2")
    assert _eval(printed, C_EVAL, {"X": s0 * s1, "Y": s1 * s2, "S_0": s0}) == s0 * s1 * s2
