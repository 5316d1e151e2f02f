"""Integer division and remainder by a Python number: the ``ints`` templates of
``div.Tensor_mode`` (trunc, floor), ``remainder`` and ``fmod``.

Eager raises ``ZeroDivisionError`` when any divisor is 0, which a kernel cannot; a divisor
known when the kernel is written (a Python int, not 0, within the dtype's range) cannot be,
so only those get a template: a tensor divisor leaves the group to eager, which raises as
it should. Eager's results, C's ``/`` and ``%`` truncating: floor division is the quotient
less one where the remainder is nonzero and of the other sign than the divisor; Python's
remainder (``remainder``) is the C remainder plus the divisor there; ``fmod`` is C's. A
divisor of -1 is spelt apart: ``INT64_MIN / -1`` traps in C, where eager gives
``INT64_MIN`` (the negation, which ``-fwrapv`` wraps) and a remainder of 0. Unsigned and
bool results take none (eager converts a negative number to the unsigned type first)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torchloom.api import InputRef

from torchloom_codegen_cpu.constants import int_constant, signed_range


def divisor(a: Mapping[str, Any], dtype: str) -> int | None:
    """The op's divisor ``other`` where it is a Python int other than 0 within ``dtype``'s
    range (a signed integer dtype), else None."""
    b, within = a.get("other"), signed_range(dtype)
    if (within is None or isinstance(b, (bool, InputRef)) or not isinstance(b, int)
            or b == 0 or not within[0] <= b <= within[1]):
        return None
    return b


def template(kind: str) -> Callable[..., str | None]:
    """The ints template of ``kind``: ``trunc``, ``floor``, ``remainder``, ``fmod``, or
    ``mode`` (``div.Tensor_mode``: its ``rounding_mode`` says trunc or floor)."""
    def build(a: Mapping[str, Any], dtype: str = "i64") -> str | None:
        b = divisor(a, dtype)
        how = a.get("rounding_mode") if kind == "mode" else kind
        if b is None or how not in ("trunc", "floor", "remainder", "fmod"):
            return None
        if b == -1:
            return "-{self}" if how in ("trunc", "floor") else "({self} - {self})"
        c = f"({int_constant(b)})"
        other_sign = "< 0" if b > 0 else "> 0"  # a remainder of the other sign than b
        return {"trunc": f"{{self}} / {c}",
                "floor": f"({{self}} / {c} - ({{self}} % {c} {other_sign}))",
                "fmod": f"{{self}} % {c}",
                "remainder": f"({{self}} % {c} {other_sign} ? {{self}} % {c} + {c} : "
                             f"{{self}} % {c})"}[how]
    return build
