"""``views.alias-to-copy``: a view written in place becomes a copy when nobody can see
the difference, so the write stays local and can be made out-of-place."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import Graph, Pass, PassContext, PassResult, mutated_values
from torchloom_views.view_ops import COPY_OF, FROM_VIEW, is_view, swap_op


@attrs.frozen
class AliasToCopy(Pass):
    """Replace a view whose result is mutated by its copying twin, when its base is read
    by nothing else and is neither a graph input nor a graph output (the seed's
    replaceAliasOpsWithCopy). ``views.copy-to-alias`` turns copies back into views once
    no mutation of them remains.

    before::

        %t = aten.exp.default(%x) : f32[4, 6]
        %v = aten.view.default(%t) {size = [24]} : f32[24]
        %w = aten.mul_.Tensor(%v, %s) : f32[24]

    after::

        %t = aten.exp.default(%x) : f32[4, 6]
        %v = aten.view_copy.default(%t) {size = [24]} : f32[24]
        %w = aten.mul_.Tensor(%v, %s) : f32[24]
    """

    name: ClassVar[str] = "views.alias-to-copy"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        written = mutated_values(graph, ctx.registry)
        boundary = set(graph.inputs) | set(graph.outputs)
        replaced = 0
        for node in list(graph.nodes):
            if not is_view(node) or node.op not in COPY_OF or node.output not in written:
                continue
            base = node.inputs[0]
            if base in boundary or base.users() != [node] or base in written \
                    or _is_alias(base, ctx.registry):
                continue
            swap_op(graph, node, COPY_OF[node.op], {FROM_VIEW: node.op})
            replaced += 1
        return PassResult(replaced > 0, {"copies": replaced})


def _is_alias(value, registry) -> bool:
    """Whether ``value`` shares storage with an input of its producer (a view, or an
    in-place op's result): a copy of a view of it would hide the write from that tensor."""
    node = value.producer
    return node is not None and registry.get(node.op).aliased_input(node, value.index) is not None
