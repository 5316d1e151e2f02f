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



def test_folds_identity_views_of_symbolic_sizes():
    """A view or expand whose sizes are the graph's symbolic ints (inputs after the
    tensor) folds when its result's type is its input's; one that changes the shape stays
    (session 58: the backward of attention expanded and viewed the saved probabilities on
    every call, 4-8 us each)."""
    before = textwrap.dedent("""
        graph @g(%n: int[s0], %x: f32[2, 4, s0, s0]) {
          %e = aten.expand.default(%x, %n, %n) {size = [2, 4, $1, $2]} : f32[2, 4, s0, s0]
          %v = aten.view.default(%e, %n, %n) {size = [8, $1, $2]} : f32[8, s0, s0]
          %w = aten.view.default(%v, %n, %n) {size = [8, $1, $2]} : f32[8, s0, s0]
          %y = aten.exp.default(%w) : f32[8, s0, s0]
          return %y
        }
    """).lstrip()
    after = textwrap.dedent("""
        graph @g(%n: int[s0], %x: f32[2, 4, s0, s0]) {
          %v = aten.view.default(%x, %n, %n) {size = [8, $1, $2]} : f32[8, s0, s0]
          %y = aten.exp.default(%v) : f32[8, s0, s0]
          return %y
        }
    """).lstrip()
    graph, registry = parse_graph(before), default_registry()
    result = Canonicalize().run(graph, PassContext(registry=registry))
    assert str(graph) == after
    for n in (1, 3, 5):
        x = torch.randn(2, 4, n, n)
        (got,) = build_function(graph, registry).fn(n, x)
        (want,) = build_function(parse_graph(before), registry).fn(n, x)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert result.stats == {"folded": 2}


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


ATTEND = ("aten._scaled_dot_product_flash_attention_for_cpu.default(%q, %kc, %vc) "
          "{dropout_p = 0.0, is_causal = true} : f32[1, 4, 6, 8], f32[1, 4, 6]")


def _cache_update(*readers: str) -> str:
    """A key/value cache's first update (transformers' DynamicCache: ``cat([empty, k],
    -2)``) of keys and values with their heads transposed out, then ``readers``."""
    lines = [
        "graph @g(%q: f32[1, 4, 6, 8], %k: f32[1, 6, 4, 8], %v: f32[1, 6, 4, 8], %e: f32[0]) {",
        "  %kt = aten.transpose.int(%k) {dim0 = 1, dim1 = 2} : f32[1, 4, 6, 8] strided[192, 8, 32, 1]",
        "  %vt = aten.transpose.int(%v) {dim0 = 1, dim1 = 2} : f32[1, 4, 6, 8] strided[192, 8, 32, 1]",
        "  %kc = aten.cat.default(%e, %kt) {dim = -2, tensors = [$0, $1]} : f32[1, 4, 6, 8]",
        "  %vc = aten.cat.default(%e, %vt) {dim = -2, tensors = [$0, $1]} : f32[1, 4, 6, 8]",
        *(f"  {r}" for r in readers), "}"]
    return "\n".join(lines) + "\n"


def _cache_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 4, 6, 8, generator=g), torch.randn(1, 6, 4, 8, generator=g),
            torch.randn(1, 6, 4, 8, generator=g), torch.empty(0)]


def test_a_cache_s_first_concatenation_only_attention_reads_is_its_piece():
    before = _cache_update(f"%o, %l = {ATTEND}", "return %o")
    after = "\n".join(line for line in before.replace("%kc, %vc", "%kt, %vt").splitlines()
                      if "aten.cat" not in line) + "\n"
    assert golden(Canonicalize(), before, after, _cache_inputs()).stats == {"folded": 2}
    registry = default_registry()  # bit for bit: attention reads its key through strides
    for seed in range(3):
        inputs = _cache_inputs(seed)
        want = build_function(parse_graph(before), registry).fn(*inputs)
        got = build_function(parse_graph(after), registry).fn(*inputs)
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_keeps_a_concatenation_whose_layout_a_reader_sees():
    # exp's result is laid out like its input: the contiguous cat, not the transposed piece
    layout = _cache_update("%x = aten.exp.default(%kc) : f32[1, 4, 6, 8]",
                           f"%o, %l = {ATTEND}", "return %x, %o")
    kept = "\n".join(line for line in layout.replace("%kc, %vc", "%kc, %vt").splitlines()
                     if "%vc = " not in line) + "\n"  # (the values: attention's alone)
    assert golden(Canonicalize(), layout, kept, _cache_inputs()).stats == {"folded": 1}
    strided = _cache_update(f"%o, %l = {ATTEND}", "return %o").replace(
        "strided[192, 8, 32, 1]", "strided[192, 1, 32, 4]").replace(
        "%k: f32[1, 6, 4, 8]", "%k: f32[1, 6, 4, 8] strided[192, 4, 1, 24]").replace(
        "%v: f32[1, 6, 4, 8]", "%v: f32[1, 6, 4, 8] strided[192, 4, 1, 24]")
    # (a last dim read with a stride: eager's CPU attention gives values that vary then)
    assert not Canonicalize().run(parse_graph(strided),
                                  PassContext(registry=default_registry())).changed
    two = textwrap.dedent("""
        graph @g(%a: f32[2, 3], %b: f32[2, 5], %e: f32[0]) {
          %c = aten.cat.default(%a, %e, %b) {dim = 1, tensors = [$0, $1, $2]} : f32[2, 8]
          %x = aten.exp.default(%c) : f32[2, 8]
          return %x
        }
    """).lstrip()  # two pieces with elements
    golden(Canonicalize(), two, two, [torch.randn(2, 3), torch.randn(2, 5), torch.empty(0)])
    promoted = textwrap.dedent("""
        graph @g(%a: f32[2, 3], %e: f64[0]) {
          %c = aten.cat.default(%e, %a) {dim = 0, tensors = [$0, $1]} : f64[2, 3]
          %x = aten.exp.default(%c) : f64[2, 3]
          return %x
        }
    """).lstrip()  # the empty piece's dtype promotes the result
    golden(Canonicalize(), promoted, promoted, [torch.randn(2, 3), torch.empty(0).double()])


def test_folds_an_empty_piece_s_concatenation_of_the_same_type():
    result = golden(Canonicalize(), """
        graph @g(%a: f32[2, 3], %e: f32[2, 0]) {
          %c = aten.cat.default(%e, %a) {dim = 1, tensors = [$0, $1]} : f32[2, 3]
          %x = aten.exp.default(%c) : f32[2, 3]
          return %x
        }
    """, """
        graph @g(%a: f32[2, 3], %e: f32[2, 0]) {
          %x = aten.exp.default(%a) : f32[2, 3]
          return %x
        }
    """, [torch.randn(2, 3), torch.empty(2, 0)])
    assert result.stats == {"folded": 1}
