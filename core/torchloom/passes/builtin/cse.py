"""``cse``: merge pure nodes that compute the same thing from the same inputs."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.ir.aliasing import returned_storage, written_storage
from torchloom.ir.graph import FUSION_GROUP, Graph
from torchloom.ir.types import attrs_key
from torchloom.passes.base import Pass, PassContext, PassResult
from torchloom.passes.builtin.purity import is_pure


@attrs.frozen
class CommonSubexpressionElimination(Pass):
    """Replace a node by an earlier identical one (same op, inputs and attributes).

    before::

        %a = aten.exp.default(%x) : f32[4]
        %b = aten.exp.default(%x) : f32[4]
        %c = aten.add.Tensor(%a, %b) : f32[4]

    after::

        %a = aten.exp.default(%x) : f32[4]
        %c = aten.add.Tensor(%a, %a) : f32[4]

    Attributes equal in Python but not as arguments keep nodes apart (``x * -0.0`` is not
    ``x * 0.0``: :func:`~torchloom.ir.types.attrs_key`). Random, mutating and
    side-effecting ops are never merged, nor are nodes that read or
    produce storage written in place somewhere in the graph (through views too: the two
    would see different values), nor two nodes whose results are both
    returned, themselves or through views (the caller gets two tensors and may write one).
    """

    name: ClassVar[str] = "cse"
    regions: bool = True

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        merged = merge_common_nodes(graph, ctx.registry, regions=self.regions)
        return PassResult(merged > 0, {"merged": merged})


def merge_common_nodes(graph: Graph, registry, *, regions: bool = True) -> int:
    """Replace each pure node by an earlier identical one (same op, inputs, attributes and
    types), inside fusion groups too with ``regions``; returns how many were merged."""
    written = written_storage(graph, registry)
    returned = returned_storage(graph, registry)
    seen: dict = {}
    merged = 0
    replaced: dict = {}  # duplicate's output -> the first node's
    doomed: list = []
    for node in list(graph.nodes):
        if node.region is not None:
            if regions and node.op == FUSION_GROUP:
                merged += merge_common_nodes(node.region, registry)
            continue
        if not is_pure(node, registry) or any(v in written for v in node.inputs) \
                or any(v in written for v in node.outputs):
            continue
        try:
            # a duplicate's readers key on the first node's outputs
            key = (node.op, tuple(id(replaced.get(v, v)) for v in node.inputs),
                   attrs_key(node.attrs),
                   tuple(v.type for v in node.outputs))
            hash(key)
        except TypeError:
            continue
        first = seen.setdefault(key, node)
        if first is node:
            continue
        if returned.intersection(node.outputs):
            if returned.intersection(first.outputs):
                continue  # two results the caller gets stay two tensors (docs/ir.md)
            returned.update(first.outputs)  # its storage is returned from now on
        replaced.update(zip(node.outputs, first.outputs))
        doomed.append(node)
    if doomed:  # one scan of the graph outputs and of each use list, not one per node
        graph.replace_uses(replaced)
        graph.erase_many(doomed)
    return len(doomed) + merged
