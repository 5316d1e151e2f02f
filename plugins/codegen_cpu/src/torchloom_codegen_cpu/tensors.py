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
    return indexing.checked_tensor_type(
        v, STORAGE, "only float, int and bool scalar inputs are supported")


#: dims from outermost to innermost in memory (the core's, which reduction nests use too)
memory_order = indexing.memory_order
