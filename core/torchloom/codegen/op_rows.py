"""Rows of the native codegens' pointwise tables that do not depend on the target.

- :class:`OpRow`: a pointwise op's row in a target's table (targets subclass it);
- :func:`comparisons`, :func:`alpha_rows` (add, sub, rsub with ``alpha``),
  :func:`clamp_rows` (eager's NaN bounds): rows a target spells with its own operators.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

#: comparison ops' names -> the operator (``aten.<name>.Tensor`` and ``.Scalar``)
COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


@attrs.frozen
class OpRow:
    """A pointwise op's row in a native codegen's table: ``template`` (``"{self} * {other}"``
    or a function giving it) and ``args`` (as ``OpTemplate``'s); targets subclass it."""

    template: Any
    args: str = "out"

    @staticmethod
    def resolve(template: Any, *given: Any) -> Any:
        """``template`` itself, or what it gives for ``given`` when it is a function."""
        return template(*given) if callable(template) else template


def comparisons(row: Callable[[str], Any]) -> dict[str, Any]:
    """Table rows of every comparison op: ``row(symbol)`` for ``aten.<cmp>.Tensor/Scalar``."""
    return {f"aten.{name}.{kind}": row(symbol) for name, symbol in COMPARISONS.items()
            for kind in ("Tensor", "Scalar")}


def alpha_rows(other: str = "{other}", fused: Callable[[str, str, str], str] | None = None
               ) -> dict[str, Callable[..., str]]:
    """Templates (functions of the op's attributes) of add, sub and rsub (``.Tensor`` and
    ``.Scalar``), ``other`` spelling the second operand: ``self + other * alpha``.
    ``fused(a, b, c)`` spells ``a * b + c`` rounded once: given, ``other`` times an alpha
    other than 1 is added in one rounding, as eager's vectorized kernels do
    (``vec::fmadd(other, alpha, self)``: ``x + y * 2`` of -3e38 and 3e38 is 3e38, not inf;
    eager's scalar loop over the last elements of a row shorter than two vectors rounds
    twice, a number times alpha there rounded first)."""
    def binary(sign: str) -> Callable[..., str]:
        def template(a: Mapping[str, Any], *_) -> str:
            if a.get("alpha", 1) == 1:
                return f"{{self}} {sign} {other}"
            if fused is not None:
                return fused(other, "{alpha}" if sign == "+" else "-({alpha})", "{self}")
            return f"{{self}} {sign} {other} * {{alpha}}"
        return template

    def rsub(a: Mapping[str, Any], *_) -> str:
        if a.get("alpha", 1) == 1:
            return "{other} - {self}"
        return ("{other} - {self} * {alpha}" if fused is None
                else fused("{self}", "-({alpha})", "{other}"))

    rows = {f"aten.{name}.{kind}": binary(sign) for name, sign in (("add", "+"), ("sub", "-"))
            for kind in ("Tensor", "Scalar")}
    return rows | {"aten.rsub.Scalar": rsub, "aten.rsub.Tensor": rsub}


def clamp_rows(select: Callable[[str, str, str], str]) -> dict[str, Any]:
    """Templates of clamp, clamp_min and clamp_max, with bounds given as numbers or as
    tensors (the ``.Tensor`` overloads: the bounds are operands, converted to the result's
    dtype like ``self``); ``select(cond, a, b)`` spells a choice. A NaN compares false both
    ways, so it passes through as in eager; a NaN bound gives NaN, as in eager (a
    comparison with it alone would ignore it); a minimum above the maximum gives the
    maximum, as in eager."""
    low = select("{min} != {min}", "{min}", select("{x} < {min}", "{min}", "{x}"))
    high = select("{max} != {max}", "{max}", select("{x} > {max}", "{max}", "{x}"))

    def clamp(a: Mapping[str, Any], *_) -> str:
        out = "{self}"
        if a.get("min") is not None:
            out = low.replace("{x}", out)
        if a.get("max") is not None:
            out = high.replace("{x}", out)
        return out

    return {f"aten.{name}.{overload}": template for overload in ("default", "Tensor")
            for name, template in (("clamp", clamp),
                                   ("clamp_min", low.replace("{x}", "{self}")),
                                   ("clamp_max", high.replace("{x}", "{self}")))}
