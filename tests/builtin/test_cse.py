"""Golden tests of ``cse`` (passes/builtin/cse.py): identical pure nodes merge; random ops,
different attributes and readers of values written in place do not."""

from __future__ import annotations

import torch

from torchloom.passes.builtin.cse import CommonSubexpressionElimination as CSE

from torchloom.testing.golden import golden

X, Y = torch.randn(4, 8), torch.randn(4, 8)


def test_merges_identical_pure_nodes_transitively():
    result = golden(CSE(), """
        graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
          %a = aten.exp.default(%x) : f32[4, 8]
          %b = aten.exp.default(%x) : f32[4, 8]
          %c = aten.mul.Tensor(%a, %y) : f32[4, 8]
          %d = aten.mul.Tensor(%b, %y) : f32[4, 8]
          %s = aten.add.Tensor(%c, %d) : f32[4, 8]
          return %s, %d
        }
    """, """
        graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
          %a = aten.exp.default(%x) : f32[4, 8]
          %c = aten.mul.Tensor(%a, %y) : f32[4, 8]
          %s = aten.add.Tensor(%c, %c) : f32[4, 8]
          return %s, %c
        }
    """, [X, Y])
    assert result.stats == {"merged": 2}


def test_different_attributes_or_operand_order_do_not_merge():
    text = """
        graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
          %a = aten.sum.dim_IntList(%x) {dim = [0]} : f32[8]
          %b = aten.sum.dim_IntList(%x) {dim = [1]} : f32[4]
          %c = aten.sub.Tensor(%x, %y) : f32[4, 8]
          %d = aten.sub.Tensor(%y, %x) : f32[4, 8]
          return %a, %b, %c, %d
        }
    """
    golden(CSE(), text, text, [X, Y])


def test_random_ops_are_never_merged():
    text = """
        graph @g(%x: f32[4, 8]) {
          %a = aten.rand_like.default(%x) : f32[4, 8]
          %b = aten.rand_like.default(%x) : f32[4, 8]
          %s = aten.sub.Tensor(%a, %b) : f32[4, 8]
          return %s
        }
    """
    golden(CSE(), text, text, [X], seed=0)


def test_readers_of_a_value_written_in_place_are_not_merged():
    text = """
        graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
          %a = aten.exp.default(%x) : f32[4, 8]
          %w = aten.add_.Tensor(%x, %y) : f32[4, 8]
          %b = aten.exp.default(%x) : f32[4, 8]
          return %a, %b
        }
    """
    # %b reads %x after the write: merging it into %a would return the old values
    golden(CSE(), text, text, [X, Y])


def test_merges_inside_fusion_group_regions_only_when_asked():
    before = """
        graph @g(%x: f32[4, 8]) {
          %e = torchloom.fusion_group(%x) : f32[4, 8] region @group0(%a: f32[4, 8]) {
            %p = aten.exp.default(%a) : f32[4, 8]
            %q = aten.exp.default(%a) : f32[4, 8]
            %e = aten.add.Tensor(%p, %q) : f32[4, 8]
            return %e
          }
          return %e
        }
    """
    golden(CSE(), before, before.replace(
        "            %q = aten.exp.default(%a) : f32[4, 8]\n", "").replace("%p, %q", "%p, %p"),
        [X])
    golden(CSE(regions=False), before, before, [X])


def test_signed_zeros_and_equal_values_of_other_types_do_not_merge():
    """0.0 == -0.0 and 1 == 1.0 == True in Python, but ``x * -0.0`` is not ``x * 0.0`` and
    the scalar's type picks the result's dtype; the same NaN constant does merge."""
    text = """
        graph @g(%x: f32[4, 8]) {
          %a = aten.mul.Tensor(%x) {other = 0.0} : f32[4, 8]
          %b = aten.mul.Tensor(%x) {other = -0.0} : f32[4, 8]
          %c = aten.add.Tensor(%x) {other = 1} : f32[4, 8]
          %d = aten.add.Tensor(%x) {other = 1.0} : f32[4, 8]
          %e = aten.add.Tensor(%x) {other = true} : f32[4, 8]
          %f = aten.add.Tensor(%a, %b) : f32[4, 8]
          return %f, %c, %d, %e
        }
    """
    x = torch.tensor([[-1.0, 0.0, -0.0, 2.0] * 2] * 4)
    golden(CSE(), text, text, [x])
    result = golden(CSE(), """
        graph @g(%x: f32[4, 8]) {
          %a = aten.mul.Tensor(%x) {other = nan} : f32[4, 8]
          %b = aten.mul.Tensor(%x) {other = nan} : f32[4, 8]
          %c = aten.add.Tensor(%a, %b) : f32[4, 8]
          return %c
        }
    """, """
        graph @g(%x: f32[4, 8]) {
          %a = aten.mul.Tensor(%x) {other = nan} : f32[4, 8]
          %c = aten.add.Tensor(%a, %a) : f32[4, 8]
          return %c
        }
    """, [x])
    assert result.stats == {"merged": 1}


def test_signed_zero_constants_through_torch_compile_give_eagers_signs():
    def f(x):
        return x * 0.0 + torch.exp(x * -0.0), (x * -0.0) * 3, x * 0.0

    torch._dynamo.reset()
    try:
        x = torch.tensor([-1.0, 0.0, -0.0, 2.0, float("inf"), float("nan")])
        got = torch.compile(f, backend="torchloom")(x)
        for g, w in zip(got, f(x)):
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
            number = ~torch.isnan(w)  # a NaN's sign bit is the hardware's, not the op's
            assert torch.equal(torch.signbit(g)[number], torch.signbit(w)[number]), (g, w)
    finally:
        torch._dynamo.reset()
