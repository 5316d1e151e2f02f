"""The ``scalar_c`` renderer: its op table, how C spells values, and the C of a lowered
kernel (one function, scalar loops, no SIMD, no threads)."""

from __future__ import annotations

import math
from typing import Any

from torchloom.api import Capabilities, OpTemplate, indexing, op_rows, stmt

from torchloom_scalar_c.build import build, compiler_missing

#: compute dtype -> C type; IR dtype -> C type in memory (bf16 as its bits, bool a byte)
CTYPE = {"f64": "double", "f32": "float", "i64": "int64_t", "i32": "int32_t",
         "i16": "int16_t", "i8": "int8_t", "u8": "uint8_t", "b8": "_Bool"}
STORAGE = {**CTYPE, "bf16": "uint16_t", "b8": "uint8_t"}
_LIMITS = {"i64": "INT64", "i32": "INT32", "i16": "INT16", "i8": "INT8"}

PRELUDE = """#include <math.h>
#include <stdint.h>
#include <string.h>
static inline float sc_from_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t sc_to_bf16(float f) {  /* to nearest, ties to even */
  uint32_t u; memcpy(&u, &f, 4);
  if (f != f) return 0x7FC0;
  return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
static inline float sc_bf16(float f) { return sc_from_bf16(sc_to_bf16(f)); }
"""


def _c(text: str, ints: bool = False, args: str = "out") -> OpTemplate:
    """A row of the op table: ``$f`` is libm's suffix (``expf`` for f32), ``$T`` the C type."""
    def template(attrs_: Any, compute: str) -> str:
        return text.replace("$f", "f" if compute == "f32" else "").replace("$T", CTYPE[compute])
    return OpTemplate(template, args, ints)


def _rows(rows: dict[str, Any], args: str = "out", ints: bool = True) -> dict[str, OpTemplate]:
    """The core's shared rows (template functions of the attributes) as op table rows."""
    return {op: OpTemplate(t if callable(t) else (lambda a, c, t=t: t), args, ints)
            for op, t in rows.items()}


_UNARY = {"exp": "exp$f({self})", "log": "log$f({self})", "log1p": "log1p$f({self})",
          "expm1": "expm1$f({self})", "sqrt": "sqrt$f({self})", "rsqrt": "($T)1 / sqrt$f({self})",
          "tanh": "tanh$f({self})", "sin": "sin$f({self})", "cos": "cos$f({self})",
          "sigmoid": "($T)1 / (($T)1 + exp$f(-{self}))", "reciprocal": "($T)1 / {self}",
          "silu": "{self} / (($T)1 + exp$f(-{self}))", "erf": "erf$f({self})"}
_GELU = {None: "($T)0.5 * {self} * (($T)1 + erf$f({self} * ($T)0.70710678118654752440))",
         "tanh": "($T)0.5 * {self} * (($T)1 + tanh$f(($T)0.79788456080286535588 * "
                 "({self} + ($T)0.044715 * {self} * {self} * {self})))"}
_POW = {2: "{self} * {self}", 3: "{self} * {self} * {self}", 1: "{self}", 0.5: "sqrt$f({self})",
        -1: "($T)1 / {self}"}
_MAXMIN = "({self} != {self} || {other} != {other}) ? {self} + {other} : {self} %s {other} ? {self} : {other}"  # noqa: E501

OPS: dict[str, OpTemplate] = {
    **{f"aten.{name}.default": _c(text) for name, text in _UNARY.items()},
    **_rows(op_rows.alpha_rows()),
    **_rows(op_rows.clamp_rows(lambda c, a, b: f"({c} ? {a} : {b})")),
    **_rows(op_rows.comparisons(lambda symbol: f"{{self}} {symbol} {{other}}"), "promote"),
    **{f"aten.mul.{k}": _c("{self} * {other}", True) for k in ("Tensor", "Scalar")},
    **{f"aten.div.{k}": _c("{self} / {other}") for k in ("Tensor", "Scalar")},
    "aten.neg.default": _c("-{self}", True),
    "aten.abs.default": _c("fabs$f({self})"),
    "aten.relu.default": _c("{self} < 0 ? 0 : {self}", True),
    "aten.maximum.default": _c(_MAXMIN % ">", True),
    "aten.minimum.default": _c(_MAXMIN % "<", True),
    "aten.where.self": _c("{condition} ? {self} : {other}", True, "where"),
    "aten.isnan.default": _c("{self} != {self}", True, "keep"),
    "aten.logical_not.default": _c("!{self}", True, "keep"),
    "aten.clone.default": _c("{self}", True, "keep"),
    "aten.gelu.default": OpTemplate(lambda a, c: _c(
        _GELU["tanh" if a.get("approximate") == "tanh" else None]).template(a, c)),
    "aten.pow.Tensor_Scalar": OpTemplate(lambda a, c: _c(
        _POW.get(a["exponent"], "pow$f({self}, {exponent})")).template(a, c)),
    "aten.tanh_backward.default": _c("{grad_output} * (($T)1 - {output} * {output})"),
    "aten.sigmoid_backward.default": _c("{grad_output} * (($T)1 - {output}) * {output}"),
    "aten.threshold_backward.default": _c("{self} <= {threshold} ? 0 : {grad_output}"),
    **{op: OpTemplate("", "cast", True) for op in ("aten._to_copy.default",
                                                   "prims.convert_element_type.default")},
}


def _lines(s: Any) -> list[str]:
    """C lines of one statement (nested ones indented by two spaces)."""
    if isinstance(s, stmt.Declare):
        return [f"const {CTYPE[s.ctype]} {s.name} = {s.expr};"]
    if isinstance(s, stmt.Var):
        return [f"{CTYPE[s.ctype]} {s.name} = {s.expr};"]
    if isinstance(s, stmt.Store):
        return [f"{s.target.pointer}[{s.target.offset}] = {s.value};"]
    if isinstance(s, stmt.Update):
        return [f"{s.target} {s.op} {s.value};"]
    if isinstance(s, stmt.Select):
        return [f"{s.target} = ({s.cond}) ? {s.value} : {s.target};"]
    if isinstance(s, stmt.Loop):
        body = [line for t in (*s.head, *s.body) for line in _lines(t)]
        return [f"for (int64_t {s.var} = {s.start}; {s.var} < {s.end}; {s.var}++) {{",
                *("  " + line for line in body), "}"]
    raise TypeError(f"scalar_c renders no {type(s).__name__} statement")


class ScalarC:
    """Plain scalar C for pointwise groups and reductions (by rows, by columns, strided),
    one nest or several (see the module)."""

    name = "scalar_c"
    version = "0.1.0"
    ops = OPS
    language = indexing.C
    sqrt = "sqrt({x})"
    capabilities = Capabilities(
        forms=frozenset({"pointwise", "row_reduction", "column_reduction", "strided_reduction",
                         "several_nests"}),
        dtypes=frozenset({"f64", "f32", "bf16", "i64", "i32", "b8"}), ops=frozenset(OPS),
        kinds=frozenset({"sum", "prod", "max", "min", "var", "argmax", "argmin", "any", "all"}),
        symbolic=True)

    def literal(self, value: Any, dtype: str) -> str:
        if isinstance(value, bool):
            return "1" if value else "0"
        if dtype in ("f32", "f64"):
            if isinstance(value, float) and not math.isfinite(value):
                text = "NAN" if math.isnan(value) else "INFINITY"
                return f"(({CTYPE[dtype]}){'-' if value < 0 else ''}{text})"
            return f"(({CTYPE[dtype]}){float(value)!r})"
        if isinstance(value, float):
            raise TypeError(f"float {value!r} in an integer computation")
        return f"(({CTYPE[dtype]}){int(value)}LL)"

    def convert(self, text: str, source: str, target: str) -> str:
        return f"({text} != 0)" if target == "b8" else f"(({CTYPE[target]})({text}))"

    def round(self, text: str, dtype: str) -> str:
        return f"sc_bf16({text})"

    def read(self, pointer: str, offset: str, dtype: str) -> str:
        element = f"{pointer}[{offset}]"
        return f"sc_from_bf16({element})" if dtype == "bf16" else element

    def store_value(self, text: str, dtype: str) -> str:
        return f"sc_to_bf16({text})" if dtype == "bf16" else text

    def initial(self, kind: str, dtype: str) -> str:
        if kind in ("sum", "var", "any"):
            return "0"
        if kind in ("prod", "all"):
            return "1"
        low = kind in ("max", "argmax")
        if dtype in ("f32", "f64"):
            return "-INFINITY" if low else "INFINITY"
        limit = _LIMITS.get(dtype)
        return (f"{limit}_MIN" if low else f"{limit}_MAX") if limit else ("0" if low else "255")

    def accumulate(self, kind: str, acc: str, value: str, index: str, extra: str) -> list:
        v = value
        if kind in ("sum", "prod"):
            return [stmt.Update(acc, "+=" if kind == "sum" else "*=", v)]
        if kind in ("any", "all"):
            return [stmt.Update(acc, "|=" if kind == "any" else "&=", f"({v} != 0)")]
        if kind == "var":
            return [stmt.Update(acc, "+=", f"({v} - {extra}) * ({v} - {extra})")]
        if kind in ("max", "min"):  # NaN wins, as in eager
            return [stmt.Select(acc, f"{v} {'>' if kind == 'max' else '<'} {acc} || {v} != {v}",
                                v)]
        # argmax/argmin: the first extreme (the first NaN) wins
        op = ">" if kind == "argmax" else "<"
        better = f"{acc}_better"
        return [stmt.Declare("b8", better, f"{v} {op} {extra} || ({v} != {v} && "
                                           f"{extra} == {extra})"),
                stmt.Select(extra, better, v), stmt.Select(acc, better, index)]

    def render(self, kernel) -> str:
        params = []
        for p in kernel.launch.params:
            if p.role in ("scalar", "size"):
                params.append(f"{CTYPE[p.dtype]} {p.name}")
            else:
                const = "const " if p.role == "input" else ""
                params.append(f"{const}{STORAGE[p.dtype]}* restrict {p.name}")
        body = [line for s in kernel.body for line in _lines(s)]
        return "\n".join([PRELUDE, f"void {kernel.launch.entry}({', '.join(params)}) {{",
                          *("  " + line for line in body), "}", ""])

    def build(self, source: str, launch):
        return build(source, launch)

    def available(self) -> str | None:
        return compiler_missing()
