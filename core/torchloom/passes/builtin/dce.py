"""``dce``: remove pure nodes whose results nobody reads."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.ir.graph import Graph
from torchloom.passes.base import Pass, PassContext, PassResult
from torchloom.passes.builtin.purity import is_pure


@attrs.frozen
class DeadCodeElimination(Pass):
    """Erase pure nodes with unused results, inside regions too.

    before::

        %a = aten.exp.default(%x) : f32[4]
        %b = aten.neg.default(%x) : f32[4]
        return %b

    after::

        %b = aten.neg.default(%x) : f32[4]
        return %b
    """

    name: ClassVar[str] = "dce"
    regions: bool = True

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        removed = remove_dead_nodes(graph, ctx.registry, regions=self.regions)
        return PassResult(removed > 0, {"removed": removed})


def remove_dead_nodes(graph: Graph, registry, *, regions: bool = True) -> int:
    """Erase pure nodes whose results nobody reads (inside regions too, with ``regions``);
    returns how many were erased."""
    removed = 0
    outputs = set(graph.outputs)
    node = graph.last
    while node is not None:
        prev = node.prev
        if not any(v.uses or v in outputs for v in node.outputs) and is_pure(node, registry):
            graph.erase(node)
            removed += 1
        elif regions and node.region is not None:
            removed += remove_dead_nodes(node.region, registry)
        node = prev
    return removed
