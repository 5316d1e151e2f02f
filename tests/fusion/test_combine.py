"""fusion.combine: consecutive independent pointwise CPU groups become one group (one call;
the cpu codegen's nest per element count); groups that read each other, reduce, live on
another device or have symbolic shapes stay apart, and the limits hold."""

from __future__ import annotations

import pytest

from fusion_testing import fuse_and_compare, groups
from torchloom.api import PassContext, parse_graph
from torchloom_fusion.combine import CombineGroups


def _group(i: int, shape: str, op: str = "aten.sqrt.default", device: str = "",
           read: str | None = None) -> str:
    src, t = read or f"%x{i}", f"f32[{shape}]{device}"
    return f"""  %o{i} = torchloom.fusion_group({src}) : {t} region @g{i}(%p: {t}) {{
    %t = {op}(%p) : {t}
    return %t
  }}"""


def _graph(shapes: list[str], device: str = "", body: list[str] | None = None) -> str:
    params = ", ".join(f"%x{i}: f32[{s}]{device}" for i, s in enumerate(shapes))
    body = body or [_group(i, s, device=device) for i, s in enumerate(shapes)]
    outs = ", ".join(f"%o{i}" for i in range(len(body)))
    return "\n".join([f"graph @g({params}) {{", *body, f"  return {outs}", "}"])


def test_independent_groups_of_other_shapes_combine(registry):
    fused = fuse_and_compare(_graph(["4", "8, 3", "2, 2, 5", "1"]), registry,
                             [CombineGroups()])
    (group,) = groups(fused)
    assert [v.type.shape for v in group.outputs] == [(4,), (8, 3), (2, 2, 5), (1,)]


def test_a_group_reading_the_one_before_is_left_to_vertical_fusion(registry):
    body = [_group(0, "4"), _group(1, "4", "aten.exp.default", read="%o0")]
    fused = fuse_and_compare(_graph(["4"], body=body), registry, [CombineGroups()])
    assert len(groups(fused)) == 2


def test_reductions_symbolic_shapes_and_other_devices_stay_apart(registry):
    reduction = """  %o1 = torchloom.fusion_group(%x1) : f32[3] region @g1(%p: f32[3, 4]) {
    %t = aten.sum.dim_IntList(%p) {dim = [1]} : f32[3]
    return %t
  }"""
    text = _graph(["4", "3, 4"], body=[_group(0, "4"), reduction])
    assert len(groups(fuse_and_compare(text, registry, [CombineGroups()]))) == 2
    # symbolic shapes, another device: the pass reads types only (nothing runs here)
    for text in (_graph(["s0", "4"]), _graph(["4", "8"], device=" @meta")):
        graph = parse_graph(text)
        result = CombineGroups().run(graph, PassContext(registry=registry))
        assert not result.changed and len(groups(graph)) == 2


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_limits_bound_the_combined_groups(registry, limit):
    shapes = ["4", "8", "12", "16", "20", "24"]
    fused = fuse_and_compare(_graph(shapes), registry, [CombineGroups(max_counts=limit)])
    assert len(groups(fused)) == -(-len(shapes) // limit)
    assert all(len(g.outputs) <= limit for g in groups(fused))
    fused = fuse_and_compare(_graph(shapes), registry, [CombineGroups(max_group_outputs=limit)])
    assert all(len(g.outputs) <= limit for g in groups(fused))
