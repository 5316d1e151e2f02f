"""C spellings of the codegen's dtypes and constants: storage and compute types, item
sizes, integer limits, and Python scalars as C literals."""

from __future__ import annotations

import math
import struct
from typing import Any

import torch
from torchloom.api import DTYPES, expr

#: IR dtype -> C type of the values in memory (bf16 and f16 as their bits; bool as a byte)
STORAGE = {"f64": "double", "f32": "float", "f16": "uint16_t", "bf16": "uint16_t",
           "i64": "int64_t", "i32": "int32_t", "i16": "int16_t", "i8": "int8_t",
           "u8": "uint8_t", "b8": "uint8_t"}
ITEMSIZE = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1,
            "u8": 1, "b8": 1}
#: compute dtype -> C type
CTYPE = {"f64": "double", "f32": "float", "i64": "int64_t", "i32": "int32_t",
         "i16": "int16_t", "i8": "int8_t", "u8": "uint8_t", "b8": "_Bool"}


def literal(value: Any, dtype: str) -> expr.Literal:
    """A Python scalar as a C constant of compute dtype ``dtype`` (non-finite included)."""
    return expr.Literal(_constant(value, dtype), value)


def _constant(value: Any, dtype: str) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if dtype in ("f32", "f64"):
        ctype = CTYPE[dtype]
        if isinstance(value, float) and math.isnan(value):
            return f"(({ctype})NAN)"
        if isinstance(value, float) and math.isinf(value):
            return f"(({ctype})INFINITY)" if value > 0 else f"(-({ctype})INFINITY)"
        if isinstance(value, int):
            return (f"(({ctype}){value}.0)" if abs(value) < 2 ** 53
                    else f"(({ctype}){int_constant(value)})")
        return f"(({ctype}){value!r})"
    if isinstance(value, float):
        raise TypeError(f"float attribute {value!r} in an integer computation")
    if isinstance(value, int):  # converted to the tensor's type (wrapping), as eager does
        return f"(({CTYPE[dtype]}){int_constant(value)})"
    raise TypeError(f"attribute value {value!r} is not a scalar")


def int_constant(value: int) -> str:
    """``value`` as a C integer constant: ``long long`` where it fits (the most negative
    one spelt without overflowing a literal), ``unsigned long long`` up to 2**64."""
    if value == -2 ** 63:
        return "(-9223372036854775807LL - 1)"
    return f"{value}LL" if -2 ** 63 < value < 2 ** 63 else f"{value}ULL"


#: integer compute dtype -> its C limits (lowest, highest)
INT_LIMITS = {"i64": ("INT64_MIN", "INT64_MAX"), "i32": ("INT32_MIN", "INT32_MAX"),
              "i16": ("INT16_MIN", "INT16_MAX"), "i8": ("INT8_MIN", "INT8_MAX"),
              "u8": ("0", "UINT8_MAX"), "b8": ("0", "1")}


def signed_range(dtype: str) -> tuple[int, int] | None:
    """The range of a signed integer IR dtype (``i64``, ``i32``, ``i16``, ``i8``), else None."""
    if dtype not in INT_LIMITS or dtype in ("u8", "b8"):
        return None
    info = torch.iinfo(DTYPES[dtype])
    return info.min, info.max


def round_to(value: float, dtype: str) -> float:
    """``value`` rounded to bf16 or f16 (to nearest, ties to even; through float32 first,
    as c10 converts a double)."""
    try:
        single = struct.pack("<f", value)
        if dtype == "f16":
            return struct.unpack("<e", struct.pack("<e", struct.unpack("<f", single)[0]))[0]
    except OverflowError:  # beyond the type's range (or float32's): inf, as c10 gives
        return math.copysign(math.inf, value)
    (bits,) = struct.unpack("<I", single)
    if math.isnan(value) or math.isinf(value):
        return value
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]
