"""Which nodes may be removed or merged without changing what the program does."""

from __future__ import annotations

from torchloom.ir.graph import CONSTANT, FUSION_GROUP, Graph, Node

_PURE_CATEGORIES = ("pointwise", "reduction", "view", "layout")


def is_pure(node: Node, registry) -> bool:
    """True when the node has no effect besides its results (no writes, no RNG, no I/O)."""
    if node.op in (CONSTANT, FUSION_GROUP):
        return True
    opdef = registry.get(node.op)
    if opdef.category in _PURE_CATEGORIES:
        return True
    if opdef.category != "opaque" or opdef.schema is None:
        return False
    schema = opdef.schema
    return bool(schema.returns) and not schema.is_mutable and not node.op.startswith("aten._assert")


def mutated_values(graph: Graph, registry) -> set:
    """Values some node writes in place (their readers must not be reordered or merged)."""
    written = set()
    for node in graph.nodes:
        opdef = registry.get(node.op)
        if opdef.mutates:
            written.update(node.inputs[i] for i in opdef.mutated_inputs(node))
    return written
