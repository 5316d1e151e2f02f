"""logit and its gradient as eager's CPU kernels compute them (``logit_kernel``,
``logit_backward_kernel``'s vectorized form): bounds in the tensor's type, and in bf16/f16
every step rounded to the type (``Vectorized<BFloat16>`` operations)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torchloom_codegen_cpu.constants import literal, round_to


def _bounds(a: Mapping[str, Any], dtype: str) -> tuple[str, str] | None:
    """(lo, hi) of ``eps`` as C constants of the computing type: eps and 1 - eps, both
    in the tensor's type (None: no eps)."""
    if a.get("eps") is None:
        return None
    eps = float(a["eps"])
    if dtype in ("bf16", "f16"):
        lo = round_to(eps, dtype)
        return f"($T){literal(lo, 'f64')}", f"($T){literal(round_to(1 - lo, dtype), 'f64')}"
    lo_c = f"($T){literal(eps, 'f64')}"
    return lo_c, f"(($T)1 - {lo_c})"


def _rounding(dtype: str) -> Callable[[str], str]:
    low = dtype in ("bf16", "f16")
    return lambda text: f"tl_round_{dtype}({text})" if low else text


def logit(a: Mapping[str, Any], dtype: str = "f32") -> str:
    """x clamped to [eps, 1 - eps], then log(x / (1 - x))."""
    r, bounds, z = _rounding(dtype), _bounds(a, dtype), "{self}"
    if bounds is not None:
        lo, hi = bounds
        z = f"({{self}} < {lo} ? {lo} : {{self}} > {hi} ? {hi} : {{self}})"
    quotient = r(z + " / " + r("(($T)1 - " + z + ")"))
    return f"({z} == ($T)1 ? ($T)INFINITY : log$f({quotient}))"


def logit_backward(a: Mapping[str, Any], dtype: str = "f32") -> str:
    """dy / (x (1 - x)) where lo <= x <= hi, else NaN (no eps: [0, 1]) or 0 (eps): the
    vectorized kernel's ``blendv`` (x = -0.0 gives dy / -0.0 there, as here)."""
    r, bounds = _rounding(dtype), _bounds(a, dtype)
    lo, hi = bounds if bounds is not None else ("($T)0", "($T)1")
    outside = "($T)NAN" if bounds is None else "($T)0"
    value = r("{grad_output} / (" + r("{self} * " + r("(($T)1 - {self})")) + ")")
    return f"({{self}} >= {lo} && {{self}} <= {hi} ? {value} : {outside})"
