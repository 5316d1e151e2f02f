"""``verify(graph)``: the IR invariants every pass must keep.

- SSA and dominance: each input of a node is a graph input or an output of an earlier
  node of the same graph; regions are isolated (they read only their own inputs).
- Use lists: ``value.uses`` lists exactly the input slots that read the value.
- Types: output types agree with the op's shape/dtype inference (when it can infer).
- Python ops: a ``python.*`` op must be registered (text never names Python to call).
- Known ops: every other op is registered or is a torch op (with a registry).
- Regions: a region's inputs and outputs match its node's inputs and outputs in number
  and type.
- Shared subgraphs: every ``torchloom.call_subgraph`` names (``callee``) a subgraph of the
  top-level graph whose inputs and outputs match the call's; subgraphs do not recurse.
"""

from __future__ import annotations

from operator import attrgetter

from torchloom.errors import VerifyError
from torchloom.ir.graph import CALL_SUBGRAPH, CONSTANT, Graph, Node, node_error
from torchloom.ir.text import format_type
from torchloom.ir.types import TensorType, attrs_key


def verify(graph: Graph, registry=None, *, only: set[Graph] | None = None,
           unchanged: set[Graph] | None = None, typed: dict | None = None) -> None:
    """Raise :class:`VerifyError` (showing the node in printed IR) on the first violation.

    ``registry`` (an :class:`~torchloom.ops.registry.OpRegistry`) enables type checks.
    ``only``: check just these units (the top-level graph, shared subgraphs), for a caller
    that knows the others are unchanged since they were last verified (the pass manager
    compares snapshots); calls into a checked subgraph are checked wherever they are.
    ``unchanged``: regions known to be unchanged since they were last verified, nested
    regions included; only how they fit their node is checked again.
    ``typed``: a dict the caller keeps between calls (one pipeline run): node -> its op,
    attributes and types when their inference last agreed, and each such signature (op,
    attributes by :func:`~torchloom.ir.types.attrs_key`, input and output types) -> True.
    A node whose op, attributes, input and output types are still those objects, or whose
    signature agreed on another node (a copy a pass made: a shared layer's subgraph), is
    not inferred again (inference is a function of them, as the registry's memo of it
    assumes); the structural checks still see every node.
    """
    if only is not None and not only:
        return
    for name, sub in graph.subgraphs.items():
        if sub.name != name or sub.parent is not graph:
            raise VerifyError(f"in graph @{graph.name}: subgraph entry {name!r} does not point "
                              f"back at its graph (name @{sub.name})")
    callee_changed = only is not None and any(sub in only for sub in graph.subgraphs.values())
    for unit in (graph, *graph.subgraphs.values()):
        if only is None or unit in only:
            _verify_graph(unit, registry, unchanged, typed)
        elif callee_changed:
            for node in unit.walk():  # unchanged, but a callee may have changed
                if node.op == CALL_SUBGRAPH:
                    _verify_call(node)
    _check_no_recursion(graph)


_TYPE = attrgetter("type")
_ONES = (1, 1)


def _typed_key(node: Node) -> tuple:
    """What ``typed`` holds for a node: its op, attributes and types (the objects)."""
    inputs = node.inputs
    return (node.op, node.attrs, len(inputs), *map(_TYPE, inputs), *map(_TYPE, node.outputs))


def _signature(node: Node) -> tuple | None:
    """A node's op, attributes and types as a key equal for a copy of it (None where an
    attribute is unhashable: such a node is known by itself only)."""
    try:
        return (node.op, attrs_key(node.attrs), len(node.inputs), *map(_TYPE, node.inputs),
                *map(_TYPE, node.outputs))
    except TypeError:
        return None


def agreed_types(graph: Graph) -> dict:
    """A ``typed`` dict (see :func:`verify`) holding each op node of ``graph`` as it is
    now, and its signature, as if its inference had agreed: for a frontend whose types are
    the ops' own inference (the FX importer: torch's fake tensors of the graph it traced),
    so that the first check infers again only the nodes a pass has changed since."""
    typed: dict = {}
    for node in graph.nodes:
        if node.region is None and node.op != CALL_SUBGRAPH:
            typed[node] = _typed_key(node)
            signature = _signature(node)
            if signature is not None:
                typed[signature] = True
    return typed


def check_order(graph: Graph) -> None:
    """The one check that ``verify = "off"`` keeps: every node reads only values defined
    before it (in its graph, its regions, the shared subgraphs), so that no later pass and
    no runtime build walks a cycle. Linear in the number of inputs; no type inference."""
    for unit in (graph, *graph.subgraphs.values()):
        _check_order(unit)


def _check_order(graph: Graph) -> None:
    defined = set(graph.inputs)
    for count, node in enumerate(graph.nodes, 1):
        if count > len(graph):
            raise node_error(node, "node list is corrupt (it loops)")
        for i, v in enumerate(node.inputs):
            if v not in defined:
                raise node_error(node, f"input {i} (%{v.name}) is used before it is defined "
                                       f"(a cycle, or nodes out of order)")
        if node.region is not None:
            _check_order(node.region)
        defined.update(node.outputs)
    for i, v in enumerate(graph.outputs):
        if v not in defined:
            raise VerifyError(f"in graph @{graph.name}: output {i} (%{v.name}) is not "
                              f"defined in this graph")


def _callees(graph: Graph) -> set[str]:
    return {n.attrs.get("callee") for n in graph.walk() if n.op == CALL_SUBGRAPH}


def _check_no_recursion(root: Graph) -> None:
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise VerifyError(f"shared subgraphs call each other recursively: "
                              f"{' -> '.join('@' + p for p in path + [name])}")
        state[name] = 1
        for callee in sorted(_callees(root.subgraphs[name])):
            visit(callee, path + [name])
        state[name] = 2

    for name in root.subgraphs:
        visit(name, [])


def _verify_call(node: Node) -> None:
    callee = node.attrs.get("callee")
    root = node.graph.root
    if node.region is not None:
        raise node_error(node, "a call_subgraph node has no region (it names a callee)")
    if not isinstance(callee, str) or callee not in root.subgraphs:
        known = ", ".join("@" + k for k in root.subgraphs) or "none"
        raise node_error(node, f"callee {callee!r} is not a subgraph of @{root.name} "
                               f"(known: {known})")
    _check_signature(node, root.subgraphs[callee], f"@{callee}", "call")


def _verify_graph(graph: Graph, registry, unchanged: set[Graph] | None = None,
                  typed: dict | None = None) -> None:
    defined = set(graph.inputs)
    use_counts: dict = {}
    names = set()
    for v in graph.inputs:
        _check_name(graph, v.name, names, None)
    count = 0
    prev = None
    node = graph.first
    while node is not None:  # (the linked list itself: no generator per node)
        count += 1
        if node.graph is not graph or node.prev is not prev:
            raise node_error(node, "node list is corrupt (wrong graph or broken links)")
        prev = node
        inputs = node.inputs
        for i, v in enumerate(inputs):
            if v not in defined:
                if v.graph is not graph:
                    raise node_error(node, f"input {i} (%{v.name}) is not defined in this "
                                           f"graph (regions may only read their own inputs)")
                raise node_error(node, f"input {i} (%{v.name}) is used before it is defined")
        # each input read k times must list this node k times; the common cases (distinct
        # inputs, a value with one use) without counting
        distinct = len(inputs) < 2 or (len(inputs) == 2 and inputs[0] is not inputs[1])
        for v, k in (zip(inputs, _ONES) if distinct else _counts(inputs).items()):
            uses = v.uses
            if len(uses) == 1 and k == 1:
                have = 1 if uses[0] is node else 0
            else:
                recorded = use_counts.get(v)
                if recorded is None:  # counted once per value: linear in the number of uses
                    recorded = use_counts[v] = _counts(uses)
                have = recorded.get(node, 0)
            if have != k:
                raise node_error(node, f"use list of %{v.name} records this node {have} "
                                       f"time(s), but it is read {k} time(s)")
        for i, v in enumerate(node.outputs):
            if v.producer is not node or v.index != i:
                raise node_error(node, f"output %{v.name} does not point back at its node")
            if v.name in names:
                _check_name(graph, v.name, names, node)
            names.add(v.name)
            for u in v.uses:
                if u.graph is None or v not in u.inputs:
                    raise node_error(node, f"%{v.name} lists a use by {u.op} that does not "
                                           f"read it (dangling use)")
            defined.add(v)
        if node.op == CALL_SUBGRAPH:
            _verify_call(node)
        elif node.region is not None:
            _verify_region(node, registry, unchanged, typed)
        elif registry is not None:
            if typed is None:
                _verify_types(node, registry)
            else:
                key = _typed_key(node)
                if typed.get(node) != key:  # (identity first: types compare only if new)
                    signature = _signature(node)
                    if signature not in typed:
                        _verify_types(node, registry)
                        if signature is not None:
                            typed[signature] = True
                    typed[node] = key
        node = node.next
    if count != len(graph):
        raise VerifyError(f"in graph @{graph.name}: node count {len(graph)} disagrees with "
                          f"the node list ({count})")
    for v in graph.inputs:
        for u in v.uses:
            if u.graph is None or v not in u.inputs:
                raise VerifyError(f"in graph @{graph.name}: input %{v.name} lists a use by "
                                  f"{u.op} that does not read it (dangling use)")
    for i, v in enumerate(graph.outputs):
        if v not in defined:
            raise VerifyError(f"in graph @{graph.name}: output {i} (%{v.name}) is not "
                              f"defined in this graph")


def _counts(items) -> dict:
    """How often each item occurs (``Counter`` without its per-call overhead)."""
    out: dict = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def _check_name(graph: Graph, name: str, names: set, node: Node | None) -> None:
    if name in names:
        msg = f"value name %{name} is defined twice"
        if node is None:
            raise VerifyError(f"in graph @{graph.name}: {msg}")
        raise node_error(node, msg)
    names.add(name)


def _check_signature(node: Node, body: Graph, what: str, caller: str) -> None:
    """``body``'s inputs and outputs match ``node``'s in number and type."""
    if len(body.inputs) != len(node.inputs):
        raise node_error(node, f"{what} has {len(body.inputs)} inputs, the {caller} passes "
                               f"{len(node.inputs)}")
    if len(body.outputs) != len(node.outputs):
        raise node_error(node, f"{what} returns {len(body.outputs)} values, the {caller} "
                               f"declares {len(node.outputs)} outputs")
    for i, (outer, inner) in enumerate(zip(node.inputs, body.inputs)):
        if outer.type is not inner.type and outer.type != inner.type:
            raise node_error(node, f"{what} input {i} is {format_type(inner.type)} but the "
                                   f"{caller} passes {format_type(outer.type)}")
    for i, (outer, inner) in enumerate(zip(node.outputs, body.outputs)):
        if not _same_type(outer.type, inner.type):
            raise node_error(node, f"{what} output {i} is {format_type(inner.type)} but the "
                                   f"{caller} declares {format_type(outer.type)}")


def _verify_region(node: Node, registry, unchanged: set[Graph] | None = None,
                   typed: dict | None = None) -> None:
    region = node.region
    if region.owner is not node:
        raise node_error(node, "region does not point back at its node")
    _check_signature(node, region, "region", "node")
    if unchanged is None or region not in unchanged:
        _verify_graph(region, registry, unchanged, typed)


def _same_type(a, b) -> bool:
    """Equal shape, dtype and device; strides are layout facts that codegens may choose."""
    if a is b:
        return True
    if isinstance(a, TensorType) and isinstance(b, TensorType):
        return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
    return a == b


def _verify_types(node: Node, registry) -> None:
    if node.op.startswith("python.") and registry.lookup(node.op) is None:
        raise node_error(node, f"op {node.op} is not in the op registry: IR text never "
                               f"names Python to import or call; a Python callable is an op "
                               f"only when the frontend (for the FX graph it imports) or a "
                               f"plugin (torchloom_ops) registers it")
    if node.op != CONSTANT and registry.lookup(node.op) is None:
        raise node_error(node, f"op {node.op} is unknown: no plugin registers it "
                               f"(torchloom_ops) and torch has no op of that name; a pass "
                               f"may only create ops the registry knows")
    opdef = registry.get(node.op)
    if opdef.category == "opaque" and opdef.fn is None:
        return
    inferred = opdef.infer_types(node)
    if inferred is None:
        return
    if len(inferred) != len(node.outputs):
        raise node_error(node, f"{node.op} produces {len(inferred)} values, the node has "
                               f"{len(node.outputs)} outputs")
    for i, (v, t) in enumerate(zip(node.outputs, inferred)):
        if not _same_type(v.type, t):
            raise node_error(node, f"output {i} (%{v.name}) is declared "
                                   f"{format_type(v.type)} but {node.op} gives {format_type(t)}")
