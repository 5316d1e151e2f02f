"""Reduction ops as the native codegens see them: which ops reduce, how their lanes
combine (``kind``) and how the combined value becomes the op's outputs.

The table is the same for every target but for the spelling of a square root (``std``),
so a codegen builds its own with :func:`reduction_table`, passing that spelling as a
template over ``{x}``, and leaves out kinds it cannot lower (Triton has no ``prod``).
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
    #: ``{n}`` (elements per row), ``{mean}``, ``{dof}`` (var: n - correction), ``{value}``
    #: (argmax/argmin: the extreme value, whose index is ``{acc}``)
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
