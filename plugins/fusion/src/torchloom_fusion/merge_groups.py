"""``fusion.merge-groups``: merge adjacent groups and tidy every group's region."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import (CONSTANT, Graph, Node, PassContext, PassResult, TensorType,
                           merge_common_nodes, remove_dead_nodes, select_region_inputs,
                           select_region_outputs)

from torchloom_fusion.fusibility import is_group
from torchloom_fusion.groups import GroupEditor, GroupLimits


#: splits of a group output that are cheaper inside the group (nvFuser moves chunk in)
_SPLITS = frozenset({"aten.split.Tensor", "aten.split_with_sizes.default",
                     "aten.chunk.default", "aten.unbind.int"})

#: queries that read only a tensor's metadata: op -> f(type, attrs) -> value
_METADATA: dict = {
    "aten.sym_size.int": lambda t, a: t.shape[a.get("dim", 0)],
    "aten.sym_numel.default": lambda t, a: t.numel(),
    "aten.sym_stride.int": lambda t, a: t.actual_strides()[a.get("dim", 0)],
    "aten.sym_storage_offset.default": lambda t, a: 0,
    "aten.dim.default": lambda t, a: t.rank,
}


@attrs.frozen
class MergeGroups(GroupLimits):
    """Clean-ups after vertical and horizontal fusion:

    - a group directly followed by another group it feeds, or that iterates over the
      same space, merges with it (within the limits);
    - a split/chunk/unbind of a group output moves into the group;
    - group outputs nobody reads are dropped, and outputs read only for their size,
      stride or rank are replaced by constants (nvFuser's removeOutputsUsedOnlyInSize);
    - dead code and common subexpressions inside each region are removed.

    before::

        %a = torchloom.fusion_group(%x) : f32[4] region @g0(%p: f32[4]) {
          %e = aten.exp.default(%p) : f32[4]
          %u = aten.neg.default(%p) : f32[4]
          return %e
        }
        %b = torchloom.fusion_group(%a) : f32[4] region @g1(%q: f32[4]) {
          %t = aten.tanh.default(%q) : f32[4]
          return %t
        }

    after::

        %b = torchloom.fusion_group(%x) : f32[4] region @g0(%p: f32[4]) {
          %e = aten.exp.default(%p) : f32[4]
          %t = aten.tanh.default(%e) : f32[4]
          return %t
        }
    """

    name: ClassVar[str] = "fusion.merge-groups"
    after: ClassVar[tuple[str, ...]] = ("fusion.vertical", "fusion.horizontal")

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        ed = self.editor(graph, ctx)
        stats = {"merged": 0, "splits_moved": 0, "outputs_pruned": 0, "size_outputs": 0,
                 "dead": 0, "cse": 0, "inputs_pruned": 0}
        node = graph.first
        while node is not None:
            nxt = node.next
            if is_group(node):
                if nxt is not None and is_group(nxt) and self._related(ed, node, nxt):
                    merged = ed.try_merge(node, nxt)
                    if merged is not None:
                        stats["merged"] += 1
                        node = merged
                        continue
                for v in list(node.outputs):
                    for user in v.users():
                        if user.op in _SPLITS and user.graph is graph and \
                                ed.try_merge(node, user) is not None:
                            stats["splits_moved"] += 1
            node = nxt
        ed.finish()
        outputs = set(graph.outputs)  # (metadata folding replaces no group output)
        for group in [n for n in graph.nodes if is_group(n)]:
            stats["size_outputs"] += _fold_metadata_uses(graph, group)
            stats["dead"] += remove_dead_nodes(group.region, ctx.registry, regions=False)
            stats["cse"] += merge_common_nodes(group.region, ctx.registry, regions=False)
            pruned = _prune_outputs(outputs, group)
            stats["outputs_pruned"] += pruned
            if pruned:  # (cse leaves nothing dead: a duplicate's readers read the first)
                stats["dead"] += remove_dead_nodes(group.region, ctx.registry, regions=False)
            stats["inputs_pruned"] += _prune_inputs(group)
        return PassResult(any(stats.values()), stats)

    @staticmethod
    def _related(ed: GroupEditor, a: Node, b: Node) -> bool:
        feeds = any(v.producer is a for v in b.inputs)
        return feeds or ed.domain(a) == ed.domain(b)


def _fold_metadata_uses(graph: Graph, group: Node) -> int:
    folded = 0
    for v in group.outputs:
        if not isinstance(v.type, TensorType) or not v.type.is_static:
            continue
        for user in v.users():
            rule = _METADATA.get(user.op)
            if rule is None or len(user.outputs) != 1:
                continue
            value = rule(v.type, user.attrs)
            const = graph.create(CONSTANT, [], [user.output.type], {"value": value},
                                 names=[user.output.name], before=user)
            graph.replace_all_uses(user.output, const.output)
            graph.erase(user)
            folded += 1
    return folded


def _prune_outputs(outputs: set, group: Node) -> int:
    """Drop outputs with no reader outside (the region's return shrinks with them);
    ``outputs``: the graph's outputs."""
    keep = [i for i, v in enumerate(group.outputs) if v.uses or v in outputs]
    if len(keep) == len(group.outputs) or not keep:
        return 0
    dropped = len(group.outputs) - len(keep)
    select_region_outputs(group, keep)
    return dropped


def _prune_inputs(group: Node) -> int:
    """Drop region inputs that nothing inside reads."""
    region = group.region
    returned = set(region.outputs)
    keep = [i for i, v in enumerate(region.inputs) if v.uses or v in returned]
    if len(keep) == len(region.inputs):
        return 0
    select_region_inputs(group, keep)
    return len(group.inputs) - len(keep)
