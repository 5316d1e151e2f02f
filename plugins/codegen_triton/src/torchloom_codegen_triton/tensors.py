"""What the writer asks of every tensor it touches (its static type, its memory order).

Kept apart from kernel.py so that the helpers kernel.py calls (reduction, looped, split,
rows_and_columns, tiles) can use them without importing the writer back (no import cycle).
"""

from __future__ import annotations

from torchloom.api import TensorType, Value, indexing, writer

from torchloom_codegen_triton.ops import STORAGE


def tensor_type(v: Value) -> TensorType:
    """``v``'s tensor type; sizes may be symbolic (the kernel takes them as arguments)."""
    return indexing.checked_tensor_type(v, STORAGE, "scalar group inputs are not supported")


#: dims from outermost to innermost in memory (logical order among equal strides; symbolic
#: strides ordered at the core's representative sizes, as the tile plan orders them)
memory_order = indexing.memory_order


same_shape = writer.same_shape
