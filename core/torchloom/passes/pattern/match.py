"""Structural matching of traced patterns over a graph's DAG.

A pattern matches at a node (its *root*, the node computing the pattern's result) when,
following inputs back from there, every pattern node meets a graph node of the same op,
input count and attributes, and every pattern argument meets one graph value wherever it
is read (a name used twice is the same value). Commutative ops (:data:`COMMUTATIVE`)
match either input order, with backtracking. Attributes compare by type and value
(``2`` is not ``2.0`` nor ``True``), except at a declared parameter, which matches any
number of its kind and the same number wherever the parameter appears. Dtypes and shapes
are not compared: the example inputs only drove the trace.

:class:`PatternIndex` keys rules by their root op, so one walk over the graph tries at
each node only the rules whose root op it has: linear in the graph for a fixed rule set.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

from torchloom.ir.graph import Node, Value
from torchloom.ir.types import TensorType
from torchloom.passes.pattern.rules import COMMUTATIVE, Match, Rule

_MISSING = object()


class _Binding:
    """A partial match: pattern nodes -> graph nodes, pattern args -> graph values,
    parameters -> numbers. Extended by copy, so a failed branch leaves nothing behind."""

    __slots__ = ("nodes", "values", "params")

    def __init__(self, nodes: dict, values: dict, params: dict):
        self.nodes, self.values, self.params = nodes, values, params

    def extended(self, nodes=None, values=None, params=None) -> "_Binding":
        return _Binding({**self.nodes, **(nodes or {})}, {**self.values, **(values or {})},
                        {**self.params, **(params or {})})


class PatternIndex:
    """The rules of one pass, keyed by the op of their root node."""

    def __init__(self, rules: Sequence[Rule]):
        self.rules = tuple(rules)
        self._by_op: dict[str, list[Rule]] = {}
        self._sites: dict[int, dict[Node, dict[str, list]]] = {}
        for rule in self.rules:
            self._by_op.setdefault(rule.root.op, []).append(rule)
            nodes = list(rule.pattern.nodes)
            sites: dict[Node, dict[str, list]] = {}
            for site in rule.sites:
                sites.setdefault(nodes[site.node], {}).setdefault(site.key, []).append(site)
            self._sites[id(rule)] = sites

    def candidates(self, node: Node) -> list[Rule]:
        """The rules whose root op is ``node``'s."""
        return self._by_op.get(node.op, [])

    def match(self, rule: Rule, node: Node) -> Match | None:
        """The first match of ``rule`` rooted at ``node`` (None when there is none)."""
        pattern_root = rule.root
        sites = self._sites[id(rule)]
        for b in _match_node(pattern_root, node, _Binding({}, {}, {}), sites):
            order = [b.nodes[p] for p in rule.pattern.nodes]
            values = {rule.arg_names[i]: b.values[v] for i, v in enumerate(rule.pattern.inputs)
                      if v in b.values}
            return Match(rule.name, node.graph, values, dict(b.params), tuple(order))
        return None


def _match_node(pn: Node, gn: Node, b: _Binding, sites) -> Iterator[_Binding]:
    seen = b.nodes.get(pn)
    if seen is not None:
        if seen is gn:
            yield b
        return
    if (gn.op != pn.op or len(gn.inputs) != len(pn.inputs)
            or len(gn.outputs) != len(pn.outputs) or gn.region is not None):
        return
    params = _match_attrs(pn, gn, b.params, sites.get(pn, {}))
    if params is None:
        return
    b = b.extended(nodes={pn: gn}, params=params)
    yield from _match_inputs(list(pn.inputs), list(gn.inputs), b, sites)
    if (pn.op in COMMUTATIVE and len(pn.inputs) == 2 and pn.inputs[0] is not pn.inputs[1]
            and "alpha" not in pn.attrs):
        yield from _match_inputs([pn.inputs[1], pn.inputs[0]], list(gn.inputs), b, sites)


def _match_inputs(pvs: list[Value], gvs: list[Value], b: _Binding,
                  sites) -> Iterator[_Binding]:
    if not pvs:
        yield b
        return
    for b1 in _match_value(pvs[0], gvs[0], b, sites):
        yield from _match_inputs(pvs[1:], gvs[1:], b1, sites)


def _match_value(pv: Value, gv: Value, b: _Binding, sites) -> Iterator[_Binding]:
    if pv.producer is None:  # a pattern argument: any value, the same one at every read
        bound = b.values.get(pv)
        if bound is not None:
            if bound is gv:
                yield b
            return
        if isinstance(pv.type, TensorType) != isinstance(gv.type, TensorType):
            return
        yield b.extended(values={pv: gv})
        return
    if gv.producer is None or gv.index != pv.index:
        return
    yield from _match_node(pv.producer, gv.producer, b, sites)


def _match_attrs(pn: Node, gn: Node, params: dict, sites: dict) -> dict | None:
    """The parameters bound by ``gn``'s attributes, or None when they do not match."""
    if pn.attrs.keys() != gn.attrs.keys():
        return None
    bound: dict[str, Any] = {}
    for key, pa in pn.attrs.items():
        ga = gn.attrs[key]
        at = sites.get(key)
        if at is None:
            if not same_attr(pa, ga):
                return None
            continue
        for site in at:
            value = _at(ga, site.path)
            if value is _MISSING or not _is_number(value) or (
                    site.kind == "int" and not isinstance(value, int)):
                return None
            known = bound.get(site.name, params.get(site.name, _MISSING))
            if known is not _MISSING and not same_attr(known, value):
                return None
            bound[site.name] = value
        # the rest of a list attribute holding a parameter still compares
        if isinstance(pa, tuple) and not _same_outside(pa, ga, {s.path for s in at}):
            return None
    return bound


def _at(value: Any, path: tuple[int, ...]) -> Any:
    for i in path:
        if not isinstance(value, tuple) or i >= len(value):
            return _MISSING
        value = value[i]
    return value


def _same_outside(pa: tuple, ga: Any, paths: set, prefix: tuple = ()) -> bool:
    if not isinstance(ga, tuple) or len(pa) != len(ga):
        return False
    for i, (x, y) in enumerate(zip(pa, ga)):
        here = prefix + (i,)
        if here in paths:
            continue
        if isinstance(x, tuple):
            if not _same_outside(x, y, paths, here):
                return False
        elif not same_attr(x, y):
            return False
    return True


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def same_attr(a: Any, b: Any) -> bool:
    """Attribute equality that tells ``2``, ``2.0`` and ``True`` apart (NaN equals NaN)."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(same_attr(x, y) for x, y in zip(a, b)))
    if isinstance(a, (bool, int, float)) or isinstance(b, (bool, int, float)):
        if type(a) is not type(b):
            return False
        return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b
