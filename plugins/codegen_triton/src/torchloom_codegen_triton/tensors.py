"""What the writer asks of every tensor it touches (its static type, its memory order).

Kept apart from kernel.py so that the helpers kernel.py calls (reduction, looped, split,
rows_and_columns, tiles) can use them without importing the writer back (no import cycle).
"""

from __future__ import annotations

from torchloom.api import TensorType, Value, indexing, symbols, writer

from torchloom_codegen_triton.ops import STORAGE


def tensor_type(v: Value) -> TensorType:
    """``v``'s tensor type; sizes may be symbolic (the kernel takes them as arguments)."""
    return indexing.checked_tensor_type(v, STORAGE, "scalar group inputs are not supported")


def memory_order(t: TensorType) -> tuple[int, ...]:
    """Dims from outermost to innermost in memory (logical order among equal strides);
    symbolic strides are ordered by their value at a point where every size is > 1."""
    strides = t.actual_strides()
    if strides is None:  # contiguous, with symbolic sizes
        return tuple(range(len(t.shape)))
    key = [at_point(s) for s in strides]
    return tuple(sorted(range(len(t.shape)), key=lambda d: (-abs(key[d]), d)))


same_shape = writer.same_shape


def at_point(dim) -> int:
    """``dim``'s value where every size is a distinct number > 1000 (orders dims)."""
    if isinstance(dim, int):
        return dim
    return symbols.evaluate(dim, {s: 1021 + 2 * k for k, s in enumerate(
        sorted(symbols.symbols_of(dim)))})
