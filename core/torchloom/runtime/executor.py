"""IR -> one Python callable.

The graph is turned into Python source once (like torch.fx's codegen): one statement per
node calling a pre-bound callable, constants inlined, values dropped after their last use,
guards on the inputs at the top. A call therefore does no op-name lookups and no
interpretation. Region nodes call kernels compiled by a codegen.
"""

from __future__ import annotations

import keyword
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
from torchloom.codegen.base import Reason, RegionKernel
from torchloom.ir.graph import CALL_SUBGRAPH, Graph, InputRef, Node, Value
from torchloom.ops.registry import OpRegistry
from torchloom.runtime.group_failure import codegen_failed
from torchloom.runtime.guards import describe_mismatch, guard_expressions, symbolic_guard
from torchloom.runtime.lowering import lower

log = logging.getLogger("torchloom.runtime")

FUSION_GROUP = "torchloom.fusion_group"
CONSTANT = "torchloom.constant"

_LITERAL_TYPES = (int, bool, str, type(None))


@attrs.frozen
class Plan:
    """A generated Python function and the source it was made from."""

    fn: Callable[..., tuple]
    source: str


def build_function(graph: Graph, registry: OpRegistry,
                   kernel_for: Callable[[Node], Callable] | None = None, *,
                   guards: bool = False, fallback: Callable | None = None,
                   tuple_result: bool = True, guarded_inputs: int | None = None,
                   recompose: bool = True) -> Plan:
    """Generate ``run(*inputs) -> tuple`` for ``graph``.

    ``kernel_for(node)`` supplies the callable of each region node (default: the region
    run op by op). Fusion groups that run op by op (no ``kernel_for``, or a
    :class:`RegionKernel` from it) are inlined, and decomposed composites whose primitives
    all run op by op run as the composite (:mod:`torchloom.runtime.lowering`; not with
    ``recompose=False``, which tests of the primitives use). With
    ``guards``, inputs whose metadata differs from the graph's input types are handed to
    ``fallback(args, index)``; only the first ``guarded_inputs`` inputs are checked (the
    rest are constants bound by the compiler).
    """
    del tuple_result  # results are always a tuple; kept for the codegen protocol's callers
    guarded = graph.inputs[:guarded_inputs]
    graph, kernels = lower(graph, registry, _kernel_of(registry, kernel_for, recompose), recompose)
    names: dict[Value, str] = {}
    env: dict[str, Any] = {}
    lines: list[str] = []
    params = []
    for i, v in enumerate(graph.inputs):
        names[v] = f"a{i}"
        params.append(f"a{i}")
    header = f"def run({', '.join(params)}):"
    if guards and fallback is not None:
        checks = list(guard_expressions(guarded, env))
        if checks:
            # One condition and one call: the source stays linear in the number of inputs
            # (a branch per input, each passing every input, would be quadratic). The slow
            # path finds which input failed.
            env["_fallback"] = _first_failing(checks, env, fallback)
            lines.append(f"    if {' or '.join(f'({expr})' for _, expr in checks)}:")
            lines.append(f"        return _fallback(({', '.join(params)},))")
        symbolic = symbolic_guard(guarded, env)
        if symbolic is not None:  # inputs with symbolic sizes: one generated check
            env["_guard_failed"] = fallback
            lines.append(f"    if (_failed := {symbolic}) is not None:")
            lines.append(f"        return _guard_failed(({', '.join(params)},), _failed)")
    last_use = _last_uses(graph)
    # Locals are reused like registers: an output takes the name of an input that dies at
    # its node (as ``x = torch.mm(x, w)`` does), so dead values cost no extra statement.
    free: list[str] = []
    count = 0
    for idx, node in enumerate(graph.nodes):
        dying = last_use.get(idx, ())
        reusable = [names[v] for v in dying if v.producer is not node]
        for v in node.outputs:
            if reusable:
                names[v] = reusable.pop()
            elif free:
                names[v] = free.pop()
            else:
                names[v] = f"t{count}"
                count += 1
        lines.append("    " + _statement(node, idx, names, env, registry, kernels))
        dead = reusable + [names[v] for v in dying if v.producer is node]
        if dead:  # not taken over by an output: drop the reference now
            lines.append("    " + " = ".join(dead) + " = None")
            free.extend(dead)
    outs = ", ".join(names[v] for v in graph.outputs)
    lines.append(f"    return ({outs}{',' if len(graph.outputs) == 1 else ''})")
    source = "\n".join([header, *lines]) + "\n"
    namespace = dict(env)
    exec(compile(source, f"<torchloom @{graph.name}>", "exec"), namespace)
    return Plan(namespace["run"], source)


def _kernel_of(registry: OpRegistry, kernel_for, recompose: bool) -> Callable:
    """For :func:`lower`: a region node's callable, or the graph to inline in its place."""
    def kernel_of(node: Node):
        if node.op == FUSION_GROUP and kernel_for is None:
            return node.region
        if kernel_for is not None:
            kernel = kernel_for(node)
            return kernel.graph if isinstance(kernel, RegionKernel) else kernel
        if node.op == CALL_SUBGRAPH:  # a shared subgraph of the top-level graph
            return build_function(node.graph.root.subgraphs[node.attrs["callee"]], registry,
                                  recompose=recompose).fn
        return build_function(node.region, registry, recompose=recompose).fn
    return kernel_of


def _first_failing(checks: list[tuple[int, str]], env: dict[str, Any],
                   fallback: Callable) -> Callable:
    """``fallback(args, index)`` with the index of the first input whose guard fails."""
    def run(args: tuple):
        for i, expr in checks:
            if eval(expr, env, {f"a{i}": args[i]}):
                return fallback(args, i)
        raise AssertionError("a guard failed, but none fails when re-checked")
    return run


def _last_uses(graph: Graph) -> dict[int, list[Value]]:
    """Node index -> values (node outputs) whose last use is that node."""
    outputs = set(graph.outputs)
    last: dict[Value, int] = {}
    position = {}
    for idx, node in enumerate(graph.nodes):
        position[node] = idx
        for v in node.inputs:
            if v.producer is not None:
                last[v] = idx
        for v in node.outputs:  # unused results die right away
            last.setdefault(v, idx)
    result: dict[int, list[Value]] = {}
    for v, idx in last.items():
        if v not in outputs:
            result.setdefault(idx, []).append(v)
    return result


def _statement(node: Node, idx: int, names: dict[Value, str], env: dict[str, Any],
               registry: OpRegistry, kernels: dict[Node, Callable]) -> str:
    outs = [names[v] for v in node.outputs]
    if node.op == CONSTANT:
        return f"{outs[0]} = {_literal(node.attrs['value'], names, node, env, idx)}"
    fname = f"f{idx}"
    if node in kernels:  # a region node (fusion group, shared subgraph) calls its kernel
        env[fname] = kernels[node]
        call = f"{fname}({', '.join(names[v] for v in node.inputs)})"
        unpack = True
    else:
        opdef = registry.get(node.op)
        if opdef.fn is None:
            if node.op.startswith("python."):
                raise TypeError(f"op {node.op} is not registered: IR text never names "
                                f"Python to call")
            raise TypeError(f"op {node.op} has no callable; it must be lowered by a pass")
        env[fname] = opdef.callable_for(node)
        args, kwargs = opdef.call_template(node)
        for k in kwargs:  # keywords become source text: never let an attribute write code
            if not (isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k)):
                raise TypeError(f"op {node.op}: keyword argument name {k!r} is not an "
                                f"identifier")
        parts = [_literal(a, names, node, env, idx) for a in args]
        parts += [f"{k}={_literal(v, names, node, env, idx)}" for k, v in kwargs.items()]
        call = f"{fname}({', '.join(parts)})"
        unpack = opdef.returns_sequence or len(outs) != 1
    if not outs:
        return call
    if unpack:
        return f"{', '.join(outs)}{',' if len(outs) == 1 else ''} = {call}"
    return f"{outs[0]} = {call}"


def _literal(value: Any, names, node: Node, env: dict[str, Any], idx: int) -> str:
    if isinstance(value, InputRef):
        return names[node.inputs[value]]
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v, names, node, env, idx) for v in value) + "]"
    if isinstance(value, _LITERAL_TYPES) or (isinstance(value, float) and math.isfinite(value)):
        return repr(value)
    key = f"c{idx}_{len(env)}"
    env[key] = value
    return key


_UNJUDGED = object()  # no verdict recorded for a (group, codegen)


def prepare_codegens(graph: Graph, registry: OpRegistry, codegens: Sequence[Any]) -> dict:
    """Before any group compiles, a codegen with the optional ``prepare(groups, registry)``
    gets every fusion group of the graph (shared subgraphs included) that it is the first
    of ``codegens`` to support, so it can build them together (the cpu codegen: one library,
    one compiler call, per graph). Returns the verdicts given on the way (None or a Reason),
    keyed ``(node, codegen name)``, so no codegen judges a group twice."""
    if not any(callable(getattr(cg, "prepare", None)) for cg in codegens):
        return {}
    verdicts: dict[tuple[Node, str], Reason | None] = {}
    batches: dict[str, list[Node]] = {}
    for g in [graph.root, *graph.root.subgraphs.values()]:
        for node in g.nodes:
            if node.op != FUSION_GROUP:
                continue
            for cg in codegens:
                try:
                    reason = cg.supports(node, registry)
                except Exception:  # judged again (and reported) when the group compiles
                    break
                verdicts[(node, cg.name)] = reason
                if reason is None:
                    batches.setdefault(cg.name, []).append(node)
                    break
    for cg in codegens:
        if batches.get(cg.name) and callable(getattr(cg, "prepare", None)):
            try:
                cg.prepare(batches[cg.name], registry)
            except Exception as exc:  # each group then compiles on its own
                log.warning("torchloom: codegen %r could not prepare %d groups together: %s",
                            cg.name, len(batches[cg.name]), exc)
    return verdicts


@attrs.define
class GroupChoice:
    """Which codegen runs a group, and why others did not."""

    node: Node
    codegen: str
    fallback_reasons: list[Reason] = attrs.field(factory=list)


class CompiledGraph:
    """The runnable result of compiling a graph: guards, kernels, fallback."""

    def __init__(self, graph: Graph, registry: OpRegistry, codegens: Sequence[Any],
                 cache=None, fallback: Callable | None = None, user_inputs: int | None = None,
                 repro_dir: Path | None = None, warned: set[str] | None = None):
        """``fallback(*user_args)`` runs the original graph when a guard fails; the graph's
        inputs after the first ``user_inputs`` are constants it does not take. A codegen
        that raises on a group costs only that group (:mod:`.group_failure`: its IR goes
        to ``repro_dir``, each distinct error is logged once per ``warned`` set)."""
        from torchloom.runtime.cache import KernelCache
        self.graph = graph
        self.choices: list[GroupChoice] = []
        self.cache = cache if cache is not None else KernelCache()
        self._fallback_fn = fallback
        self._user_inputs = len(graph.inputs) if user_inputs is None else user_inputs
        self.fallback_reason: str | None = None  # the first guard failure, logged once
        self.fallback_calls = 0
        #: shared subgraph name -> its callable, built once however often it is called
        self.subgraph_fns: dict[str, Callable] = {}
        warned = warned if warned is not None else set()

        def kernel_for(node: Node) -> Callable:
            if node.op == CALL_SUBGRAPH:
                callee = node.attrs["callee"]
                if callee not in self.subgraph_fns:
                    self.subgraph_fns[callee] = build_function(
                        graph.root.subgraphs[callee], registry, kernel_for).fn
                return self.subgraph_fns[callee]
            if node.op != FUSION_GROUP:  # other regions (shared subgraphs) run their body
                return build_function(node.region, registry, kernel_for).fn
            choice = GroupChoice(node, "eager")
            self.choices.append(choice)
            for cg in codegens:
                stage = "judging"
                try:  # a codegen's bug costs only this group, never the whole graph
                    reason = verdicts.pop((node, cg.name), _UNJUDGED)
                    if reason is _UNJUDGED:
                        reason = cg.supports(node, registry)
                    if reason is None:
                        stage = "compiling"
                        kernel = self.cache.get_or_compile(cg, node, registry)
                except Exception as exc:
                    reason = codegen_failed(cg, stage, node, exc, repro_dir, warned)
                if reason is None:
                    choice.codegen = cg.name
                    return kernel
                choice.fallback_reasons.append(reason)
            raise TypeError(f"no codegen compiled the group: "
                            f"{'; '.join(map(str, choice.fallback_reasons))}")

        verdicts = prepare_codegens(graph, registry, codegens)
        self.plan = build_function(graph, registry, kernel_for, guards=fallback is not None,
                                   fallback=self._guard_failed,
                                   guarded_inputs=self._user_inputs)

    def __call__(self, *args):
        return self.plan.fn(*args)

    def _guard_failed(self, args: tuple, index: int):
        reason = describe_mismatch(self.graph.inputs[index], args[index])
        if self.fallback_reason is None:
            self.fallback_reason = reason
            log.warning("torchloom: guard failed on @%s (%s); running the original graph "
                        "(logged once)", self.graph.name, reason)
        else:
            log.debug("torchloom: guard failed on @%s (%s)", self.graph.name, reason)
        self.fallback_calls += 1
        result = self._fallback_fn(*args[:self._user_inputs])
        return tuple(result) if isinstance(result, (list, tuple)) else (result,)

    @property
    def source(self) -> str:
        return self.plan.source


__all__ = ["build_function", "CompiledGraph", "Plan", "FUSION_GROUP", "CONSTANT",
           "CALL_SUBGRAPH"]
