"""``fusion.horizontal``: merge sibling groups that read the same value."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import Graph, Pass, PassContext, PassResult

from torchloom_fusion.groups import GroupEditor, starts_group

_positive = [attrs.validators.instance_of(int), attrs.validators.ge(1)]


@attrs.frozen
class HorizontalFusion(Pass):
    """Siblings (groups or fusible nodes) that share an input and have no path between
    them merge into one group when they iterate over the same space (equal largest
    numel; reductions over the same rows) and the limits hold. Typical: the four LSTM
    gate activations, the q/k/v epilogues.

    before::

        %g1 = torchloom.fusion_group(%x) : f32[8, 32] region @a(%p: f32[8, 32]) {
          %s = aten.sigmoid.default(%p) : f32[8, 32]
          return %s
        }
        %m = aten.mm.default(%w, %v) : f32[8, 32]
        %g2 = torchloom.fusion_group(%x) : f32[8, 32] region @b(%q: f32[8, 32]) {
          %t = aten.tanh.default(%q) : f32[8, 32]
          return %t
        }

    after::

        %g1, %g2 = torchloom.fusion_group(%x) : f32[8, 32], f32[8, 32] region @a(%p: f32[8, 32]) {
          %s = aten.sigmoid.default(%p) : f32[8, 32]
          %t = aten.tanh.default(%p) : f32[8, 32]
          return %s, %t
        }
        %m = aten.mm.default(%w, %v) : f32[8, 32]

    ``max_siblings`` bounds how many partial groups are kept per shared value.
    """

    name: ClassVar[str] = "fusion.horizontal"
    after: ClassVar[tuple[str, ...]] = ("fusion.decompose", "fusion.functionalize")
    max_group_inputs: int = attrs.field(default=128, validator=_positive)
    max_group_outputs: int = attrs.field(default=64, validator=_positive)
    max_siblings: int = attrs.field(default=8, validator=_positive)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        ed = GroupEditor(graph, ctx.registry, self.max_group_inputs, self.max_group_outputs)
        values = list(graph.inputs)
        for node in graph.nodes:
            values.extend(node.outputs)
        for v in values:
            users = [u for u in v.users()
                     if u.graph is graph and starts_group(ed.kind(u)) and ed.fits(u)]
            if len(users) > 1:
                self._merge_siblings(ed, sorted(users, key=ed.order.__getitem__))
        ed.finish()
        return PassResult(ed.merges > 0, {"merged": ed.merges, "groups_started": ed.created})

    def _merge_siblings(self, ed: GroupEditor, siblings: list) -> None:
        heads: list = []
        for node in siblings:
            if node.graph is not ed.graph:  # merged away through an earlier shared value
                continue
            for i, head in enumerate(heads):
                if head.graph is not ed.graph or ed.domain(head) != ed.domain(node):
                    continue
                merged = ed.try_merge(head, node)
                if merged is not None:
                    heads[i] = merged
                    break
            else:
                if len(heads) < self.max_siblings:
                    heads.append(node)
