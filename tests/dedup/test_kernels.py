"""``dedup.kernels`` and kernel sharing: one ``generate`` per unique group."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchloom.api import (FUSION_GROUP, PassContext, parse_graph, print_graph, structural_hash,
                           verify)
from torchloom.tools import build_function, fusion_groups, import_workload
from torchloom_dedup.kernels import KEY, DedupKernels

from dedup_helpers import CountingCodegen, compiler, grouping_passes, has_fusion, plugin_set

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

THREE_GROUPS = """\
graph @three(%x: f32[4, 8], %y: f32[4, 8]) {
  %a = torchloom.fusion_group(%x, %y) : f32[4, 8] region @group0(%p: f32[4, 8], %q: f32[4, 8]) {
    %s = aten.mul.Tensor(%p, %q) : f32[4, 8]
    %t = aten.tanh.default(%s) : f32[4, 8]
    return %t
  }
  %b = torchloom.fusion_group(%a, %y) : f32[4, 8] region @group1(%i: f32[4, 8], %j: f32[4, 8]) {
    %m = aten.mul.Tensor(%i, %j) : f32[4, 8]
    %n = aten.tanh.default(%m) : f32[4, 8]
    return %n
  }
  %c = torchloom.fusion_group(%b, %y) : f32[4, 8] region @group2(%u: f32[4, 8], %w: f32[4, 8]) {
    %k = aten.mul.Tensor(%u, %w) : f32[4, 8]
    %l = aten.tanh.default(%k) : f32[4, 8]
    return %l
  }
  return %c
}
"""


def _eager_three(x, y):
    a = torch.tanh(x * y)
    b = torch.tanh(a * y)
    return torch.tanh(b * y)


def test_three_identical_groups_compile_once(tmp_path):
    codegen = CountingCodegen()
    comp = compiler(tmp_path, ["dedup.kernels"], codegen)
    result = comp.compile_graph(parse_graph(THREE_GROUPS))
    assert len(fusion_groups(result.graph)) == 3
    assert codegen.generated == 1
    assert {g.meta[KEY] for g in fusion_groups(result.graph)} == {
        structural_hash(fusion_groups(result.graph)[0].region)}
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(result.fn(x, y)[0], _eager_three(x, y))
    stats = {r.name: r.stats for r in result.report.records}["dedup.kernels"]
    assert (stats["groups"], stats["unique_kernels"]) == (3, 1)
    assert comp.kernel_cache.stats()["hits"] == 2


PERMUTED = """\
graph @perm(%x: f32[8], %y: f32[8]) {
  %u = torchloom.fusion_group(%y, %x) : f32[8] region @g0(%b: f32[8], %a: f32[8]) {
    %s = aten.sub.Tensor(%a, %b) : f32[8]
    return %s
  }
  %v = torchloom.fusion_group(%u, %x, %x) : f32[8] region @g1(%p: f32[8], %q: f32[8], %r: f32[8]) {
    %d = aten.sub.Tensor(%q, %p) : f32[8]
    return %d
  }
  return %v
}
"""


def test_groups_equal_up_to_input_order_and_duplicates_share_a_kernel(tmp_path):
    graph = parse_graph(PERMUTED)
    groups = fusion_groups(graph)
    assert structural_hash(groups[0].region) != structural_hash(groups[1].region)
    x, y = torch.randn(8), torch.randn(8)
    registry = plugin_set(CountingCodegen()).registry
    expected = build_function(graph, registry).fn(x, y)[0]

    result = DedupKernels().run(graph, PassContext(registry=registry))
    verify(graph, registry)
    assert result.changed and result.stats["inputs_merged"] == 1
    assert result.stats["inputs_dropped"] == 0
    assert result.stats["unique_kernels"] == 1
    assert print_graph(groups[0].region) == print_graph(groups[1].region)
    torch.testing.assert_close(build_function(graph, registry).fn(x, y)[0], expected)
    torch.testing.assert_close(expected, x - (x - y))
    assert not DedupKernels().run(graph, PassContext(registry=registry)).changed


def test_without_dedup_kernels_permuted_groups_compile_twice(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "deduped").mkdir()
    plain, deduped = CountingCodegen(), CountingCodegen()
    compiler(tmp_path / "plain", ["dce"], plain).compile_graph(parse_graph(PERMUTED))
    compiler(tmp_path / "deduped", ["dedup.kernels"], deduped).compile_graph(
        parse_graph(PERMUTED))
    assert (plain.generated, deduped.generated) == (2, 1)


def _load_example(name: str):
    return import_workload(EXAMPLES / f"{name}.py")


@pytest.mark.slow
@pytest.mark.parametrize("grouping", ["installed", "stand-in"])
def test_lstm_unrolled_compiles_one_kernel_per_unique_group(tmp_path, grouping):
    """8 time steps of an LSTM cell: every step's gate math is the same group. Groups come
    from the fusion plugin when installed (the stand-in pass otherwise), and from the
    stand-in grouping pass."""
    from torchloom.backend import torchloom_backend
    codegen = CountingCodegen()
    plugins = plugin_set(codegen)
    passes = grouping_passes(plugins) if grouping == "installed" else ["test.group-pointwise"]
    comp = compiler(tmp_path, passes + ["dedup.kernels", "dce"], codegen, plugins=plugins)
    fn, inputs = _load_example("lstm_unrolled").workload()
    compiled = torch.compile(fn, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": comp}))
    torch._dynamo.reset()
    try:
        eager_in = [t.detach().clone().requires_grad_() for t in inputs]
        comp_in = [t.detach().clone().requires_grad_() for t in inputs]
        expected, actual = fn(*eager_in), compiled(*comp_in)
        sum(t.sum() for t in expected).backward()
        sum(t.sum() for t in actual).backward()
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(actual, expected)
    for e, a in zip(eager_in, comp_in):
        torch.testing.assert_close(a.grad, e.grad)
    assert len(comp.compilations) == 2 and all(c.fallback_reason is None
                                               for c in comp.compilations)
    forward = fusion_groups(comp.compilations[0].graph)
    groups = forward + fusion_groups(comp.compilations[1].graph)
    unique = {structural_hash(g.region) for g in groups}
    assert codegen.generated == len(unique) == len(comp.kernel_cache) < len(groups)
    # every forward step is the same few groups: 8 steps share them
    forward_unique = {structural_hash(g.region) for g in forward}
    assert len(forward) >= 8 and len(forward_unique) * 8 == len(forward)
    stats = [r.stats for c in comp.compilations for r in c.report.records
             if r.name == "dedup.kernels"]
    assert sum(s["groups"] for s in stats) == len(groups)
    print(f"lstm: grouping={grouping}, fusion plugin={has_fusion(plugins)}, "
          f"groups={len(groups)}, unique={len(unique)}")
