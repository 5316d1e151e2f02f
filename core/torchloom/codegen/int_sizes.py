"""Inputs of a fusion group that give its kernel sizes, or are there for that alone.

- :func:`int_sizes`: int inputs that are a size, either by type (``int[s4]``, a SymInt
  Dynamo passes a graph) or because a view inside takes them as that size
  (``aten.view(%x, %n) {size = [$1, 64]} : f32[s0, 64]``: ``%n`` is ``s0``);
- :func:`unread_inputs`: tensor inputs nothing inside reads or returns (a size carrier
  that ``fusion.size-carriers`` passes for its shape only: a codegen loads nothing from
  it and checks no layout of it).
"""

from __future__ import annotations

from torchloom.ir import Graph, InputRef, ScalarType, TensorType


def int_sizes(region: Graph) -> list[tuple[int, str]]:
    """(input index, dim) for each int input of ``region`` that is a size: ``int[sN]``
    inputs first, then those a node's ``size`` takes for a symbolic dim, in node order.

    A slice's end is no such size: ``x[:, :n]`` typed with a bare symbol is that symbol
    only where ``n`` did not reach the dim (Dynamo types ``Min(s0, n)`` as ``s0`` under
    its guard ``n >= s0``); a bare SymInt ``n`` arrives as ``int[sN]`` anyway."""
    position = {v: i for i, v in enumerate(region.inputs)}
    found = [(i, v.type.size) for i, v in enumerate(region.inputs)
             if isinstance(v.type, ScalarType) and v.type.size is not None]
    for n in region.nodes:
        size = n.attrs.get("size")
        if not isinstance(size, (list, tuple)) or len(n.outputs) != 1 or not isinstance(
                n.outputs[0].type, TensorType) or len(size) != n.outputs[0].type.rank:
            continue
        for ref, d in zip(size, n.outputs[0].type.shape):
            if isinstance(ref, InputRef) and isinstance(d, str):
                v = n.inputs[int(ref)]
                if v in position and isinstance(v.type, ScalarType) and v.type.kind == "int":
                    found.append((position[v], d))
    return found


def unread_inputs(region: Graph) -> frozenset[int]:
    """Indexes of the tensor inputs of ``region`` that nothing inside reads or returns."""
    returned = set(region.outputs)
    return frozenset(i for i, v in enumerate(region.inputs) if isinstance(
        v.type, TensorType) and not v.uses and v not in returned)


__all__ = ["int_sizes", "unread_inputs"]
