"""The runtime's compiled graph: a plan (:mod:`torchloom.codegen.plan`) whose fusion groups
call kernels chosen from the codegens, guards on the inputs, and a fallback.

The plan builder belongs to the codegen layer; its names are re-exported here for callers
that import them from the runtime.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
from torchloom.codegen.base import Reason
from torchloom.codegen.guards import describe_mismatch
from torchloom.codegen.plan import CONSTANT, FUSION_GROUP, Plan, SubgraphCall, build_function
from torchloom.ir.aliasing import shared_outputs, written_storage
from torchloom.ir.graph import CALL_SUBGRAPH, Graph, Node
from torchloom.ir.types import TensorType
from torchloom.ops.registry import OpRegistry
from torchloom.runtime.group_failure import codegen_failed
from torchloom.runtime.tiered import Tiered, TieredCall

log = logging.getLogger("torchloom.runtime")


_UNJUDGED = object()  # no verdict recorded for a (group, codegen)


def anticipate_codegens(graph: Graph, registry: OpRegistry, codegens: Sequence[Any]) -> None:
    """Each codegen's optional ``anticipate(graph, registry)`` with the graph as imported,
    before any pass runs (:mod:`torchloom.codegen.base`: work that needs only the ops the
    graph holds starts while the passes and the plan run). One that raises is logged and
    skipped: anticipating is never needed for a correct compile."""
    for cg in codegens:
        anticipate = getattr(cg, "anticipate", None)
        if not callable(anticipate):
            continue
        try:
            anticipate(graph, registry)
        except Exception as exc:
            log.warning("torchloom: codegen %r failed anticipating graph %s: %s",
                        getattr(cg, "name", cg), graph.name, exc)


def prepare_codegens(graph: Graph, registry: OpRegistry, codegens: Sequence[Any],
                     cache=None) -> dict:
    """Before any group compiles, a codegen with the optional ``prepare(groups, registry)``
    gets every fusion group of the graph (shared subgraphs included) that it is the first
    of ``codegens`` to support, so it can build them together (the cpu codegen: one library,
    one compiler call, per graph). Returns the verdicts given on the way (None or a Reason),
    keyed ``(node, codegen name)``, so no codegen judges a group twice. Groups whose
    structure ``cache`` (the kernel cache) has compiled, seen declined or holds on disk
    (for a codegen with ``available``: loaded without judging) are not judged."""
    if not any(callable(getattr(cg, "prepare", None)) for cg in codegens):
        return {}
    verdicts: dict[tuple[Node, str], Reason | None] = {}
    batches: dict[str, list[Node]] = {}
    for g in [graph.root, *graph.root.subgraphs.values()]:
        for node in g.nodes:
            if node.op != FUSION_GROUP:
                continue
            for cg in codegens:
                if cache is not None and (cache.has(cg, node) or (
                        callable(getattr(cg, "available", None)) and cache.has_stored(cg, node))):
                    break  # compiled before (here, or stored by an earlier process)
                try:
                    reason = (cache.declined(cg, node) if cache is not None else None) or \
                        cg.supports(node, registry)
                except Exception:  # judged again (and reported) when the group compiles
                    break
                verdicts[(node, cg.name)] = reason
                if reason is not None and cache is not None:
                    cache.decline(cg, node, reason)
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


def library_calls(gemms, codegens: Sequence[Any], registry: OpRegistry,
                  first_calls: str = "wait") -> Callable[[Node], Callable | None]:
    """``calls(node)``: what a plain op node of the plan calls in place of its op: a blocked
    product (``gemms.callable_for``), else the first codegen of the chain whose optional
    ``library_call(node, registry)`` gives a function (:mod:`torchloom.codegen.base`), else
    None (the op). A codegen whose ``library_call`` raises is logged and skipped. Under
    ``first_calls = "eager"`` a function whose library still builds (``ready()``) is a
    :class:`~torchloom.runtime.tiered.TieredCall`: the op runs until it is built."""
    offers = [cg for cg in codegens if callable(getattr(cg, "library_call", None))]

    def calls(node: Node) -> Callable | None:
        if gemms is not None and (fn := gemms.callable_for(node)) is not None:
            return fn
        for cg in offers:
            try:
                fn = cg.library_call(node, registry)
            except Exception as exc:  # a codegen's bug costs only its offer
                log.warning("torchloom: codegen %r failed offering a call for %s: %s",
                            cg.name, node.op, exc)
                continue
            if fn is not None:
                if first_calls == "eager" and callable(getattr(fn, "ready", None)) and \
                        not fn.ready():
                    return TieredCall(fn, registry.get(node.op).callable_for(node))
                return fn
        return None
    return calls


@attrs.define
class GroupChoice:
    """Which codegen runs a group, and why others did not."""

    node: Node
    codegen: str
    fallback_reasons: list[Reason] = attrs.field(factory=list)

    def ran_on_eager(self, reason: Reason) -> None:
        """The chosen codegen's kernel failed after the plan was made (its background
        build): the group runs op by op from now on, for ``reason``."""
        self.codegen = "eager"
        if reason not in self.fallback_reasons:  # (told by each variant the plan made)
            self.fallback_reasons.append(reason)


class CompiledGraph:
    """The runnable result of compiling a graph: guards, kernels, fallback."""

    def __init__(self, graph: Graph, registry: OpRegistry, codegens: Sequence[Any],
                 cache=None, fallback: Callable | None = None, user_inputs: int | None = None,
                 repro_dir: Path | None = None, warned: set[str] | None = None,
                 boxed: bool = False, donated: Sequence[int] = (), gemms=None,
                 first_calls: str = "wait"):
        """``fallback(*user_args)`` runs the original graph when a guard fails; the graph's
        inputs after the first ``user_inputs`` are constants it does not take. A codegen
        that raises on a group costs only that group (:mod:`.group_failure`: its IR goes
        to ``repro_dir``, each distinct error is logged once per ``warned`` set).
        ``boxed`` and ``donated`` (input indices whose buffers the caller gives up): see
        :func:`~torchloom.codegen.plan.build_function`; ``gemms`` (a
        :class:`~torchloom.codegen.gemm.GemmBlocks`) says which products run in blocks, and
        the codegens' ``library_call`` which other plain nodes call a codegen's function
        (:func:`library_calls`). ``first_calls``: what a group whose kernel still builds
        runs meanwhile, "wait" or "eager" (:mod:`.tiered`)."""
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
        calls = library_calls(gemms, codegens, registry, first_calls)

        def kernel_for(node: Node) -> Callable:
            if node.op == CALL_SUBGRAPH:
                callee = node.attrs["callee"]
                if callee not in self.subgraph_fns:
                    self.subgraph_fns[callee] = SubgraphCall.of(build_function(
                        graph.root.subgraphs[callee], registry, kernel_for, calls=calls))
                return self.subgraph_fns[callee]
            if node.op != FUSION_GROUP:  # other regions (shared subgraphs) run their body
                return build_function(node.region, registry, kernel_for, calls=calls).fn
            choice = GroupChoice(node, "eager")
            self.choices.append(choice)
            shared = _shared_and_written(node, registry, written)
            for cg in codegens:
                if shared is not None and cg.name != "eager":
                    choice.fallback_reasons.append(Reason(cg.name, shared))
                    continue
                stage = "judging"
                try:  # a codegen's bug costs only this group, never the whole graph
                    # a group of the same structure was judged (and compiled) already
                    kernel = self.cache.cached(cg, node)
                    reason = None if kernel is not None else self.cache.declined(cg, node)
                    if kernel is None and reason is None:
                        reason = verdicts.pop((node, cg.name), _UNJUDGED)
                        if reason is _UNJUDGED:  # stored by an earlier process: not judged
                            kernel = self.cache.stored(cg, node, registry)
                            reason = None if kernel is not None else cg.supports(node, registry)
                        if reason is not None:
                            self.cache.decline(cg, node, reason)
                        elif kernel is None:
                            stage = "compiling"
                            kernel = self.cache.get_or_compile(cg, node, registry)
                    if reason is None:
                        stage = "building"
                        kernel = self._tiered(kernel, node, choice, cg, registry)
                except Exception as exc:
                    reason = codegen_failed(cg, stage, node, exc, repro_dir, warned)
                if reason is None:
                    choice.codegen = cg.name
                    return kernel
                choice.fallback_reasons.append(reason)
            raise TypeError(f"no codegen compiled the group: "
                            f"{'; '.join(map(str, choice.fallback_reasons))}")

        written: dict[Graph, set] = {}  # per graph, what is written in place in it
        self._first_calls = first_calls
        self._repro_dir, self._warned = repro_dir, warned
        #: the groups whose kernels were still building when the plan was made
        self.tiered: list[Tiered] = []
        verdicts = prepare_codegens(graph, registry, codegens, self.cache)
        self.plan = build_function(graph, registry, kernel_for, guards=fallback is not None,
                                   fallback=self._guard_failed,
                                   guarded_inputs=self._user_inputs, boxed=boxed,
                                   donated=donated, calls=calls)

    def __call__(self, *args):
        return self.plan.fn(*args)

    def _tiered(self, kernel: Any, node: Node, choice: GroupChoice, cg: Any,
                registry: OpRegistry) -> Any:
        """``kernel`` as the plan calls it: a kernel a codegen builds in the background
        (``ready``/``resolve``, :mod:`torchloom.codegen.base`) is a :class:`Tiered` while
        it builds (groups of symbolic output sizes wait for it here), else resolved."""
        if not callable(getattr(kernel, "resolve", None)):
            return kernel
        types = [v.type for v in node.outputs]
        if kernel.ready() or not all(isinstance(t, TensorType) and t.is_static
                                     for t in types):
            return kernel.resolve()  # (raises where the build failed: the group's failure)

        def failed(exc: BaseException) -> None:
            choice.ran_on_eager(codegen_failed(cg, "building", node, exc, self._repro_dir,
                                               self._warned))
        tiered = Tiered(kernel, lambda: build_function(node.region, registry).fn,
                        tuple(tuple(t.actual_strides()) for t in types),
                        wait=self._first_calls == "wait", on_failure=failed)
        self.tiered.append(tiered)
        return tiered

    def _guard_failed(self, args: tuple, index: int | None):
        """Run the original graph: input ``index`` breaks its guard (None: a fake tensor
        mode is active, whose tensors have no memory for the kernels)."""
        reason = "a fake tensor mode is active" if index is None else \
            describe_mismatch(self.graph.inputs[index], args[index])
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


def _shared_and_written(group: Node, registry, written: dict[Graph, set]) -> str | None:
    """Why only ``eager`` may run ``group``: an output of it that shares storage with an
    input or another output (a view returned beside its base) is written in place after
    it. A native kernel gives every output a buffer of its own, so the write would not
    reach the other tensor; running the group op by op keeps the sharing."""
    hazards = shared_outputs(group, registry)
    if not hazards:
        return None
    if group.graph not in written:
        written[group.graph] = written_storage(group.graph, registry)
    hit = [i for i in hazards if group.outputs[i] in written[group.graph]]
    if not hit:
        return None
    names = ", ".join(f"%{group.outputs[i].name}" for i in hit)
    return (f"the storage of output(s) {names}, shared with an input or another output of "
            f"the group, is written in place after it; a kernel's separate output buffers "
            f"would lose the write, so the group runs op by op")


__all__ = ["build_function", "CompiledGraph", "Plan", "FUSION_GROUP", "CONSTANT",
           "CALL_SUBGRAPH"]
