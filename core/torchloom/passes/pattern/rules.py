"""What a pattern pass is made of: traced rules, and the matches ``check`` is shown.

A :class:`Rule` is one (pattern, replacement) pair after tracing: the pattern as an IR
graph (one input per argument of the pattern function, one output), where the parameters
sit in its attributes (:class:`ParamSite`), and a way to build the replacement for a
match (``instantiate``: traced by the frontend, which this layer may not import).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from torchloom.ir.graph import Graph, Node, Value

#: binary ops whose two tensor inputs may be swapped (``add`` only without ``alpha``)
COMMUTATIVE = frozenset({
    "aten.add.Tensor", "aten.mul.Tensor", "aten.maximum.default", "aten.minimum.default",
    "aten.eq.Tensor", "aten.ne.Tensor", "aten.logical_and.default",
    "aten.logical_or.default", "aten.logical_xor.default", "aten.bitwise_and.Tensor",
    "aten.bitwise_or.Tensor", "aten.bitwise_xor.Tensor", "aten.hypot.default",
})


@attrs.frozen
class ParamSite:
    """Attribute ``key`` of pattern node ``node`` (at ``path`` inside a list attribute,
    ``()`` for the attribute itself) holds parameter ``name``, which matches numbers of
    its ``kind``: ``"int"`` (ints only) or ``"float"`` (floats and ints)."""

    node: int
    key: str
    path: tuple[int, ...]
    name: str
    kind: str = "float"


@attrs.frozen
class Match:
    """One match of a rule, as ``check(match)`` sees it.

    ``values``: the pattern function's tensor arguments (by name) -> the graph values
    they matched; ``params``: declared parameters -> the numbers they matched; ``nodes``:
    the matched graph nodes in the pattern's order, ``root`` the last (its result is
    replaced); ``graph``: the graph (or region) holding them; ``rule``: the rule's name."""

    rule: str
    graph: Graph = attrs.field(eq=False)
    values: Mapping[str, Value]
    params: Mapping[str, Any]
    nodes: tuple[Node, ...]

    @property
    def root(self) -> Node:
        return self.nodes[-1]


#: instantiate(input types, params) -> the replacement graph for them (or a reason)
Instantiate = Callable[[tuple, tuple], "Graph | str"]


@attrs.frozen
class Rule:
    """One traced (pattern, replacement) pair of a pattern pass."""

    name: str
    pattern: Graph = attrs.field(eq=False)
    #: the pattern function's argument names, one per pattern graph input
    arg_names: tuple[str, ...]
    #: declared parameter -> "int" or "float" (what numbers it matches)
    params: Mapping[str, str]
    sites: tuple[ParamSite, ...]
    instantiate: Instantiate = attrs.field(eq=False)
    check: Callable[[Match], bool] | None = attrs.field(default=None, eq=False)
    #: canonical text of the traced pattern and replacement: the rule's cache identity
    identity: str = ""

    @property
    def root(self) -> Node:
        return self.pattern.outputs[0].producer
