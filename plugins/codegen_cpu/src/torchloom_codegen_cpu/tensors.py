"""What the writer asks of every tensor it touches: a type of known (int or symbolic)
sizes and a stored dtype.

Kept apart from kernel.py so that the helpers kernel.py calls (reduction, columns) can use
it without importing the writer back (no import cycle).
"""

from __future__ import annotations

from torchloom.api import TensorType, Value, indexing

from torchloom_codegen_cpu.ops import STORAGE

Unsupported = indexing.Unsupported


def tensor_type(v: Value) -> TensorType:
    t = v.type
    if not isinstance(t, TensorType):
        raise Unsupported(f"%{v.name} is a scalar ({t.kind}); only float, int and bool "
                          f"scalar inputs are supported")
    if None in t.shape or (t.strides is not None and None in t.strides):
        raise Unsupported(f"%{v.name} has a dim of unknown size {list(t.shape)}")
    if t.dtype not in STORAGE:
        raise Unsupported(f"dtype {t.dtype} of %{v.name} is not supported")
    return t
