"""``fusion.combine``: consecutive independent pointwise groups on the CPU become one."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import Graph, Node, PassContext, PassResult, TensorType

from torchloom_fusion.fusibility import is_group
from torchloom_fusion.groups import POSITIVE, GroupEditor, GroupLimits


@attrs.frozen
class CombineGroups(GroupLimits):
    """Pointwise groups that follow each other, neither reading the other, merge into one
    group (within the limits) when their tensors are on ``device`` and of static shapes:
    one call instead of several. The cpu codegen writes such a group as one function with
    a loop nest per element count; a CUDA codegen (triton) writes one element count per
    kernel, so other devices are left alone. Typical: a compiled optimizer step, one
    group per parameter (its ``_foreach_*`` ops decomposed), ConvNeXt's 110 parameters in
    70 groups before, 12 after (Inductor's combo kernels: 3).

    before::

        %p1 = torchloom.fusion_group(%a) : f32[64] region @u(%x: f32[64]) {
          %t = aten.mul.Tensor(%x) {other = 0.5} : f32[64]
          return %t
        }
        %p2 = torchloom.fusion_group(%b) : f32[8, 3] region @v(%y: f32[8, 3]) {
          %s = aten.sqrt.default(%y) : f32[8, 3]
          return %s
        }

    after::

        %p1, %p2 = torchloom.fusion_group(%a, %b) : f32[64], f32[8, 3] region @u(%x: f32[64], %y: f32[8, 3]) {
          %t = aten.mul.Tensor(%x) {other = 0.5} : f32[64]
          %s = aten.sqrt.default(%y) : f32[8, 3]
          return %t, %s
        }

    ``max_counts`` bounds the distinct element counts of a combined group (its loop
    nests).
    """

    name: ClassVar[str] = "fusion.combine"
    after: ClassVar[tuple[str, ...]] = ("fusion.merge-groups",)
    device: str = "cpu"
    max_counts: int = attrs.field(default=16, validator=POSITIVE)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        ed = self.editor(graph, ctx)
        merged = 0
        node = graph.first
        while node is not None:
            nxt = node.next
            if nxt is not None and self._combinable(ed, node) and \
                    self._combinable(ed, nxt) and \
                    not any(v.producer is node for v in nxt.inputs) and \
                    len(_counts(node) | _counts(nxt)) <= self.max_counts:
                group = ed.try_merge(node, nxt)
                if group is not None:
                    merged += 1
                    node = group
                    continue
            node = nxt
        ed.finish()
        return PassResult(merged > 0, {"merged": merged})

    def _combinable(self, ed: GroupEditor, node: Node) -> bool:
        """A group of pointwise ops (and views) on ``device`` whose outputs have static
        shapes."""
        return is_group(node) and not ed.signatures(node) and \
            ed.device(node) == self.device and all(
                isinstance(v.type, TensorType) and v.type.is_static for v in node.outputs)


def _counts(group: Node) -> set[int]:
    """The element counts of a group's outputs (a nest each in the cpu codegen)."""
    return {v.type.numel() for v in group.outputs}
