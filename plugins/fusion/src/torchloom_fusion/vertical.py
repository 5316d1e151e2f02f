"""``fusion.vertical``: merge producers into their consumer's fusion group."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import Graph, Pass, PassContext, PassResult

from torchloom_fusion.groups import GroupEditor, starts_group

_positive = [attrs.validators.instance_of(int), attrs.validators.ge(1)]


@attrs.frozen
class VerticalFusion(Pass):
    """Walk the graph from the end; each pointwise or reduction node (or group) absorbs
    its fusible producers while a topologically valid merge exists, the group's distinct
    inputs stay within ``max_group_inputs`` and its outputs within ``max_group_outputs``.
    A node left alone starts its own group; views join only with a consumer. Work is never
    duplicated: a producer whose value is also read outside becomes a group output.
    Reductions take pointwise prologues and epilogues, and reductions over the same rows
    share a group (softmax is one group).

    before::

        %s = aten.add.Tensor(%a, %b) : f32[4, 8]
        %e = aten.exp.default(%s) : f32[4, 8]
        %r = aten.sum.dim_IntList(%e) {dim = [-1]} : f32[4]
        %m = aten.mm.default(%e, %w) : f32[4, 4]
        return %m, %r

    after::

        %r, %e = torchloom.fusion_group(%a, %b) : f32[4], f32[4, 8] region @fused_r(...) {
          %s = aten.add.Tensor(%a, %b) : f32[4, 8]
          %e = aten.exp.default(%s) : f32[4, 8]
          %r = aten.sum.dim_IntList(%e) {dim = [-1]} : f32[4]
          return %r, %e
        }
        %m = aten.mm.default(%e, %w) : f32[4, 4]
        return %m, %r
    """

    name: ClassVar[str] = "fusion.vertical"
    after: ClassVar[tuple[str, ...]] = ("fusion.decompose", "fusion.functionalize")
    max_group_inputs: int = attrs.field(default=128, validator=_positive)
    max_group_outputs: int = attrs.field(default=64, validator=_positive)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        ed = GroupEditor(graph, ctx.registry, self.max_group_inputs, self.max_group_outputs)
        node = graph.last
        while node is not None:
            prev = node.prev
            if starts_group(ed.kind(node)) and ed.fits(node):
                node = self._absorb_producers(ed, node)
                prev = node.prev
            node = prev
        ed.finish()
        return PassResult(ed.merges + ed.created > 0,
                          {"merged": ed.merges, "groups_started": ed.created})

    def _absorb_producers(self, ed: GroupEditor, consumer):
        """Absorb producers, latest first (so the nodes between an early producer and the
        group join before it); a failed producer is retried after each success."""
        group = ed.wrap(consumer)
        failed: set = set()
        while True:
            candidates = sorted({v.producer for v in group.inputs
                                 if v.producer is not None and v.producer not in failed
                                 and ed.kind(v.producer) is not None},
                                key=ed.order.__getitem__, reverse=True)
            for producer in candidates:
                merged = ed.try_merge(producer, group)
                if merged is not None:
                    group = merged
                    failed.clear()
                    break
                failed.add(producer)
            else:
                return group
