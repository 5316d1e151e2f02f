"""What the writer asks of every tensor it touches: a type of known (int or symbolic)
sizes and a stored dtype.

Kept apart from kernel.py so that the helpers kernel.py calls (reduction, columns) can use
it without importing the writer back (no import cycle).
"""

from __future__ import annotations

from torchloom.api import TensorType, Value, indexing, writer

from torchloom_codegen_cpu.ops import STORAGE, VIEWS

Unsupported = indexing.Unsupported


def tensor_type(v: Value) -> TensorType:
    return indexing.checked_tensor_type(
        v, STORAGE, "only float, int and bool scalar inputs are supported")


#: dims from outermost to innermost in memory (the core's, which reduction nests use too)
memory_order = indexing.memory_order


def walked_flat(outputs: list[Value]) -> bool:
    """Whether a pointwise nest writing ``outputs`` can walk every element at once: static
    sizes, every output of the first's shape, every tensor it touches dense (row-major)
    and of that shape or a single element, no views (each element then sits at the walk's
    index in every tensor)."""
    outs = [tensor_type(v) for v in outputs]
    shape = outs[0].shape
    upstream = writer.upstream_nodes(outputs)
    if len(shape) < 2 or not all(isinstance(d, int) for d in shape) or any(
            n.op in VIEWS for n in upstream):
        return False
    read = {u for n in upstream for u in n.inputs if u.producer is None}
    read.update(v for v in outputs if v.producer is None)
    tensors = [tensor_type(v) for v in read if isinstance(v.type, TensorType)]
    return all(t.shape == shape and t.is_dense for t in outs) and all(
        t.is_dense and (t.shape == shape or t.numel() == 1) for t in tensors)
