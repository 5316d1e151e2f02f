"""Golden tests of ``dce`` (passes/builtin/dce.py): what it removes, and what it must keep
(graph outputs, in-place writes, random ops), with the graph's numbers unchanged."""

from __future__ import annotations

import torch

from torchloom.passes.builtin.dce import DeadCodeElimination

from torchloom.testing.golden import golden

X, Y = torch.randn(4, 8), torch.randn(4, 8)


def test_removes_dead_chains_and_keeps_outputs():
    result = golden(DeadCodeElimination(), """
        graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
          %a = aten.exp.default(%x) : f32[4, 8]
          %b = aten.neg.default(%a) : f32[4, 8]
          %c = aten.add.Tensor(%x, %y) : f32[4, 8]
          %s = aten.sum.dim_IntList(%c) {dim = [-1]} : f32[4]
          return %c, %s
        }
    """, """
        graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
          %c = aten.add.Tensor(%x, %y) : f32[4, 8]
          %s = aten.sum.dim_IntList(%c) {dim = [-1]} : f32[4]
          return %c, %s
        }
    """, [X, Y])
    assert result.stats == {"removed": 2}


def test_keeps_in_place_writes_and_random_ops_whose_results_are_unused():
    text = """
        graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
          %w = aten.add_.Tensor(%x, %y) : f32[4, 8]
          %r = aten.rand_like.default(%y) : f32[4, 8]
          %n = aten.rand_like.default(%y) : f32[4, 8]
          %e = aten.exp.default(%x) : f32[4, 8]
          return %e, %n
        }
    """
    # %r is unused but drawing it advances the generator: removing it would change %n
    result = golden(DeadCodeElimination(), text, text, [X, Y], seed=3)
    assert result.stats == {"removed": 0}


def test_sweeps_inside_fusion_group_regions():
    result = golden(DeadCodeElimination(), """
        graph @g(%x: f32[4, 8]) {
          %e = torchloom.fusion_group(%x) : f32[4, 8] region @group0(%a: f32[4, 8]) {
            %t = aten.tanh.default(%a) : f32[4, 8]
            %s = aten.sigmoid.default(%a) : f32[4, 8]
            %e = aten.exp.default(%s) : f32[4, 8]
            return %e
          }
          return %e
        }
    """, """
        graph @g(%x: f32[4, 8]) {
          %e = torchloom.fusion_group(%x) : f32[4, 8] region @group0(%a: f32[4, 8]) {
            %s = aten.sigmoid.default(%a) : f32[4, 8]
            %e = aten.exp.default(%s) : f32[4, 8]
            return %e
          }
          return %e
        }
    """, [X])
    assert result.stats == {"removed": 1}


def test_regions_false_leaves_regions_alone():
    text = """
        graph @g(%x: f32[4, 8]) {
          %e = torchloom.fusion_group(%x) : f32[4, 8] region @group0(%a: f32[4, 8]) {
            %t = aten.tanh.default(%a) : f32[4, 8]
            %e = aten.exp.default(%a) : f32[4, 8]
            return %e
          }
          return %e
        }
    """
    golden(DeadCodeElimination(regions=False), text, text, [X])
