"""``views.collapse``: a chain of views costs no more than one view."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import Graph, Node, Pass, PassContext, PassResult, TensorType
from torchloom_views.view_ops import RESHAPES, is_view, is_zero_copy

_PERMUTES = frozenset({"aten.permute.default", "aten.transpose.int", "aten.t.default"})


def permutation(node: Node) -> list[int] | None:
    """The dims list of a permute-like node (``out dim i = in dim perm[i]``)."""
    t = node.inputs[0].type
    if not isinstance(t, TensorType):
        return None
    rank = t.rank
    if node.op == "aten.permute.default":
        return [d % rank for d in node.attrs["dims"]] if rank else []
    perm = list(range(rank))
    if node.op == "aten.t.default":
        return perm[::-1] if rank == 2 else perm
    if node.op == "aten.transpose.int":
        d0, d1 = node.attrs["dim0"] % rank, node.attrs["dim1"] % rank
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return perm
    return None


@attrs.frozen
class CollapseViews(Pass):
    """Fold view-of-view chains into one view: reshape∘reshape -> reshape of the base,
    permute∘permute (transpose, t) -> one permute, an identity permute -> nothing.

    before::

        %a = aten.view.default(%x) {size = [4, 8]} : f32[4, 8]
        %b = aten.view.default(%a) {size = [32]} : f32[32]

    after::

        %b = aten.view.default(%x) {size = [32]} : f32[32]

    An intermediate view that is read elsewhere, or is a graph output, is kept (the chain
    is then still folded for this reader). Regions are processed too.
    """

    name: ClassVar[str] = "views.collapse"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        folded = _collapse(graph)
        return PassResult(folded > 0, {"folded": folded})


def _collapse(graph: Graph) -> int:
    folded = 0
    outputs = set(graph.outputs)
    for node in list(graph.nodes):
        if node.region is not None:
            folded += _collapse(node.region)
            continue
        if node.graph is None or not is_view(node):
            continue
        source = node.inputs[0].producer
        if source is None or source.graph is not graph or not is_view(source):
            continue
        base = source.inputs[0]
        if node.op in RESHAPES and source.op in RESHAPES:
            if not is_zero_copy(node, base.type):
                continue
            node.set_input(0, base)
        elif node.op in _PERMUTES and source.op in _PERMUTES:
            inner, outer = permutation(source), permutation(node)
            if inner is None or outer is None:
                continue
            total = [inner[i] for i in outer]
            if total == list(range(len(total))) and node.output not in outputs:
                graph.replace_all_uses(node.output, base)
                graph.erase(node)
            else:
                replacement = graph.create("aten.permute.default", [base],
                                           [node.output.type], {"dims": tuple(total)},
                                           names=[node.output.name + "_p"], before=node)
                graph.replace_all_uses(node.output, replacement.output)
                graph.erase(node)
        else:
            continue
        folded += 1
        if not any(v.uses or v in outputs for v in source.outputs):
            graph.erase(source)
    return folded
