"""Reduction ops as the native codegens see them: which ops reduce, how their lanes
combine (``kind``) and how the combined value becomes the op's outputs.

The table is the same for every target but for the spelling of a square root (``std``),
so a codegen builds its own with :func:`reduction_table`, passing that spelling as a
template over ``{x}``, and leaves out kinds it cannot lower (Triton has no ``prod``).

What a reduction accumulates in is one rule (:func:`accumulator`): eager's values need a
double accumulator for a variance (eager's CPU Welford) and for an f32 sum whose
accumulators each add more than :data:`F32_SUM_COUNT` values (the core's lowering: one a
row; the cpu codegen: one per SIMD lane, a column's one). Triton adds a row in blocks of
lanes combined as a tree, in f32, as CUDA's eager and Inductor do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from torchloom.codegen.expr import Code, fill
from torchloom.ir import Node, Value


@attrs.frozen
class Reduction:
    """How a reduction op combines (``kind``: sum, prod, max, min, var, argmax, argmin, and
    any / all: whether some / every element is nonzero, NaN counting as nonzero) and how
    the combined value becomes the op's outputs."""

    kind: str
    #: the op's outputs, in order, as expressions over ``{acc}`` (the combined value),
    #: ``{n}`` (elements per row), ``{mean}``, ``{dof}`` (var: ``max(0, n - correction)``,
    #: as eager's), ``{value}`` (argmax/argmin: the extreme value, whose index is ``{acc}``)
    outputs: tuple[str, ...] = ("{acc}",)


def reduction_table(sqrt: str, *, kinds: frozenset[str] | None = None) -> dict[str, Reduction]:
    """Every reduction op by name; ``sqrt`` spells a square root of ``{x}`` in the target
    (``"sqrt$f({x})"``, ``"tl.sqrt_rn({x})"``); ``kinds``, when given, keeps only the ops
    whose kind is among them."""
    std = sqrt.replace("{x}", "{acc} / {dof}")
    table = {
        "aten.sum.dim_IntList": Reduction("sum"),
        "aten.sum.default": Reduction("sum"),
        "aten.prod.dim_int": Reduction("prod"),
        "aten.prod.default": Reduction("prod"),
        "aten.mean.dim": Reduction("sum", ("{acc} / {n}",)),
        "aten.mean.default": Reduction("sum", ("{acc} / {n}",)),
        "aten.amax.default": Reduction("max"),
        "aten.amin.default": Reduction("min"),
        "aten.max.default": Reduction("max"),
        "aten.min.default": Reduction("min"),
        "aten.var.correction": Reduction("var", ("{acc} / {dof}",)),
        "aten.var.dim": Reduction("var", ("{acc} / {dof}",)),
        "aten.std.correction": Reduction("var", (std,)),
        "aten.var_mean.correction": Reduction("var", ("{acc} / {dof}", "{mean}")),
        "aten.argmax.default": Reduction("argmax"),
        "aten.argmin.default": Reduction("argmin"),
        "aten.max.dim": Reduction("argmax", ("{value}", "{acc}")),
        "aten.min.dim": Reduction("argmin", ("{value}", "{acc}")),
        **{f"aten.{kind}.{overload}": Reduction(kind) for kind in ("any", "all")
           for overload in ("dim", "dims", "default")},
    }
    if kinds is None:
        return table
    return {op: spec for op, spec in table.items() if spec.kind in kinds}


#: most values one f32 accumulator of a sum adds; more, or a symbolic count, and the sum
#: is taken in double. Eager's cascade sum stays within a few ulp at any length; an f32
#: accumulator adding k values drifts by up to ~k/2 ulp (a sum of 4M values of about 100
#: through 16 SIMD lanes was 0.17% off, of 16M 1%; 2M values of about 0.1 added one by
#: one, 2%). A row's sum has one accumulator per SIMD lane (the cpu's rows of up to 2048
#: stay f32 on AVX-512, 128 values a lane), a column's one per column.
F32_SUM_COUNT = 128


def sum_dtype(dtype: str, count: Any, lanes: int = 1) -> str:
    """The accumulator of a sum computed in ``dtype`` of ``count`` values (an int, or
    symbolic) spread over ``lanes`` accumulators: double when an f32 accumulator would add
    more than :data:`F32_SUM_COUNT` of them."""
    if dtype == "f32" and not (isinstance(count, int) and count <= F32_SUM_COUNT * lanes):
        return "f64"
    return dtype


def accumulator(kind: str, dtype: str, count: Any, lanes: int = 1) -> str:
    """The compute dtype a reduction of ``kind`` whose result is computed in ``dtype``
    accumulates ``count`` values in, over ``lanes`` accumulators: a variance of floats in
    double (eager's CPU Welford accumulates in double), a sum (and a mean) in double past
    :data:`F32_SUM_COUNT` f32 values an accumulator (:func:`sum_dtype`), the others in
    ``dtype``."""
    if kind == "var" and dtype in ("f32", "f64"):
        return "f64"
    return sum_dtype(dtype, count, lanes) if kind == "sum" else dtype


def results(node: Node, spec: Reduction, fields: Mapping[str, Code | str], row: Any,
            result: Callable[[Value, Code], Any],
            spell: Callable[[Value, str], str] | None = None) -> dict[Value, tuple[Any, Any]]:
    """Each output of reduction ``node`` (its table row ``spec``) -> (``row``, the
    coordinates where it is read; ``result(output, code)``, the target's value of the
    expression of its template in ``spec.outputs`` over ``fields``, spelt for the output
    by ``spell(output, template)`` when given), in output order: what a writer records."""
    return {value: (row, result(value, fill(spell(value, template) if spell else template,
                                            fields)))
            for value, template in zip(node.outputs, spec.outputs)}
