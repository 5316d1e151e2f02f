"""Golden tests of ``canonicalize`` (passes/builtin/canonicalize.py): identity views and
casts fold into their input, except graph outputs, values written in place, and casts
that do more than change dtype."""

from __future__ import annotations

import torch

from torchloom.passes.builtin.canonicalize import Canonicalize

from torchloom.testing.golden import golden

X, Y = torch.randn(4, 8), torch.randn(4, 8)


def test_folds_identity_views_and_casts():
    result = golden(Canonicalize(), """
        graph @g(%x: f32[4, 8]) {
          %v = aten.view.default(%x) {size = [4, 8]} : f32[4, 8]
          %c = aten._to_copy.default(%v) {dtype = #f32} : f32[4, 8]
          %r = aten.reshape.default(%c) {shape = [4, 8]} : f32[4, 8]
          %e = aten.exp.default(%r) : f32[4, 8]
          return %e
        }
    """, """
        graph @g(%x: f32[4, 8]) {
          %e = aten.exp.default(%x) : f32[4, 8]
          return %e
        }
    """, [X])
    assert result.stats == {"folded": 3}


def test_keeps_real_views_casts_and_graph_outputs():
    text = """
        graph @g(%x: f32[4, 8]) {
          %v = aten.view.default(%x) {size = [8, 4]} : f32[8, 4]
          %h = aten._to_copy.default(%x) {dtype = #f16} : f16[4, 8]
          %k = aten.clone.default(%x) : f32[4, 8]
          return %v, %h, %k
        }
    """
    # %k is an identity clone, but it is a graph output: returning %x instead would
    # make the caller's output alias its input
    golden(Canonicalize(), text, text, [X])


def test_keeps_casts_with_more_than_a_dtype():
    text = """
        graph @g(%x: f32[4, 8]) {
          %c = aten._to_copy.default(%x) {dtype = #f32, memory_format = #contiguous_format} : f32[4, 8]
          %e = aten.exp.default(%c) : f32[4, 8]
          return %e
        }
    """
    golden(Canonicalize(), text, text, [X])


def test_keeps_copies_of_values_written_in_place():
    text = """
        graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
          %k = aten.clone.default(%x) : f32[4, 8]
          %w = aten.add_.Tensor(%x, %y) : f32[4, 8]
          %e = aten.exp.default(%k) : f32[4, 8]
          return %e
        }
    """
    # %k must keep the values from before the write; folding it would read the new %x
    golden(Canonicalize(), text, text, [X, Y])
