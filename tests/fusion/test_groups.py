"""The group editor under the fusion passes: groups grow in place, use lists stay exact."""

from __future__ import annotations

from fusion_testing import fuse_and_compare, groups
from torchloom.api import parse_graph, verify
from torchloom_fusion.groups import GroupEditor
from torchloom_fusion.vertical import VerticalFusion


def _grouped_chain(n: int) -> str:
    body = ["    %v0 = aten.exp.default(%p) : f32[8]"]
    body += [f"    %v{i} = aten.add.Tensor(%v{i - 1}, %q) : f32[8]" for i in range(1, n)]
    return ("graph @g(%x: f32[8], %b: f32[8]) {\n"
            "  %n = aten.neg.default(%x) : f32[8]\n"
            f"  %r = torchloom.fusion_group(%n, %b) : f32[8] region @big(%p: f32[8], %q: f32[8]) {{\n"
            + "\n".join(body) + f"\n    return %v{n - 1}\n  }}\n  return %r\n}}")


def test_absorbing_a_producer_grows_the_region_in_place(registry):
    graph = parse_graph(_grouped_chain(40))
    neg, group = graph.first, graph.last
    region, before = group.region, list(group.region.nodes)
    ed = GroupEditor(graph, registry, 128, 64)
    merged = ed.try_merge(neg, group)
    ed.finish()
    verify(graph, registry)
    assert merged is group and group.region is region  # the big region was not rebuilt
    assert list(region.nodes) == [neg, *before] and len(graph) == 1
    assert group.inputs == graph.inputs


def _chain_with_barriers(n: int) -> str:
    lines = ["  %v0 = aten.exp.default(%x) : f32[8]"]
    for i in range(1, n):
        op = "aten.cumsum.default(%v{0}) {{dim = 0}}" if i % 50 == 0 else \
            "aten.add.Tensor(%v{0}, %b)"
        lines.append(f"  %v{i} = " + op.format(i - 1) + " : f32[8]")
    return ("graph @g(%x: f32[8], %b: f32[8]) {\n" + "\n".join(lines) +
            f"\n  return %v{n - 1}\n}}")


def test_a_value_read_by_every_group_keeps_an_exact_use_list(registry):
    fused = fuse_and_compare(_chain_with_barriers(300), registry, [VerticalFusion()])
    b = fused.inputs[1]
    readers = [g for g in groups(fused) if b in g.inputs]
    assert len(readers) == 6
    assert sorted(map(id, b.uses)) == sorted(map(id, readers))
