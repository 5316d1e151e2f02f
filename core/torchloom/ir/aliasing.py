"""The aliasing and mutation rule, checked: a pass must not make a graph output share
storage with a graph input or with another output, nor write an input in place, unless
the graph the pipeline received already did; and it must keep every write to an input.

Eager PyTorch gives the caller of ``y = f(x)`` a fresh ``y`` unless ``f`` returned a view
of ``x``; torch.compile's wrappers (aot_autograd) rely on the graph they hand to the backend
for which outputs are views of which inputs and which inputs are written. A pass that
rewrites ``%y = aten.mul.Tensor(%x) {other = 1.0}`` into ``%x`` returns the input itself:
``y.add_(1)`` would then change ``x``. :func:`alias_facts` records what a graph aliases
and writes; :func:`check_aliasing` rejects a graph that aliases or writes more.

What aliases what comes from the op registry (``OpDef.aliased_input``: views, and ops
that return an input they write) and from region bodies: a fusion group or a call of a
shared subgraph returns an input of the node when its body returns that input or a view
of it. Every other result is fresh storage.
"""

from __future__ import annotations

from typing import Any

import attrs

from torchloom.errors import VerifyError
from torchloom.ir.graph import CALL_SUBGRAPH, Graph, Node, Value


@attrs.frozen
class AliasFacts:
    """What a graph aliases and writes, by position (value names may change)."""

    #: (output index, input index): the output is the input or a view of it
    output_input: frozenset[tuple[int, int]] = frozenset()
    #: (i, j) with i < j: outputs i and j share storage (the same value, or views of one)
    output_output: frozenset[tuple[int, int]] = frozenset()
    #: inputs some node writes in place (directly or through a view of them)
    mutated: frozenset[int] = frozenset()


def alias_facts(graph: Graph, registry) -> AliasFacts:
    """The aliasing and mutation facts of ``graph`` (a top-level graph)."""
    analysis = _Analysis(registry, graph.root)
    roots, mutated = analysis.summary(graph)
    pairs = {(i, r) for i, r in enumerate(roots) if isinstance(r, int)}
    by_root: dict[Any, list[int]] = {}
    for i, r in enumerate(roots):
        by_root.setdefault(r, []).append(i)
    shared = {(a, b) for same in by_root.values() if len(same) > 1
              for k, a in enumerate(same) for b in same[k + 1:]}
    return AliasFacts(frozenset(pairs), frozenset(shared), frozenset(mutated))


def returned_storage(graph: Graph, registry) -> set[Value]:
    """The values of ``graph`` whose storage a graph output shares: each output and what
    it is a view of, back to the value that owns the storage. A pass merging two of these
    (cse) would make two outputs one tensor."""
    analysis = _Analysis(registry, graph.root)
    found: set[Value] = set()
    for value in graph.outputs:
        while value not in found:
            found.add(value)
            source = analysis.source_of(value)
            if source is None:
                break
            value = source
    return found


def written_storage(graph: Graph, registry) -> set[Value]:
    """The values of ``graph`` whose storage some node of it writes in place: the written
    value itself, what it views, and every other view of that storage. Reading one of them
    before and after the write gives two results (cse must not merge such readers, nor
    fold a copy into one)."""
    analysis = _Analysis(registry, graph.root)
    index = {v: i for i, v in enumerate(graph.inputs)}
    targets = {analysis.root_of(node.inputs[slot], index)
               for node in graph.nodes for slot in analysis._written_slots(node)}
    if not targets:
        return set()
    values = [*graph.inputs, *(v for node in graph.nodes for v in node.outputs)]
    return {v for v in values if analysis.root_of(v, index) in targets}


def shared_outputs(node: Node, registry) -> list[int]:
    """Outputs of a region node that share storage with one of its inputs or with another
    of its outputs (its body returns an input, a view, or one value twice). Running the
    body op by op keeps that sharing; a kernel that writes each output to a buffer of its
    own does not."""
    body = node.region
    if body is None:
        return []
    roots = _Analysis(registry, node.graph.root if node.graph else body).summary(body)[0]
    seen: dict[Any, int] = {}
    for r in roots:
        if not isinstance(r, int):
            seen[r] = seen.get(r, 0) + 1
    return [i for i, r in enumerate(roots) if isinstance(r, int) or seen[r] > 1]


def check_aliasing(graph: Graph, registry, allowed: AliasFacts) -> None:
    """Raise :class:`VerifyError` when ``graph`` aliases or writes what ``allowed`` (the
    facts of the graph the pipeline received) does not."""
    facts = alias_facts(graph, registry)
    for i, k in sorted(facts.output_input - allowed.output_input):
        out, inp = graph.outputs[i], graph.inputs[k]
        what = "is input" if out is inp else "is a view of input"
        raise VerifyError(
            f"in graph @{graph.name}: output {i} (%{out.name}) {what} {k} (%{inp.name}), "
            f"which it was not in the graph the pipeline received: a compiled output may "
            f"alias an input only where eager's did (a caller writing the output, "
            f"y.add_(1), would change the input); return a fresh value (keep the op, or "
            f"aten.clone.default) instead")
    for i, j in sorted(facts.output_output - allowed.output_output):
        a, b = graph.outputs[i], graph.outputs[j]
        raise VerifyError(
            f"in graph @{graph.name}: outputs {i} (%{a.name}) and {j} (%{b.name}) share "
            f"storage, which they did not in the graph the pipeline received: a caller "
            f"writing one would change the other; keep them separate values")
    for k in sorted(facts.mutated - allowed.mutated):
        raise VerifyError(
            f"in graph @{graph.name}: input {k} (%{graph.inputs[k].name}) is written in "
            f"place, which it was not in the graph the pipeline received: a pass may "
            f"write an input only where the program did")
    for k in sorted(allowed.mutated - facts.mutated):
        raise VerifyError(
            f"in graph @{graph.name}: input {k} (%{graph.inputs[k].name}) is no longer "
            f"written in place, but the program wrote it: the caller sees that write, so "
            f"a pass must keep it (a copy of a view of the input, or an out-of-place op, "
            f"loses it)")


class _Analysis:
    """Per-body summaries (what each output aliases, which inputs are written), computed
    once per graph body: a shared subgraph called many times is analysed once."""

    def __init__(self, registry, root: Graph):
        self.registry, self.root = registry, root
        self.summaries: dict[Graph, tuple[list[Any], set[int]]] = {}
        #: op -> whether it writes an input (CALL_SUBGRAPH: look at the callee)
        self.writes: dict[str, bool] = {CALL_SUBGRAPH: True}
        #: op -> its definition when some output aliases an input, else None
        self.views: dict[str, Any] = {}

    def summary(self, graph: Graph) -> tuple[list[Any], set[int]]:
        """For each output, the input index it aliases (an int) or the fresh value it
        is; and the input indices written in place."""
        done = self.summaries.get(graph)
        if done is not None:
            return done
        index = {v: i for i, v in enumerate(graph.inputs)}
        mutated: set[int] = set()
        writes = self.writes
        for node in graph.nodes:
            op = node.op
            if not writes.get(op, True) and node.region is None:  # most nodes: one lookup
                continue
            for slot in self._written_slots(node):
                root = self.root_of(node.inputs[slot], index)
                if isinstance(root, int):
                    mutated.add(root)
        done = ([self.root_of(v, index) for v in graph.outputs], mutated)
        self.summaries[graph] = done
        return done

    def root_of(self, value: Value, index: dict[Value, int]) -> Any:
        """The input index ``value`` is or views, else what owns its storage."""
        while value not in index:
            source = self.source_of(value)
            if source is None:
                node = value.producer
                body = self._body(node) if node is not None else None
                if body is not None and value.index < len(body.outputs):
                    # fresh per call (two calls are two tensors), shared by the outputs
                    # the body returns from one storage
                    return (node, self.summary(body)[0][value.index])
                return value
            value = source
        return index[value]

    def source_of(self, value: Value) -> Value | None:
        """The value (in the same graph) that ``value`` is or views, if any: the
        aliased input of a view, or the node input a region body returns (a view of)."""
        node = value.producer
        if node is None:
            return None
        body = self._body(node)
        if body is not None:
            roots = self.summary(body)[0]
            root = roots[value.index] if value.index < len(roots) else None
            return node.inputs[root] if isinstance(root, int) else None
        opdef = self.views.get(node.op, False)
        if opdef is False:  # once per op: most ops alias nothing
            found = self.registry.lookup(node.op)
            opdef = self.views[node.op] = found if found is not None and found.aliases else None
        if opdef is None:
            return None
        source = opdef.aliased_input(node, value.index)
        return node.inputs[source] if source is not None else None

    def _written_slots(self, node: Node) -> list[int]:
        body = self._body(node)
        if body is not None:
            return sorted(self.summary(body)[1])
        opdef = self.registry.lookup(node.op)
        self.writes[node.op] = opdef is not None and bool(opdef.mutates)
        if not self.writes[node.op]:
            return []
        return opdef.mutated_inputs(node)

    def _body(self, node: Node) -> Graph | None:
        if node.region is not None:
            return node.region
        if node.op == CALL_SUBGRAPH:
            return self.root.subgraphs.get(node.attrs.get("callee"))
        return None
