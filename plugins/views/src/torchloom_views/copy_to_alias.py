"""``views.copy-to-alias``: copies made by ``views.alias-to-copy`` become views again
where no mutation of them is left."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import Graph, Pass, PassContext, PassResult, mutated_values
from torchloom_views.view_ops import FROM_VIEW, swap_op


@attrs.frozen
class CopyToAlias(Pass):
    """Revert copies introduced by ``views.alias-to-copy`` (the seed's revertAliasCopyOps)
    once nothing writes them any more (for instance after ``fusion.functionalize`` made the
    write out-of-place), inside fusion groups too.

    before::

        %v = aten.view_copy.default(%t) {size = [24]} : f32[24]
        %w = aten.mul.Tensor(%v, %s) : f32[24]

    after::

        %v = aten.view.default(%t) {size = [24]} : f32[24]
        %w = aten.mul.Tensor(%v, %s) : f32[24]
    """

    name: ClassVar[str] = "views.copy-to-alias"
    after: ClassVar[tuple[str, ...]] = ("views.alias-to-copy",)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        reverted = _revert(graph, ctx)
        return PassResult(reverted > 0, {"reverted": reverted})


def _revert(graph: Graph, ctx: PassContext) -> int:
    written = mutated_values(graph, ctx.registry)
    reverted = 0
    for node in list(graph.nodes):
        if node.region is not None:
            reverted += _revert(node.region, ctx)
            continue
        view_op = node.meta.get(FROM_VIEW)
        if view_op is None or node.output in written:
            continue
        twin = swap_op(graph, node, view_op, {})
        twin.meta.pop(FROM_VIEW, None)
        reverted += 1
    return reverted
