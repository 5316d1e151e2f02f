"""The pass a ``pattern_pass`` makes: match every rule in one walk, splice replacements.

Walking the graph once (regions included, each node after its owner) in topological
order, each node is tried against the rules whose root op it has (:class:`PatternIndex`);
the first match that ``check`` accepts and whose replacement fits is rewritten: the
replacement's nodes are created before the root, the root's result is replaced by the
replacement's, and the matched nodes that nothing reads any more are erased. A matched
node whose result something else still reads (a graph output saved for the backward, a
node outside the match) stays: liveness counts graph outputs
(:mod:`torchloom.ir.liveness`), so the rewrite never trips over ``cannot erase``.

The manager runs the pass on the main graph and on each shared subgraph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from torchloom.errors import PluginError
from torchloom.ir.graph import Graph, Value
from torchloom.ir.liveness import dead_nodes, is_returned
from torchloom.ir.text import format_type
from torchloom.ir.types import TensorType
from torchloom.passes.base import Pass, PassContext, PassResult
from torchloom.passes.builtin.purity import is_pure
from torchloom.passes.pattern.match import PatternIndex
from torchloom.passes.pattern.rules import Match, Rule
from torchloom.passes.sources import SourceHashes


class PatternPass(Pass):
    """Base class of the passes :func:`torchloom.api.pattern_pass` makes (attrs-frozen
    subclasses with a ``name`` and a ``traced`` function returning their rules)."""

    #: () -> the traced rules (memoized by whoever sets it)
    traced: ClassVar[Callable[[], tuple[Rule, ...]]]
    idempotent: ClassVar[bool] = False

    @classmethod
    def rules(cls) -> tuple[Rule, ...]:
        """The traced rules (tracing them on the first call: errors name the pass)."""
        return cls.traced()

    def identity(self, distribution: str = "?", version: str = "?",
                 sources: SourceHashes | None = None) -> dict[str, Any]:
        """The pass's identity plus the traced rules: editing a pattern changes it."""
        found = super().identity(distribution, version, sources)
        return {**found, "patterns": [rule.identity for rule in self.rules()]}

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        rules = self.rules()
        for rule in rules:
            impure = [n.op for n in rule.pattern.nodes if not is_pure(n, ctx.registry)]
            if impure:  # a write or a random draw: erasing a match would drop an effect
                raise PluginError(f"pattern pass {self.name}, rule {rule.name}: the pattern "
                                  f"has ops with effects ({', '.join(impure)}); patterns "
                                  f"match pure ops only")
        index = PatternIndex(rules)
        slots: dict[Graph, dict[Value, list[int]]] = {}
        stats = {"rewritten": 0}
        per_rule = {rule.name: 0 for rule in rules} if len(rules) > 1 else {}
        declined: dict[tuple[str, str], list[str]] = {}  # (rule, why) -> where
        for node in list(graph.walk()):
            owner = node.graph
            if owner is None:  # erased by an earlier rewrite
                continue
            for rule in index.candidates(node):
                match = index.match(rule, node)
                if match is None:
                    continue
                if rule.check is not None and not rule.check(match):
                    stats["refused"] = stats.get("refused", 0) + 1
                    continue
                if owner not in slots:
                    slots[owner] = owner.output_slots()
                outcome = _rewrite(match, rule, slots[owner])
                if isinstance(outcome, str):
                    stats["declined"] = stats.get("declined", 0) + 1
                    declined.setdefault((rule.name, outcome), []).append(
                        f"{node.outputs[0]!r} in @{owner.name}")
                    continue
                stats["rewritten"] += 1
                if outcome:
                    stats["kept"] = stats.get("kept", 0) + outcome
                if per_rule:
                    per_rule[rule.name] += 1
                break
        stats.update({f"rewritten.{name}": n for name, n in per_rule.items() if n})
        for (rule_name, why), where in declined.items():  # one note per reason, not per node
            shown = ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3
                                            else "")
            ctx.note(f"{self.name}: {rule_name} not rewritten at {shown}: {why}")
        return PassResult(stats["rewritten"] > 0, stats)


def _rewrite(match: Match, rule: Rule, slots: dict[Value, list[int]]) -> int | str:
    """Splice the replacement for ``match``; returns how many matched nodes stay (read
    by something outside the match), or why the rewrite does not fit (nothing changed)."""
    owner, root = match.graph, match.root
    old = root.outputs[rule.pattern.outputs[0].index]
    args = [match.values.get(name) for name in rule.arg_names]
    types = tuple(v.type if v is not None else None for v in args)
    params = tuple(match.params[name] for name in rule.params)
    replacement = rule.instantiate(types, params)
    if isinstance(replacement, str):
        return replacement
    env: dict[Value, Value] = {p: a for p, a in zip(replacement.inputs, args) if a is not None}
    result = replacement.outputs[0]
    device = old.type.device if isinstance(old.type, TensorType) else None
    new_type = _on(result.type, device)
    if new_type != old.type:
        return (f"the replacement gives {format_type(new_type)}, the matched value is "
                f"{format_type(old.type)}")
    if result.producer is None and is_returned(old, slots):
        # returning the argument itself would make a graph output alias it
        return "the replacement returns an argument unchanged and the match is returned"
    for n in replacement.nodes:
        made = owner.create(n.op, [env[v] for v in n.inputs],
                            [_on(v.type, device) for v in n.outputs], n.attrs,
                            names=[v.name for v in n.outputs], before=root)
        env.update(zip(n.outputs, made.outputs))
    owner.replace_uses({old: env[result]}, slots)
    doomed = dead_nodes(match.nodes, slots)
    for n in doomed:
        owner.erase(n, slots)
    return len(set(match.nodes)) - len(doomed)


def _on(t, device: str | None):
    if device is not None and isinstance(t, TensorType) and t.device != device:
        return t.with_(device=device)
    return t
