"""Inputs of a fusion group that give its kernel sizes, or are there for that alone.

- :func:`int_sizes`: int inputs that are a size, either by type (``int[s4]``, a SymInt
  Dynamo passes a graph) or because a view inside takes them as that size
  (``aten.view(%x, %n) {size = [$1, 64]} : f32[s0, 64]``: ``%n`` is ``s0``);
- :func:`unread_inputs`: tensor inputs nothing inside reads or returns (a size carrier
  that ``fusion.size-carriers`` passes for its shape only: a codegen loads nothing from
  it and checks no layout of it).
"""

from __future__ import annotations

from torchloom.ir import Graph, InputRef, ScalarType, TensorType, Value, symbols
from torchloom.ir.symbols import Dim


def int_sizes(region: Graph) -> list[tuple[int, str]]:
    """(input index, dim) for each int input of ``region`` that is a size: ``int[sN]``
    inputs first, then, in node order, those a node's ``size`` takes for a symbolic dim
    and those a slice from 0 takes as its end where its type's dim there is a bare symbol
    (``x[:, :n]`` of an ``i64[2, s0+1]``, typed ``i64[2, s0]``: ``n`` is ``s0``, not
    clamped, as the input's dim is another size)."""
    position = {v: i for i, v in enumerate(region.inputs)}
    found = [(i, v.type.size) for i, v in enumerate(region.inputs)
             if isinstance(v.type, ScalarType) and v.type.size is not None]

    def take(v: Value, d: Dim) -> None:
        if v in position and isinstance(v.type, ScalarType) and v.type.kind == "int" and \
                isinstance(d, str):
            found.append((position[v], d))

    for n in region.nodes:
        if len(n.outputs) != 1 or not isinstance(n.outputs[0].type, TensorType):
            continue
        shape, size = n.outputs[0].type.shape, n.attrs.get("size")
        if isinstance(size, (list, tuple)) and len(size) == len(shape):
            for ref, d in zip(size, shape):
                if isinstance(ref, InputRef):
                    take(n.inputs[int(ref)], d)
        elif n.op == "aten.slice.Tensor" and len(n.inputs) == 2 and "end" not in n.attrs \
                and n.attrs.get("start") == 0 and n.attrs.get("step", 1) == 1:
            dim = n.attrs.get("dim", 0)
            if isinstance(dim, int) and -len(shape) <= dim < len(shape) and \
                    symbols.is_symbol(shape[dim]):
                take(n.inputs[1], shape[dim])
    return found


def unread_inputs(region: Graph) -> frozenset[int]:
    """Indexes of the tensor inputs of ``region`` that nothing inside reads or returns."""
    returned = set(region.outputs)
    return frozenset(i for i, v in enumerate(region.inputs) if isinstance(
        v.type, TensorType) and not v.uses and v not in returned)


__all__ = ["int_sizes", "unread_inputs"]
