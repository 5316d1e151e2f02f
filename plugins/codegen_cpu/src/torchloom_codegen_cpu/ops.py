"""Op tables: aten op -> C expression template (pointwise), index rule (views) and
reduction kind. Tables, not if-chains: adding an op is adding a row.

A pointwise template is a format string over the op's tensor inputs and attributes by
schema name (``{self}``, ``{other}``, ``{alpha}``...). ``$T`` is the C type the op computes
in (``float`` or ``double`` for floats) and ``$f`` the libm suffix (``expf`` vs ``exp``), so
one row serves f32 and f64; ``$exp`` and ``$erf`` are the prelude's inline f32 versions
(``tl_exp``, within 1.03 ulp; ``tl_erf_fast``, GELU's gradient's; f32 GELU itself is
one of ``GELU_FORMS``, the one eager's kernel is on this CPU) and libm's in f64; constants are
written ``(($T)0.797...)`` so f32 code never computes in double. ``args`` says which dtype the inputs are converted to first: ``"out"``
(the compute dtype of the result), ``"promote"`` (the promoted input dtype, comparisons),
``"keep"`` (as they are), ``"where"`` (condition as bool, the rest as the result) or
``"cast"`` (an explicit conversion the emitter rounds). ``ints`` is the template for
integer and bool results (None: floats only; the group is declined for ints).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from torchloom.api import DTYPES, InputRef, Unsupported, expr, op_rows, reductions, stmt, writer

from torchloom_codegen_cpu import int_division
from torchloom_codegen_cpu.constants import (  # noqa: F401 (re-exported)
    CTYPE, INT_LIMITS, ITEMSIZE, STORAGE, literal, round_to)
from torchloom_codegen_cpu.libmvec import VECTOR_MATH
from torchloom_codegen_cpu.logit import logit, logit_backward

COMPUTE, FLOATS, VIEWS = writer.COMPUTE, writer.FLOATS, writer.VIEWS


#: a template, or a function of the op's attributes and its result's IR dtype giving one
Template = str | Callable[[Mapping[str, Any], str], str]


@attrs.frozen
class Pointwise(op_rows.OpRow):
    """An op's row: ``template`` for float results (None: none), ``ints`` for integer and
    bool ones (None: none)."""

    template: Template | None
    args: str = "out"
    ints: Template | None = None

    def template_for(self, attrs_: Mapping[str, Any], dtype: str, ir_dtype: str,
                     exp: str = "tl_exp") -> str | None:
        """The template for compute dtype ``dtype`` and result ``ir_dtype`` (None:
        unsupported for it); ``exp``: the prelude's f32 exp it calls (``tl_exp_nonpos``
        where every argument is <= 0)."""
        tpl = self.template if dtype in ("f32", "f64") else self.ints
        if tpl is None:
            return None
        tpl = self.resolve(tpl, attrs_, ir_dtype)
        if tpl is None:  # (a template function declining this dtype)
            return None
        if dtype in ("f32", "f64"):
            tpl = tpl.replace("$erf", "tl_erf_fast" if dtype == "f32" else "erf")
            tpl = tpl.replace("$exp", exp if dtype == "f32" else "exp")
            tpl = tpl.replace("$tanh", "tl_tanh" if dtype == "f32" else "tanh")
            tpl = tpl.replace("$T", CTYPE[dtype]).replace("$f", "f" if dtype == "f32" else "")
        return tpl


def _both(template: Template, args: str = "out") -> Pointwise:
    return Pointwise(template, args, template)


def _pow(a: Mapping[str, Any], dtype: str = "f32") -> str:
    # eager's own cases (rsqrt for -0.5: -0.0 gives -inf and -inf NaN, where pow gives
    # inf and 0)
    known = {2: "{self} * {self}", 3: "{self} * {self} * {self}", 1: "{self}",
             0.5: "sqrt$f({self})", -0.5: "($T)1 / sqrt$f({self})", -1: "($T)1 / {self}",
             -2: "($T)1 / ({self} * {self})", 0: "($T)1"}
    if dtype == "f16":  # eager's f16 kernel calls pow itself: pow(-inf, 0.5) is inf
        # (libmvec's vector powf gives NaN there, its scalar powf inf: said outright)
        # (and the vector powf of -0.0 gave -0.0 where eager's gives 0.0)
        known[0.5] = ("({self} == -($T)INFINITY ? ($T)INFINITY : {self} == 0 ? ($T)0 : "
                      "pow$f({self}, ($T)0.5))")
        del known[-0.5]
    exponent = a["exponent"]
    if exponent in known:
        return known[exponent]
    if dtype in ("bf16", "f16") and isinstance(exponent, float):
        # eager converts the exponent to the tensor's type first (1/3 -> 0.333984375)
        return f"pow$f({{self}}, {literal(round_to(exponent, dtype), 'f32')})"
    return "pow$f({self}, {exponent})"


def _div_mode(a: Mapping[str, Any], dtype: str = "f32") -> str:
    """Eager divides bf16/f16 in their own type: trunc of the quotient rounded to it, and
    floor division with every step rounded (prelude.py, TL_DIV_FLOOR_LOW)."""
    if dtype in ("bf16", "f16"):
        return {None: "{self} / {other}",
                "trunc": f"truncf(tl_round_{dtype}({{self}} / {{other}}))",
                "floor": f"tl_div_floor_{dtype}({{self}}, {{other}})"}[a.get("rounding_mode")]
    return {None: "{self} / {other}", "trunc": "trunc$f({self} / {other})",
            "floor": "tl_div_floor$f({self}, {other})"}[a.get("rounding_mode")]


SQRT1_2 = "(($T)0.70710678118654752440)"
SQRT_2_PI = "(($T)0.79788456080286535588)"   # sqrt(2 / pi)
INV_SQRT_2PI = "(($T)0.39894228040143267794)"  # 1 / sqrt(2 pi)


def _gelu(a: Mapping[str, Any], dtype: str = "f32") -> str:
    if a.get("approximate", "none") == "tanh":
        return (f"($T)0.5 * {{self}} * (($T)1 + $tanh({SQRT_2_PI} * ({{self}} + "
                f"(($T)0.044715) * {{self}} * {{self}} * {{self}})))")
    exact = f"($T)0.5 * {{self}} * (($T)1 + $erf({{self}} * {SQRT1_2}))"
    if dtype in ("f32", "bf16"):
        return f"{eager_gelu_form(dtype)}({{self}})"  # the vectorized f32 GELU eager runs
    if dtype == "f16" and eager_gelu_form("f16") == "tl_gelu_f32":  # its f32 one, rounded
        return "tl_gelu_f32({self})"
    return exact


#: the prelude's f32 GELUs, by how eager's vectorized kernels treat special values
#: (prelude.py): NaN at +inf and 0.5 applied last (inf above FLT_MAX / 2), seen on CPUs
#: with AVX-512; x / 2 * erf + x / 2 (+0.0 at large negative x), eager's f32 on AVX2;
#: x / 2 * (1 + erf) (-0.0 there), its bf16 and f16 on AVX2
GELU_FORMS = ("tl_gelu_f32", "tl_gelu_f32_fma", "tl_gelu_f32_half_first")


@functools.cache
def eager_gelu_form(dtype: str) -> str:
    """Which of :data:`GELU_FORMS` eager's vectorized GELU of ``dtype`` computes on this CPU,
    told by its values at +inf and -100 (whole vectors: eager's scalar tail, the last
    elements of a tensor, differs). Real tensors even when asked while torch traces with
    fake tensors (a GELU met first under torch.compile: its group was declined,
    DataDependentOutputException)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily(), torch.no_grad():
        x = torch.tensor([math.inf, -100.0] * 128, dtype=DTYPES[dtype])
        at_inf, negative = torch.nn.functional.gelu(x)[:2].float().tolist()
    if math.isnan(at_inf):
        return "tl_gelu_f32"
    return "tl_gelu_f32_fma" if math.copysign(1.0, negative) > 0 else "tl_gelu_f32_half_first"


def _gelu_backward(a: Mapping[str, Any], dtype: str = "f32") -> str:
    if a.get("approximate", "none") == "tanh":
        inner = (f"$tanh({SQRT_2_PI} * ({{self}} + (($T)0.044715) * {{self}} * {{self}} * "
                 f"{{self}}))")
        return (f"{{grad_output}} * (($T)0.5 * (($T)1 + T_) + ($T)0.5 * {{self}} * "
                f"(($T)1 - T_ * T_) * {SQRT_2_PI} * (($T)1 + (($T)0.134145) * {{self}} * "
                f"{{self}}))").replace("T_", inner)
    return (f"{{grad_output}} * (($T)0.5 * (($T)1 + $erf({{self}} * {SQRT1_2})) + "
            f"{{self}} * $exp(($T)-0.5 * {{self}} * {{self}}) * {INV_SQRT_2PI})")


def _erf(a: Mapping[str, Any], dtype: str = "f32") -> str:
    return "tl_erf_as({self})" if dtype in ("bf16", "f16") else "erf$f({self})"


def _tanh(a: Mapping[str, Any], dtype: str = "f32") -> str:
    """f32 (and bf16/f16, computed in f32): the prelude's ``tl_tanh``. f64: libm's, whose
    tanh is 1 ulp off at small arguments (glibc's scalar tanh like its tanhf(1.52e-6): x + 1
    ulp) where eager's is x: then x - tanh(x) has the wrong sign. Below 2^-13 tanh(x) is
    x - x^3/3 to within 2^-55 of x, one rounding: correctly rounded but for ties; the sign
    is x's (tanh is odd: -0.0 stays -0.0, the sum alone would give +0.0). tl_tanh does the
    same below 2^-8."""
    if dtype != "f64":
        return "tl_tanh({self})"
    return ("copysign(fabs({self}) < 0x1p-13 ? tl_fma({self}, {self} * {self} * "
            "((double)-1 / (double)3), {self}) : tanh({self}), {self})")


def _unary(floats: str, ints: str | None = None) -> Pointwise:
    return Pointwise(floats.replace("X", "{self}"), "out",
                     ints.replace("X", "{self}") if ints is not None else None)


def _special(template: str) -> Pointwise:
    """A special function's row (special.py): f32, f64 and bf16; f16 left to eager, whose
    f16 kernels of these compute in half precision step by step (i0e(0.001) is 0.99756
    there, 0.99902 rounded from f32): a group computing one in f16 is declined, said so."""
    text = template.replace("X", "{self}")

    def build(a: Mapping[str, Any], dtype: str = "f32") -> str:
        if dtype == "f16":
            raise Unsupported("special functions (lgamma, digamma, erfinv, entr, xlog1py, "
                              "i0, i0e, i1, i1e) in f16 are left to eager, whose f16 "
                              "kernels compute them in half precision step by step")
        return text
    return Pointwise(build)


_MAXIMUM = "({self} > {other} || {self} != {self}) ? {self} : {other}"
_MINIMUM = "({self} < {other} || {self} != {self}) ? {self} : {other}"

def _num(a: Mapping[str, Any], name: str, default: float, dtype: str) -> str:
    """Attribute ``name`` as C text for a result of IR dtype ``dtype``: its value (the
    schema's default when absent, which the IR leaves out), or the ``{name}`` placeholder
    when a graph value gives it."""
    value = a.get(name)
    if value is None:
        value = default
    if not isinstance(value, (bool, int, float)) or isinstance(value, InputRef):
        return f"{{{name}}}"
    if COMPUTE.get(dtype) in ("f32", "f64"):
        return f"($T){literal(float(value), 'f64')}"
    return literal(int(value), COMPUTE.get(dtype, "i64")).text


def _with(template: str, **defaults: float) -> Callable[[Mapping[str, Any], str], str]:
    """A template whose ``{attr}`` fields take the attributes' values or these defaults."""
    def build(a: Mapping[str, Any], dtype: str = "f32") -> str:
        text = template
        for name, default in defaults.items():
            text = text.replace(f"{{{name}}}", _num(a, name, default, dtype))
        return text
    return build


#: eager's elu_kernel: expm1 of the scaled input times alpha * scale at or below 0
_elu = _with("({self} <= 0 ? expm1$f({self} * {input_scale}) * ({alpha} * {scale}) : "
             "{self} * {scale})", alpha=1.0, scale=1.0, input_scale=1.0)


def _nan_to_num(a: Mapping[str, Any], dtype: str = "f32") -> str:
    """NaN -> ``nan`` (0), +-inf -> ``posinf`` / ``neginf`` (the type's largest finite
    values by default, as eager)."""
    largest = {"f64": "DBL_MAX", "f32": "FLT_MAX", "bf16": "3.38953139e38f",
               "f16": "65504.0f"}.get(dtype, "FLT_MAX")
    value = {k: (literal(a[k], "f64") if a.get(k) is not None else None)
             for k in ("nan", "posinf", "neginf")}
    nan = value["nan"] or "0"
    pos = value["posinf"] or f"(($T){largest})"
    neg = value["neginf"] or f"(-($T){largest})"
    return (f"({{self}} != {{self}} ? ($T){nan} : {{self}} == ($T)INFINITY ? ($T){pos} : "
            f"{{self}} == -($T)INFINITY ? ($T){neg} : {{self}})")


#: a NaN bound gives NaN, as eager
_HARDTANH = ("({min_val} != {min_val} ? {min_val} : {max_val} != {max_val} ? {max_val} : "
             "{self} < {min_val} ? {min_val} : {self} > {max_val} ? {max_val} : {self})")
#: NaN and -0.0 give 0, as eager
_SIGN = Pointwise("(($T)({self} > 0) - ($T)({self} < 0))", "out",
                  "(({self} > 0) - ({self} < 0))")
#: eager's vectorized lerp: fmadd(w, end - self, self), or fmadd(w - 1, end - self, end)
#: from a weight of 0.5 in magnitude (the latter's scalar form: end - (end - self) (1 - w))
_LERP = Pointwise("(fabs$f({weight}) < ($T)0.5 ? tl_fma$f({weight}, {end} - {self}, {self}) : "
                  "tl_fma$f({weight} - ($T)1, {end} - {self}, {end}))")
#: special functions (special.py: written from the mathematics, within a few ulp of
#: eager's), f16 left to eager (:func:`_special`)
_SPECIALS = {
    "aten.lgamma.default": "lgamma$f(X)",
    "aten.digamma.default": "tl_digamma$f(X)",
    "aten.erfinv.default": "tl_erfinv$f(X)",
    "aten.i0.default": "tl_i0$f(X)",
    **{f"aten.special_{f}.default": f"tl_{f}$f(X)" for f in ("i0e", "i1", "i1e")},
    "aten.special_entr.default":
        "(X != X ? X : X > 0 ? -X * log$f(X) : X == 0 ? ($T)0 : -($T)INFINITY)",
    **{f"aten.special_xlog1py.{k}":
       "({other} != {other} ? {other} : X == 0 ? ($T)0 : X * log1p$f({other}))"
       for k in ("default", "self_scalar", "other_scalar")},
}
#: the ops whose f16 groups are declined on purpose
F16_TO_EAGER = frozenset(_SPECIALS)

#: activations and other pointwise ops of models and optimizers, by eager's CPU kernels:
#: NaN passes through comparisons as eager's do (checked by tests/codegen_cpu/test_ops.py
#: on NaN, +-inf, -0.0 and denormals for every dtype)
ACTIVATIONS: dict[str, Pointwise] = {
    "aten.sign.default": _SIGN,
    "aten.sgn.default": _SIGN,
    "aten.leaky_relu.default": Pointwise(_with(
        "({self} > 0 ? {self} : {self} * {negative_slope})", negative_slope=0.01)),
    "aten.hardtanh.default": _both(_with(_HARDTANH, min_val=-1.0, max_val=1.0)),
    "aten.relu6.default": _both(_HARDTANH.replace("{min_val}", "0").replace(
        "{max_val}", "6")),
    "aten.elu.default": Pointwise(_elu),
    "aten.selu.default": Pointwise(
        "({self} <= 0 ? expm1$f({self}) * (($T)1.6732632423543772 * ($T)1.0507009873554805)"
        " : {self} * ($T)1.0507009873554805)"),
    "aten.celu.default": Pointwise(_with(
        "({self} <= 0 ? expm1$f({self} * (($T)1 / {alpha})) * {alpha} : {self})", alpha=1.0)),
    "aten.softplus.default": Pointwise(_with(
        "({self} * {beta} > {threshold} ? {self} : log1p$f(exp$f({self} * {beta})) / {beta})",
        beta=1.0, threshold=20.0)),
    "aten.hardsigmoid.default": Pointwise(
        "({self} != {self} ? {self} : ({self} + ($T)3 < 0 ? ($T)0 : {self} + ($T)3 > 6 ? "
        "($T)6 : {self} + ($T)3) / ($T)6)"),
    "aten.mish.default": Pointwise("{self} * tanh$f(log1p$f(exp$f({self})))"),
    "aten.softshrink.default": Pointwise(_with(
        "({self} > {lambd} ? {self} - {lambd} : {self} < -{lambd} ? {self} + {lambd} : "
        "{self} * ($T)0)", lambd=0.5)),
    "aten.hardshrink.default": Pointwise(_with(
        "({self} >= -{lambd} && {self} <= {lambd} ? ($T)0 : {self})", lambd=0.5)),
    "aten.frac.default": _unary("X - trunc$f(X)"),
    "aten.square.default": _both("{self} * {self}"),
    "aten.sinh.default": _unary("sinh$f(X)"),
    "aten.cosh.default": _unary("cosh$f(X)"),
    "aten.asinh.default": _unary("asinh$f(X)"),
    "aten.acosh.default": _unary("acosh$f(X)"),
    "aten.atanh.default": _unary("atanh$f(X)"),
    # eager multiplies by the double constant converted to the tensor's compute type
    "aten.deg2rad.default": _unary("X * (($T)0.017453292519943295)"),
    "aten.rad2deg.default": _unary("X * (($T)57.295779513082323)"),
    # eager's: 1 at 0, else sin(pi x) / (pi x) with pi x rounded to the compute type
    "aten.sinc.default": _unary("(X == 0 ? ($T)1 : sin$f(($T)3.14159265358979323846 * X) / "
                                "(($T)3.14159265358979323846 * X))"),
    # eager's: an infinity added to itself is itself (inf - inf would be NaN)
    "aten.logaddexp.default": Pointwise(
        "({self} == {other} && isinf({self}) ? {self} : ({self} > {other} ? {self} : {other})"
        " + log1p$f($exp(-fabs$f({self} - {other}))))"),
    "aten.atan.default": _unary("atan$f(X)"),
    "aten.asin.default": _unary("asin$f(X)"),
    "aten.acos.default": _unary("acos$f(X)"),
    "aten.erfc.default": _unary("erfc$f(X)"),
    **{op: _special(template) for op, template in _SPECIALS.items()},
    "aten.logit.default": Pointwise(logit),
    "aten.logit_backward.default": Pointwise(logit_backward),
    "aten.nan_to_num.default": Pointwise(_nan_to_num, "out", "{self}"),
    "aten.isinf.default": Pointwise("({self} == INFINITY || {self} == -INFINITY)", "keep",
                                    "0"),
    "aten.isposinf.default": Pointwise("({self} == INFINITY)", "keep", "0"),
    "aten.isneginf.default": Pointwise("({self} == -INFINITY)", "keep", "0"),
    "aten.isfinite.default": Pointwise("({self} - {self} == 0)", "keep", "1"),
    # (the bits: gcc 12 hit an internal error vectorizing signbit() of a widened bf16)
    "aten.signbit.default": Pointwise("tl_signbit$f({self})", "keep", "({self} < 0)"),
    # integers: by a Python int only (int_division.py)
    "aten.fmod.Tensor": Pointwise("fmod$f({self}, {other})", "out", int_division.template("fmod")),
    "aten.fmod.Scalar": Pointwise("fmod$f({self}, {other})", "out", int_division.template("fmod")),
    "aten.remainder.Tensor": Pointwise("tl_remainder$f({self}, {other})", "out",
                                       int_division.template("remainder")),
    "aten.remainder.Scalar": Pointwise("tl_remainder$f({self}, {other})", "out",
                                       int_division.template("remainder")),
    "aten.copysign.Tensor": Pointwise("copysign$f({self}, {other})"),
    "aten.copysign.Scalar": Pointwise("copysign$f({self}, {other})"),
    "aten.atan2.default": Pointwise("atan2$f({self}, {other})"),
    "aten.hypot.default": Pointwise("hypot$f({self}, {other})"),
    "aten.xlogy.Tensor": Pointwise(
        "({other} != {other} ? {other} : {self} == 0 ? ($T)0 : {self} * log$f({other}))"),
    "aten.heaviside.default": _both("({self} == 0 ? {values} : ({self} > 0))"),
    "aten.logical_xor.default": _both("(({self} != 0) != ({other} != 0))", args="keep"),
    "aten.bitwise_xor.Tensor": Pointwise(None, "out", "{self} ^ {other}"),
    "aten.bitwise_not.default": Pointwise(
        None, "out", lambda a, dtype: "!{self}" if dtype == "b8" else "~{self}"),
    # eager's self + value * t1 * t2, the last product fused with the sum (as gcc builds it)
    "aten.addcmul.default": Pointwise(_with("tl_fma$f({value} * {tensor1}, {tensor2}, {self})",
                                            value=1.0)),
    # eager's order: (value * tensor1) / tensor2
    "aten.addcdiv.default": Pointwise(_with("{self} + {value} * {tensor1} / {tensor2}",
                                            value=1.0)),
    "aten.lerp.Scalar": _LERP,
    "aten.lerp.Tensor": _LERP,
}

#: add, sub and rsub: floats fused as eager's vector loop (tl_fma), integers as written
_ALPHA_FLOATS = op_rows.alpha_rows(fused=lambda a, b, c: f"tl_fma$f({a}, {b}, {c})")
_ALPHA_INTS = op_rows.alpha_rows()

POINTWISE: dict[str, Pointwise] = {
    **{op: Pointwise(_ALPHA_FLOATS[op], "out", _ALPHA_INTS[op]) for op in _ALPHA_INTS},
    "aten.mul.Tensor": _both("{self} * {other}"),
    "aten.mul.Scalar": _both("{self} * {other}"),
    "aten.div.Tensor": Pointwise("{self} / {other}"),  # int inputs divide as floats
    "aten.div.Scalar": Pointwise("{self} / {other}"),
    "aten.true_divide.Tensor": Pointwise("{self} / {other}"),  # div's alias (HF GPT-2)
    # integers: by a Python int only (int_division.py: eager raises on a zero divisor)
    "aten.div.Tensor_mode": Pointwise(_div_mode, "out", int_division.template("mode")),
    "aten.neg.default": _unary("-X", "-X"),
    "aten.abs.default": _unary("fabs$f(X)", "(X < 0 ? -X : X)"),
    "aten.exp.default": _unary("$exp(X)"),
    "aten.exp2.default": _unary("exp2$f(X)"),
    "aten.expm1.default": _unary("expm1$f(X)"),
    "aten.log.default": _unary("log$f(X)"),
    "aten.log2.default": _unary("log2$f(X)"),
    "aten.log10.default": _unary("log10$f(X)"),
    "aten.log1p.default": _unary("log1p$f(X)"),
    "aten.sqrt.default": _unary("sqrt$f(X)"),
    "aten.rsqrt.default": _unary("($T)1 / sqrt$f(X)"),
    "aten.reciprocal.default": _unary("($T)1 / X"),
    "aten.sin.default": _unary("sin$f(X)"),
    "aten.cos.default": _unary("cos$f(X)"),
    "aten.tan.default": _unary("tan$f(X)"),
    "aten.tanh.default": Pointwise(_tanh),
    "aten.erf.default": Pointwise(_erf),
    "aten.sigmoid.default": _unary("($T)1 / (($T)1 + $exp(-X))"),
    "aten.silu.default": _unary("X / (($T)1 + $exp(-X))"),
    "aten.relu.default": _unary("(X < 0 ? 0 : X)", "(X < 0 ? 0 : X)"),  # keeps NaN and -0.0
    "aten.gelu.default": Pointwise(_gelu),
    "aten.floor.default": _unary("floor$f(X)", "X"),
    "aten.ceil.default": _unary("ceil$f(X)", "X"),
    "aten.trunc.default": _unary("trunc$f(X)", "X"),
    "aten.round.default": _unary("nearbyint$f(X)", "X"),  # halves to even, as eager
    "aten.pow.Tensor_Scalar": Pointwise(_pow),
    "aten.pow.Tensor_Tensor": Pointwise("pow$f({self}, {exponent})"),
    "aten.pow.Scalar": Pointwise("pow$f({self}, {exponent})"),  # a number to a tensor's powers
    # eager's g * (1 - y * y), its 1 - y * y fused (as gcc builds it)
    "aten.tanh_backward.default": Pointwise(
        "{grad_output} * tl_fma$f(-{output}, {output}, ($T)1)"),
    "aten.sigmoid_backward.default": Pointwise(
        "{grad_output} * (($T)1 - {output}) * {output}"),
    "aten.threshold_backward.default": _both("({self} <= {threshold} ? 0 : {grad_output})"),
    "aten.gelu_backward.default": Pointwise(_gelu_backward),
    # eager's dy * s * (1 + x * (1 - s)), s = 1 / (1 + exp(-x)) (the sigmoid's own spelling)
    "aten.silu_backward.default": Pointwise(
        "{grad_output} * S_ * (($T)1 + {self} * (($T)1 - S_))".replace(
            "S_", "(($T)1 / (($T)1 + $exp(-{self})))")),
    "aten.maximum.default": _both(_MAXIMUM),
    "aten.minimum.default": _both(_MINIMUM),
    **{op: _both(template) for op, template in op_rows.clamp_rows(
        lambda cond, a, b: f"({cond} ? {a} : {b})").items()},
    "aten.where.self": _both("({condition} ? {self} : {other})", args="where"),
    # the mask converted to the result's type (0 or 1) like every input of an "out" op
    "aten.masked_fill.Scalar": _both("({mask} != 0 ? {value} : {self})"),
    "aten.native_dropout_backward.default": Pointwise("{grad_output} * {mask} * {scale}"),
    **op_rows.comparisons(lambda sym: _both(f"{{self}} {sym} {{other}}", args="promote")),
    "aten.isnan.default": _both("{self} != {self}", args="keep"),
    "aten.logical_not.default": _both("!{self}", args="keep"),
    "aten.logical_and.default": _both("({self} != 0) & ({other} != 0)", args="keep"),
    "aten.logical_or.default": _both("({self} != 0) | ({other} != 0)", args="keep"),
    "aten.bitwise_and.Tensor": Pointwise(None, "out", "{self} & {other}"),
    "aten.bitwise_or.Tensor": Pointwise(None, "out", "{self} | {other}"),
    "aten.clone.default": _both("{self}", args="keep"),
    "aten.full_like.default": _both("{fill_value}"),  # fusion admits plain fills only
    "aten.alias.default": _both("{self}", args="keep"),
    "aten.detach.default": _both("{self}", args="keep"),
    **ACTIVATIONS,
    # a cast: the emitter converts (and rounds) to the result's dtype
    "aten._to_copy.default": _both("{self}", args="cast"),
    "prims.convert_element_type.default": _both("{a}", args="cast"),
}

#: ops worth keeping in a row buffer rather than computing twice (kernel._plan_buffers)
EXPENSIVE = frozenset(f"aten.{name}.default" for name in (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "tanh",
    "erf", "sigmoid", "silu", "silu_backward", "gelu", "gelu_backward")) | {
        "aten.pow.Tensor_Tensor"}

def _calls_vector_math(op: str) -> bool:
    """Whether ``op``'s C text may call a :data:`VECTOR_MATH` function (its f64 text, where
    ``$exp``, ``$erf`` and ``$tanh`` are libm's; a template function that cannot be asked
    without the op's attributes counts as one that may)."""
    try:
        text = POINTWISE[op].template_for({}, "f64", "f64")
    except Exception:  # (a template function reading attributes it was not given)
        return True
    return text is not None and not stmt.lexed(text).calls.isdisjoint(VECTOR_MATH)


#: ops whose result a SIMD loop (libmvec's lanes) and a scalar one may round differently
#: where the compiler maps libm's calls itself (clang; gcc's kernels get one value,
#: libmvec.py)
LIBM_VECTOR = EXPENSIVE | frozenset(op for op in POINTWISE if _calls_vector_math(op))


REDUCTIONS = reductions.reduction_table("sqrt$f({x})")

#: per reduction kind: identity (float, int) and the OpenMP reduction operator
IDENTITY = {"sum": ("0", "0"), "prod": ("1", "1"), "max": ("-INFINITY", "{min}"),
            "min": ("INFINITY", "{max}")}
OMP_OP = {"sum": "+", "prod": "*", "max": "max", "min": "min"}
