"""Golden tests of ``canonicalize`` (passes/builtin/canonicalize.py): identity views and
casts fold into their input, except graph outputs, values written in place, and casts
that do more than change dtype."""

from __future__ import annotations

import textwrap

import torch
from torchloom.ir import parse_graph
from torchloom.ops.aten import default_registry
from torchloom.passes.base import PassContext
from torchloom.runtime.executor import build_function

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



def test_keeps_copies_and_views_of_unknown_sizes():
    """Dims of unknown size (``?``: Dynamo's ``math.ceil`` of a size, as MobileViT's
    unfolding computes it) make two types print alike without being alike: the clone
    below makes the transposed tensor contiguous, and folding it failed the view after it
    at run time (found by the model survey, session 37). The graph is Dynamo's (its size
    arithmetic made inputs)."""
    text = textwrap.dedent("""
        graph @g(%n: int, %k: int, %x: f32[s0, 3]) {
          %v = aten.view.default(%x, %n, %n) {size = [$1, $2, 2]} : f32[?, ?, ?] strided[?, ?, 1]
          %t = aten.transpose.int(%v) {dim0 = 0, dim1 = 1} : f32[?, ?, ?] strided[?, ?, 1]
          %c = aten.clone.default(%t) {memory_format = #contiguous_format} : f32[?, ?, ?] strided[?, ?, 1]
          %f = aten._unsafe_view.default(%c, %k) {size = [$1]} : f32[?] strided[1]
          %e = aten.mul.Tensor(%f) {other = 2} : f32[?] strided[1]
          return %e
        }
    """).lstrip()
    graph = parse_graph(text)
    registry = default_registry()
    result = Canonicalize().run(graph, PassContext(registry=registry))
    assert not result.changed and str(graph) == text
    x = torch.randn(6, 3)
    (got,) = build_function(graph, registry).fn(3, 18, x)
    torch.testing.assert_close(got, x.view(3, 3, 2).transpose(0, 1).reshape(18) * 2)
