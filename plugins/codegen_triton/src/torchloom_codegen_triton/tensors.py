"""What the writer asks of every tensor it touches (its static type, its memory order).

Kept apart from kernel.py so that the helpers kernel.py calls (reduction, looped, split,
rowcol, tiled) can use them without importing the writer back (no import cycle).
"""

from __future__ import annotations

from torchloom.api import TensorType, Value

from torchloom_codegen_triton.indexing import Unsupported
from torchloom_codegen_triton.ops import STORAGE


def tensor_type(v: Value) -> TensorType:
    t = v.type
    if not isinstance(t, TensorType):
        raise Unsupported(f"%{v.name} is a scalar ({t.kind}); scalar group inputs are not "
                          f"supported")
    if not t.is_static:
        raise Unsupported(f"%{v.name} has a symbolic shape {list(t.shape)}")
    if t.dtype not in STORAGE:
        raise Unsupported(f"dtype {t.dtype} of %{v.name} is not supported")
    return t


def memory_order(t: TensorType) -> tuple[int, ...]:
    """Dims from outermost to innermost in memory (logical order among equal strides)."""
    strides = t.actual_strides()
    return tuple(sorted(range(len(t.shape)), key=lambda d: (-abs(strides[d]), d)))
