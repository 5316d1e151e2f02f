"""IR -> one Python callable: the plan builder.

The graph is turned into Python source once (like torch.fx's codegen): one statement per
node calling a pre-bound callable, constants inlined, values dropped after their last use,
guards on the inputs at the top. A call therefore does no op-name lookups and no
interpretation. Region nodes call kernels compiled by a codegen (the runtime's
:class:`~torchloom.runtime.executor.CompiledGraph` chooses them).
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Callable, Collection
from typing import Any

import attrs
from torchloom.codegen.base import RegionKernel
from torchloom.codegen.buffers import Reuse, given, plan_reuse, view_of
from torchloom.codegen.constants import fold_constants
from torchloom.codegen.guards import (FastGuard, faking, guard_expressions, layout_checked,
                                      symbolic_guard)
from torchloom.codegen.lowering import lower
from torchloom.codegen.restride import (RESTRIDE, binding_lines, fold_views, make_restride,
                                        reshapes)
from torchloom.codegen.restride import source as restride_source
from torchloom.codegen.restride import symbols as restride_symbols
from torchloom.ir.graph import CALL_SUBGRAPH, CONSTANT, FUSION_GROUP, Graph, InputRef, Node, Value
from torchloom.ir.symbols import guard_namespace
from torchloom.ops.registry import OpRegistry

_LITERAL_TYPES = (int, bool, str, type(None))


@attrs.frozen
class Plan:
    """A generated Python function and the source it was made from."""

    fn: Callable[..., tuple]
    source: str
    #: ``run(args: list)``, which empties ``args`` (aot_autograd's boxed calling convention,
    #: the caller giving up its references): built with ``boxed=True``; its body is
    #: ``source``'s, after ``a0, a1, ... = args; args.clear()``
    boxed: Callable[[list], tuple] | None = None
    #: which kernel outputs are written into dead buffers (:mod:`torchloom.codegen.buffers`)
    reuse: Reuse = Reuse()
    #: indices of the outputs every call returns laid out as their types (made here by a
    #: kernel with exact layouts, a matrix product or a folded view; no input returned)
    exact_outputs: frozenset[int] = frozenset()


def build_function(graph: Graph, registry: OpRegistry,
                   kernel_for: Callable[[Node], Callable] | None = None, *,
                   guards: bool = False, fallback: Callable | None = None,
                   tuple_result: bool = True, guarded_inputs: int | None = None,
                   recompose: bool = True, boxed: bool = False,
                   donated: Collection[int] = (),
                   calls: Callable[[Node], Callable | None] | None = None) -> Plan:
    """Generate ``run(*inputs) -> tuple`` for ``graph``.

    ``kernel_for(node)`` supplies the callable of each region node (default: the region
    run op by op). Fusion groups that run op by op (no ``kernel_for``, or a
    :class:`RegionKernel` from it) are inlined, and decomposed composites whose primitives
    all run op by op run as the composite (:mod:`torchloom.codegen.lowering`; not with
    ``recompose=False``, which tests of the primitives use). With
    ``guards``, inputs whose metadata differs from the graph's input types are handed to
    ``fallback(args, index)``; only the first ``guarded_inputs`` inputs are checked (the
    rest are constants bound by the compiler).

    Each value is dropped after its last use; with ``boxed`` the plan also has
    ``run(args)`` that empties the list it is given, so an input is freed after its last
    use too. Kernel outputs are written into buffers that died before them
    (:func:`~torchloom.codegen.buffers.plan_reuse`; ``donated``: inputs whose buffers the
    caller gave up). ``calls(node)`` is the function a plain op node calls in place of its
    op, with the same results and effects, or None: ``mm``/``addmm`` in blocks of columns or
    rows (:meth:`GemmBlocks.callable_for <torchloom.codegen.gemm.GemmBlocks.callable_for>`:
    measured faster there in its first calls, the same bits), a codegen's ``library_call`` (see
    :mod:`torchloom.codegen.base`).
    """
    del tuple_result  # results are always a tuple; kept for the codegen protocol's callers
    guarded = graph.inputs[:guarded_inputs]
    graph, kernels = lower(graph, registry, _kernel_of(registry, kernel_for, recompose), recompose)
    fold_constants(graph, registry, kernels)  # factories only kernels read: made once
    names: dict[Value, str] = {v: f"a{i}" for i, v in enumerate(graph.inputs)}
    params = [names[v] for v in graph.inputs]
    env: dict[str, Any] = {}
    header = f"def run({', '.join(params)}):"
    checks: list[tuple[int, str]] = []
    exact: list[str] = []  # the guard expressions' two lines
    symbolic_lines: list[str] = []
    fast = None
    if guards and fallback is not None:
        checks = list(guard_expressions(guarded, env))
        if checks:
            # One condition and one call: the source stays linear in the number of inputs
            # (a branch per input, each passing every input, would be quadratic). The slow
            # path finds which input failed.
            env["_fallback"] = _first_failing(checks, env, fallback)
            # (a fake tensor mode's tensors pass the expressions: nothing to read in them)
            env["_faking"] = faking
            condition = " or ".join([*(f"({expr})" for _, expr in checks), "_faking()"])
            back = f"return _fallback(({', '.join(params)},))"
            exact = [f"    if {condition}:", f"        {back}"]
            fast = FastGuard.of([guarded[i].type for i, _ in checks])
        symbolic = symbolic_guard(guarded, env)
        if symbolic is not None:  # inputs with symbolic sizes: one generated check
            env["_guard_failed"], env["_faking"] = fallback, faking
            args = f"({', '.join(params)},)"
            symbolic_lines = [] if checks else [  # (else the exact condition asks it)
                f"    if _faking(): return _guard_failed({args}, None)"]
            symbolic_lines += [f"    if (_failed := {symbolic}) is not None:",
                               f"        return _guard_failed({args}, _failed)"]
    trusted = _trusted(graph, [graph.inputs[i] for i, _ in checks])
    # views of tensors laid out as their types say: one strided view each (restride.py)
    checked_whole = layout_checked(graph.inputs[:len(guarded)]) if symbolic_lines else []
    laid_out = fold_views(graph, registry, kernels, trusted | _trusted(graph, checked_whole))
    calls = {} if calls is None else {node: fn for node in graph.nodes if node not in kernels
                                       and (fn := calls(node)) is not None}
    reuse = plan_reuse(graph, registry, kernels, donated, calls)
    body = _Body(graph, registry, kernels, reuse, trusted, boxed, calls)
    namespace = dict(env)
    if fast is None:
        lines = exact + symbolic_lines + body.lines(dict(names), namespace, whole=False)
    else:
        # The C check passed: the static inputs are plain tensors laid out as their types
        # say, which the kernels are handed whole (their data pointers read in C). Else the
        # expressions check them, the kernels read nothing whole, and a call that passes
        # them is learnt. Both functions have two guard lines: body lines number the same.
        tensors = ", ".join(f"a{i}" for i, _ in checks)
        checked_ns = {**env, "_fast": fast}
        checked = [f"    if {condition}: {back}",
                   f"    _fast.learn({tensors})", *symbolic_lines,
                   *body.lines(dict(names), checked_ns, whole=False)]
        exec(compile("\n".join([header, *checked]) + "\n", f"<torchloom @{graph.name}>",
                     "exec"), checked_ns)
        namespace.update(_fast=fast, _checked=checked_ns["run"])
        lines = [f"    if not _fast.check({tensors}):",
                 f"        return _checked({', '.join(params)})", *symbolic_lines,
                 *body.lines(dict(names), namespace, whole=True)]
    source = "\n".join([header, *lines]) + "\n"
    exec(compile(source, f"<torchloom @{graph.name}>", "exec"), namespace)
    run_boxed = _boxed(params, lines, f"<torchloom @{graph.name}>", namespace) if boxed \
        else None
    exact_outputs = frozenset(i for i, v in enumerate(graph.outputs)
                              if v in laid_out and v.producer is not None)
    return Plan(namespace["run"], source, run_boxed, reuse, exact_outputs)


@attrs.frozen
class SubgraphCall:
    """A shared subgraph's plan as the callable of the nodes calling it: ``run`` and the
    outputs it returns laid out as their types (:attr:`Plan.exact_outputs`), which the
    caller's plan views without view ops (:func:`~torchloom.codegen.restride.fold_views`).
    The caller's statement calls ``run`` itself."""

    run: Callable[..., tuple]
    exact_outputs: frozenset[int] = frozenset()

    @classmethod
    def of(cls, plan: Plan) -> "SubgraphCall":
        return cls(plan.fn, plan.exact_outputs)

    def __call__(self, *args) -> tuple:
        return self.run(*args)


@attrs.frozen
class _Body:
    """The statements after a plan's guards."""

    graph: Graph
    registry: OpRegistry
    kernels: dict
    reuse: Reuse
    trusted: frozenset
    boxed: bool
    #: op nodes calling another function than their op's (a blocked ``mm``)
    calls: dict[Node, Callable]

    def lines(self, names: dict[Value, str], env: dict[str, Any], whole: bool) -> list[str]:
        """The body's lines, naming values in ``names`` and binding callables in ``env``
        (both filled here); ``whole``: kernels may take trusted inputs whole."""
        graph, reuse = self.graph, self.reuse
        lines: list[str] = []
        last_use = _last_uses(graph, inputs=self.boxed)
        env["_given"] = given  # (a dead buffer viewed in a kernel output's shape)
        views = [node for node in graph.nodes if node.op == RESTRIDE]
        if views:  # the sizes the views' statements read, and their function
            env["_restride"] = make_restride()
            env.update(guard_namespace())
            lines += binding_lines(graph, names, {s for node in views
                                                  for s in restride_symbols(node)})
        unread = [names[v] for v in last_use.get(-1, ()) if v not in reuse.held]
        if unread:  # inputs nothing reads (boxed): dropped once the guards passed
            lines.append("    " + " = ".join(unread) + " = None")
        # Locals are reused like registers: an output takes the name of an input that dies
        # at its node (as ``x = torch.mm(x, w)`` does), so dead values cost no statement.
        free: list[str] = []
        count = 0
        for idx, node in enumerate(graph.nodes):
            # a buffer written later stays referenced until then, under its name
            dying = [v for v in last_use.get(idx, ()) if v not in reuse.held]
            reusable = [names[v] for v in dying if v.producer not in (node, None)]
            donors = reuse.into.get(idx, ())
            for j, v in enumerate(node.outputs):
                if j < len(donors) and donors[j] is not None:
                    names[v] = names[donors[j]]  # the output is that buffer
                elif reusable:
                    names[v] = reusable.pop()
                elif free:
                    names[v] = free.pop()
                else:
                    names[v] = f"t{count}"
                    count += 1
            out = reuse.ops.get(idx)  # an op writing into a dead buffer: its out= overload
            if idx not in reuse.elided:  # (a copy_ whose input the kernel before wrote)
                lines.append("    " + _statement(node, idx, names, env, self.registry,
                                                 self.kernels, donors, out,
                                                 reuse.elided_by(node), self.trusted, whole,
                                                 self.calls.get(node)))
            dead = reusable + [names[v] for v in dying if v.producer is node]
            inputs = [names[v] for v in dying if v.producer is None]  # boxed: keep names
            if dead or inputs:  # not taken over by an output: drop the reference now
                lines.append("    " + " = ".join(dead + inputs) + " = None")
                free.extend(dead)
        outs = ", ".join(names[v] for v in graph.outputs)
        lines.append(f"    return ({outs}{',' if len(graph.outputs) == 1 else ''})")
        return lines


def _boxed(params: list[str], lines: list[str], filename: str,
           namespace: dict[str, Any]) -> Callable:
    """``run_boxed(args)``: the plan's body after taking its inputs out of ``args``, with
    the line numbers of ``run``'s body (tracebacks name a line of ``Plan.source``): the
    unpacking line takes the ``def`` line's number (the code object starts one line up; an
    AST renumbered instead cost 0.15 s for a 12-layer backward)."""
    unpack = f"{', '.join(params)}, = args; " if params else ""
    exec(compile("\n".join(["def run_boxed(args):", f"    {unpack}args.clear()", *lines]),
                 filename, "exec"), namespace)
    fn = namespace.pop("run_boxed")
    fn.__code__ = fn.__code__.replace(co_firstlineno=fn.__code__.co_firstlineno - 1)
    fn._boxed_call = True  # (what aot_autograd reads to call it boxed)
    return fn


def _kernel_of(registry: OpRegistry, kernel_for, recompose: bool) -> Callable:
    """For :func:`lower`: a region node's callable, or the graph to inline in its place."""
    def kernel_of(node: Node):
        if node.op == FUSION_GROUP and kernel_for is None:
            return node.region
        if kernel_for is not None:
            kernel = kernel_for(node)
            return kernel.graph if isinstance(kernel, RegionKernel) else kernel
        if node.op == CALL_SUBGRAPH:  # a shared subgraph of the top-level graph
            return SubgraphCall.of(build_function(
                node.graph.root.subgraphs[node.attrs["callee"]], registry, recompose=recompose))
        return build_function(node.region, registry, recompose=recompose).fn
    return kernel_of


def _first_failing(checks: list[tuple[int, str]], env: dict[str, Any],
                   fallback: Callable) -> Callable:
    """``fallback(args, index)`` with the index of the first input whose guard fails
    (None: none does, a fake tensor mode is active)."""
    def run(args: tuple):
        for i, expr in checks:
            if eval(expr, env, {f"a{i}": args[i]}):
                return fallback(args, i)
        if faking():
            return fallback(args, None)
        raise AssertionError("a guard failed, but none fails when re-checked")
    return run


def _last_uses(graph: Graph, inputs: bool = False) -> dict[int, list[Value]]:
    """Node index -> values (node outputs; with ``inputs``, graph inputs too, those never
    read under index -1) whose last use is that node."""
    outputs = set(graph.outputs)
    last: dict[Value, int] = dict.fromkeys(graph.inputs, -1) if inputs else {}
    for idx, node in enumerate(graph.nodes):
        for v in node.inputs:
            if inputs or v.producer is not None:
                last[v] = idx
        for v in node.outputs:  # unused results die right away
            last.setdefault(v, idx)
    result: dict[int, list[Value]] = {}
    for v, idx in last.items():
        if v not in outputs:
            result.setdefault(idx, []).append(v)
    return result


def _trusted(graph: Graph, checked: list[Value]) -> frozenset[Value]:
    """The guarded graph inputs (``checked``, static types) whose layout holds for the
    whole call: no op reshaping a tensor in place reads them."""
    reshaped = {v for node in graph.nodes if reshapes(node)
                for v in node.inputs}
    return frozenset(v for v in checked if v not in reshaped)


def _trusting(kernel: Callable, node: Node, donors: tuple[Value | None, ...],
              trusted: frozenset[Value], whole: bool) -> Callable:
    """``kernel`` without the layout checks of the guarded inputs it is given as they are
    (and of those given as output buffers unviewed), where it can leave them out
    (``trusting``, the codegen protocol: :mod:`torchloom.codegen.base`)."""
    method = getattr(kernel, "trusting", None)
    if method is None or not trusted:
        return kernel
    inputs = {i: v.type for i, v in enumerate(node.inputs) if v in trusted}
    outputs = {j: d.type for j, (d, v) in enumerate(zip(donors, node.outputs))
               if d in trusted and view_of(d, v) is None}
    return method(inputs, outputs, whole=whole) if inputs or outputs else kernel


def _statement(node: Node, idx: int, names: dict[Value, str], env: dict[str, Any],
               registry: OpRegistry, kernels: dict[Node, Callable],
               donors: tuple[Value | None, ...] = (), out: Callable | None = None,
               inputs_written: tuple[int, ...] = (),
               trusted: frozenset[Value] = frozenset(), whole: bool = False,
               call_as: Callable | None = None) -> str:
    outs = [names[v] for v in node.outputs]
    if node.op == CONSTANT:
        return f"{outs[0]} = {_literal(node.attrs['value'], names, node, env, idx)}"
    if node.op == RESTRIDE:
        return f"{outs[0]} = {restride_source(node, names[node.inputs[0]])}"
    fname = f"f{idx}"
    if node in kernels and donors:  # writes outputs into the dead buffers given first
        kernel = _trusting(kernels[node], node, donors, trusted, whole)
        env[fname] = kernel.into if not inputs_written else \
            _writing_inputs(kernel.into, inputs_written)
        given = ", ".join(_buffer(d, v, names) if d is not None else "None"
                          for d, v in zip(donors, node.outputs))
        args = ", ".join([f"({given}{',' if len(donors) == 1 else ''})",
                          *(names[v] for v in node.inputs)])
        call = f"{fname}({args})"
        unpack = True
    elif node in kernels:  # a region node (fusion group, shared subgraph) calls its kernel
        kernel = kernels[node]
        env[fname] = kernel.run if isinstance(kernel, SubgraphCall) else \
            _trusting(kernel, node, (), trusted, whole)
        call = f"{fname}({', '.join(names[v] for v in node.inputs)})"
        unpack = True
    else:
        opdef = registry.get(node.op)
        if opdef.fn is None:
            if node.op.startswith("python."):
                raise TypeError(f"op {node.op} is not registered: IR text never names "
                                f"Python to call")
            raise TypeError(f"op {node.op} has no callable; it must be lowered by a pass")
        env[fname] = out if out is not None else \
            call_as if call_as is not None else opdef.callable_for(node)
        args, kwargs = opdef.call_template(node)
        for k in kwargs:  # keywords become source text: never let an attribute write code
            if not (isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k)):
                raise TypeError(f"op {node.op}: keyword argument name {k!r} is not an "
                                f"identifier")
        parts = [_literal(a, names, node, env, idx) for a in args]
        parts += [f"{k}={_literal(v, names, node, env, idx)}" for k, v in kwargs.items()]
        if out is not None:  # the dead buffer the op writes (out= overload, which views it)
            parts.append(f"out={names[donors[0]]}")
        call = f"{fname}({', '.join(parts)})"
        unpack = opdef.returns_sequence or len(outs) != 1
    if not outs:
        return call
    if unpack:
        return f"{', '.join(outs)}{',' if len(outs) == 1 else ''} = {call}"
    return f"{outs[0]} = {call}"


def _writing_inputs(into: Callable, positions: tuple[int, ...]) -> Callable:
    """``into`` for a kernel writing graph inputs in place of ``copy_`` nodes the plan
    dropped (outputs ``positions``): where the kernel wrote a fresh tensor instead (a
    buffer laid out otherwise than its output), the input still gets the values."""
    def call(outs: tuple, *args):
        results = into(outs, *args)
        for j in positions:
            if results[j] is not outs[j]:
                outs[j].copy_(results[j])
        return results
    return call


def _buffer(donor: Value, output: Value, names: dict[Value, str]) -> str:
    """The dead buffer ``output`` is written into, viewed in its shape where they differ
    (dense buffers of one element count: ``buffers.view_of``; ``buffers.given``: None, the
    kernel allocating, where the buffer is not dense after all)."""
    shape = view_of(donor, output)
    return names[donor] if shape is None else f"_given({names[donor]}, {shape!r})"


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

__all__ = ["build_function", "Plan", "SubgraphCall", "FUSION_GROUP", "CONSTANT", "CALL_SUBGRAPH"]
