"""``fusion.decompose`` at symbolic sizes: composites whose decomposition holds at every
size are split into primitives over the same symbols (traced on a fresh shape
environment, no guard recorded), and the result matches the composite at several concrete
sizes; a composite whose sizes it cannot keep symbolic stays whole, with a note."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusion_testing import fusion_pipeline, groups, plugin_registry, run_graph, run_passes
from torchloom.api import PassContext, TensorType, clone_graph, parse_graph
from torchloom_fusion.decompose import DECOMPOSED_OPS, Decompose

CASES = {
    "softmax": """graph @g(%x: f32[N, 3, S]) {
      %y = aten._softmax.default(%x) {dim = -1, half_to_float = false} : f32[N, 3, S]
      return %y
    }""",
    "log_softmax": """graph @g(%x: f32[N, S]) {
      %y = aten._log_softmax.default(%x) {dim = 1, half_to_float = false} : f32[N, S]
      return %y
    }""",
    "softmax_backward": """graph @g(%g: f32[N, S], %y: f32[N, S]) {
      %d = aten._softmax_backward_data.default(%g, %y) {dim = -1, input_dtype = #f32} : f32[N, S]
      return %d
    }""",
    "layer_norm": """graph @g(%x: f32[N, S, 16], %w: f32[16], %b: f32[16]) {
      %y, %m, %r = aten.native_layer_norm.default(%x, %w, %b) {normalized_shape = [16], eps = 1e-05} : f32[N, S, 16], f32[N, S, 1], f32[N, S, 1]
      return %y, %m, %r
    }""",
    # rotary embeddings' rotate_half at a symbolic length: ints along the dim (a cat that
    # only a pointwise op reads is decomposed)
    "cat": """graph @g(%a: f32[N, S, 3], %b: f32[N, S, 5]) {
      %y = aten.cat.default(%a, %b) {dim = -1, tensors = [$0, $1]} : f32[N, S, 8]
      %z = aten.mul.Tensor(%y, %y) : f32[N, S, 8]
      return %z
    }""",
}

#: (N, S) each decomposition runs at
SIZES = [(2, 5), (1, 7), (4, 1), (3, 33), (0, 4)]


def _inputs(graph, sizes: dict, seed: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn([sizes.get(d, d) for d in v.type.shape], generator=gen)
            for v in graph.inputs]


@pytest.mark.parametrize("case", sorted(CASES))
def test_symbolic_composite_becomes_primitives_over_the_same_symbols(case):
    registry = plugin_registry()
    original = parse_graph(CASES[case])
    decomposed = clone_graph(original)[0]
    stats = run_passes(decomposed, [Decompose()], registry)
    assert stats["fusion.decompose.decomposed"] == 1
    composite = CASES[case].split("= ")[1].split("(")[0]
    ops = [n.op for n in decomposed.nodes]
    assert composite not in ops and len(ops) >= 3
    symbols = {d for v in original.inputs for d in v.type.shape if isinstance(d, str)}
    for n in decomposed.nodes:  # every size is an int or one of the graph's own symbols
        for v in n.outputs:
            if isinstance(v.type, TensorType):
                assert v.type.device == "cpu"
                assert all(isinstance(d, int) or d in symbols for d in v.type.shape), n
    for seed, (rows, length) in enumerate(SIZES):
        inputs = _inputs(original, {"N": rows, "S": length}, seed)
        for got, want in zip(run_graph(decomposed, registry, inputs),
                             run_graph(original, registry, inputs)):
            torch.testing.assert_close(got, want)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(sorted(CASES)), st.lists(st.tuples(st.integers(0, 9),
                                                          st.integers(1, 70)),
                                                min_size=2, max_size=4))
def test_fused_symbolic_decompositions_match_the_composite_at_many_sizes(case, sizes):
    """Decomposed and fused into one group at symbolic sizes, then run at random sizes."""
    registry = plugin_registry()
    original = parse_graph(CASES[case])
    fused = clone_graph(original)[0]
    run_passes(fused, fusion_pipeline(), registry)
    assert len(groups(fused)) == 1
    for seed, (rows, length) in enumerate(sizes):
        inputs = _inputs(original, {"N": rows, "S": length}, seed)
        for got, want in zip(run_graph(fused, registry, inputs),
                             run_graph(original, registry, inputs)):
            torch.testing.assert_close(got, want)


def test_size_expressions_keep_the_composite_with_a_note():
    text = """graph @g(%x: f32[N, "2*S"]) {
      %y = aten._softmax.default(%x) {dim = -1, half_to_float = false} : f32[N, "2*S"]
      return %y
    }"""
    graph = parse_graph(text)
    ctx = PassContext(registry=plugin_registry())
    result = Decompose().run(graph, ctx)
    assert not result.changed
    assert [n.op for n in graph.nodes] == ["aten._softmax.default"]
    assert any("symbolic sizes" in note for note in ctx.notes)


def _cats(graph) -> int:
    return sum(n.op == "aten.cat.default" for g in (graph, *graph.root.subgraphs.values())
               for n in g.walk())


@pytest.mark.slow
def test_transformer_block_at_symbolic_sizes_has_no_composite_and_no_more_groups():
    """The example transformer block, forward and backward, under explain: with
    dynamic=True every composite (layer norms, softmax and their gradients) is decomposed
    over the symbols and fused, so it needs no more fusion groups or kernels per call than
    the static graphs (fewer: the static ones share the layer norm as a subgraph, which
    cannot fuse with the residual add before it)."""
    from pathlib import Path

    from torchloom.report.explain import explain
    from torchloom.report import count_kernels, fusion_groups
    workload = Path(__file__).resolve().parents[2] / "examples" / "transformer_block.py"
    counts = {}
    for dynamic in (False, True):
        torch._dynamo.reset()
        result = explain(workload, dynamic=dynamic)
        comps = result.compiler.compilations
        assert len(comps) == 2 and all(c.fallback_reason is None for c in comps)
        registry = result.compiler.registry
        # a cat left at symbolic sizes (the static graphs compute theirs in the kernel
        # reading it) may cost the dynamic graph one group and one kernel more
        counts[dynamic] = [(len(fusion_groups(c.graph)) - _cats(c.graph),
                            count_kernels(c.graph, registry) - _cats(c.graph)) for c in comps]
        if dynamic:
            assert not any("fusion.decompose" in note for c in comps for note in c.notes)
            ops = {n.op for c in comps for g in (c.graph, *c.graph.root.subgraphs.values())
                   for n in g.walk()}
            # (not cat: the one here feeds the backward's GEMM and bias sum, a cat at
            # static sizes too)
            composites = set(DECOMPOSED_OPS) - {"aten.cat.default"}
            assert not ops & composites, ops & composites
    torch._dynamo.reset()
    for (groups_dyn, kernels_dyn), (groups_static, kernels_static) in zip(counts[True],
                                                                          counts[False]):
        assert groups_dyn <= groups_static and kernels_dyn <= kernels_static, counts
