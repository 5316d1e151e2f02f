"""Provenance of decomposed composites: which primitives stand for which composite op.

``fusion.decompose`` replaces a composite (``native_layer_norm``, ``_softmax``,
``gelu_backward``, ``addmm``, ...) by primitives so that a codegen can fuse them. Where the
primitives end up running op by op with torch (the ``eager`` codegen, or outside any
group), the composite was one kernel and the primitives are many; the runtime then runs
the composite again (:mod:`torchloom.codegen.recompose`). For that, every primitive of one
decomposition *instance* carries an attribute::

    decomposed = ["<fingerprint>", role, [slot, ...]]

- ``role``: the node's index in the instance;
- one ``slot`` per input: ``>= 0`` is the instance value it reads (the instance's results
  numbered in role order), ``< 0`` is the composite's input ``-(slot + 1)``;

and the role-0 node also carries::

    composite = ["<op>", [[attr, value], ...], [input, ...], [output, ...]]

- one ``input`` per composite input: ``-1`` (read through the slots), ``k`` (the same
  value as input ``k``) or ``[dtype, shape, strides, device]`` (the decomposition does
  not read it, so any tensor of that type gives the same results);
- one ``output`` per composite output: the instance value holding it, or ``-1`` (no
  instance value holds it: unused, or one of the inputs).

The fingerprint hashes everything the instance consists of (ops, attributes, types,
wiring, the composite's description), never value names, so alpha-equivalent graphs stay
alpha-equivalent. :func:`find_instances` accepts an instance only when its nodes are all
present, once, wired and typed exactly as marked: a pass that edited, merged, dropped or
moved one of them makes the instance run as primitives (slower, never wrong)::

    %mean = aten.mean.dim(%x) {decomposed = ["3f0c...", 0, [-1]], composite = [...], ...}
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from torchloom.ir.graph import Graph, InputRef, Node, Value
from torchloom.ir.text import format_attr, format_attrs, format_type
from torchloom.ir.types import TensorType

DECOMPOSED = "decomposed"
COMPOSITE = "composite"
_MARKS = (DECOMPOSED, COMPOSITE)


@attrs.frozen(eq=False)
class Instance:
    """A complete, verified decomposition instance found in a graph."""

    op: str
    attrs: dict[str, Any]
    #: per composite input: the value it reads, or the type of a tensor it does not read
    inputs: tuple[Value | TensorType, ...]
    #: per composite output: the instance value holding it, or None
    outputs: tuple[Value | None, ...]
    #: the instance's nodes in role order
    nodes: tuple[Node, ...]


def mark_decomposition(op: str, attrs_: dict[str, Any], inputs: Sequence[Value],
                       nodes: Sequence[Node], outputs: Sequence[Value | None]) -> bool:
    """Mark ``nodes`` (the primitives replacing composite ``op(*inputs) {attrs_}``, in
    order) as one instance; ``outputs[j]`` is the value now standing for the composite's
    output ``j`` (None when nothing does). Returns False, marking nothing, when the
    instance could not be run as the composite again (it reads a value that is neither
    its own nor a composite input, skips an input whose type is not static, or the
    composite's attributes refer to its inputs by ``$i``)."""
    if not nodes or _has_input_ref(tuple(attrs_.values())):
        return False  # ``$i`` in the first primitive's attributes would bind its own inputs
    ids: dict[Value, int] = {}
    for n in nodes:
        for v in n.outputs:
            ids[v] = len(ids)
    first_k: dict[Value, int] = {}
    for k, v in enumerate(inputs):
        first_k.setdefault(v, k)
    slots: list[tuple[int, ...]] = []
    read: set[int] = set()
    for n in nodes:
        row = []
        for v in n.inputs:
            if v in ids:
                row.append(ids[v])
            elif v in first_k:
                row.append(-(first_k[v] + 1))
                read.add(first_k[v])
            else:
                return False
        slots.append(tuple(row))
    in_desc: list[Any] = []
    for k, v in enumerate(inputs):
        if first_k[v] != k:
            in_desc.append(first_k[v])
        elif k in read:
            in_desc.append(-1)
        elif isinstance(v.type, TensorType) and v.type.is_static:
            t = v.type
            in_desc.append((t.dtype, t.shape, t.strides, t.device))
        else:
            return False
    out_desc = tuple(ids.get(v, -1) if v is not None else -1 for v in outputs)
    composite = (op, tuple((k, attrs_[k]) for k in sorted(attrs_)), tuple(in_desc), out_desc)
    fp = _fingerprint(composite, nodes, slots, [v.type for v in inputs])
    for role, (n, row) in enumerate(zip(nodes, slots)):
        marks = {DECOMPOSED: (fp, role, row)}
        if role == 0:
            marks[COMPOSITE] = composite
        n.with_attrs(**marks)
    return True


def _has_input_ref(value: Any) -> bool:
    if isinstance(value, InputRef):
        return True
    return isinstance(value, (tuple, list)) and any(_has_input_ref(v) for v in value)


def is_marked(node: Node) -> bool:
    return DECOMPOSED in node.attrs


def unmarked_attrs(node: Node) -> dict[str, Any]:
    """The node's attributes without the provenance marks."""
    return {k: v for k, v in node.attrs.items() if k not in _MARKS}


def find_instances(graph: Graph) -> list[Instance]:
    """Every complete, unedited decomposition instance among ``graph``'s nodes (not
    looking into regions), in the order of their first node."""
    marked = [n for n in graph.nodes if _mark(n) is not None]
    if not marked:
        return []
    parent: dict[Node, Node] = {n: n for n in marked}

    def find(n: Node) -> Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    reader: dict[tuple, Node] = {}
    for n in marked:
        fp, _, slots = _mark(n)
        for v, s in zip(n.inputs, slots):
            if s >= 0:  # an instance value: join its producer's instance
                p = v.producer
                if p is not None and p in parent and _mark(p)[0] == fp:
                    parent[find(n)] = find(p)
            else:  # readers of the same value as the same composite input: one instance
                other = reader.setdefault((fp, s, v), n)
                parent[find(n)] = find(other)
    components: dict[Node, list[Node]] = {}
    for n in marked:
        components.setdefault(find(n), []).append(n)
    outputs = set(graph.outputs)
    found = []
    for members in components.values():
        inst = _verify(members, outputs)
        if inst is not None:
            found.append(inst)
    return found


def _mark(node: Node) -> tuple | None:
    mark = node.attrs.get(DECOMPOSED)
    if not (isinstance(mark, (tuple, list)) and len(mark) == 3 and isinstance(mark[0], str)
            and isinstance(mark[1], int) and isinstance(mark[2], (tuple, list))
            and len(mark[2]) == len(node.inputs)
            and all(isinstance(s, int) for s in mark[2])):
        return None
    return mark


def _verify(members: list[Node], graph_outputs: set[Value]) -> Instance | None:
    by_role: dict[int, Node] = {}
    for n in members:
        role = _mark(n)[1]
        if role in by_role:
            return None  # the same primitive twice (a pass copied or merged one)
        by_role[role] = n
    if sorted(by_role) != list(range(len(by_role))):
        return None
    nodes = [by_role[r] for r in range(len(by_role))]
    composite = nodes[0].attrs.get(COMPOSITE)
    if not (isinstance(composite, (tuple, list)) and len(composite) == 4):
        return None
    op, pairs, in_desc, out_desc = composite
    values = [v for n in nodes for v in n.outputs]
    member_set = set(nodes)
    found: dict[int, Value] = {}
    slots = []
    for n in nodes:
        row = _mark(n)[2]
        slots.append(tuple(row))
        for v, s in zip(n.inputs, row):
            if s >= 0:
                if s >= len(values) or values[s] is not v:
                    return None
            elif found.setdefault(-s - 1, v) is not v:
                return None
    inputs: list[Value | TensorType] = []
    for k, desc in enumerate(in_desc):
        if desc == -1 and k in found:
            inputs.append(found[k])
        elif isinstance(desc, int) and 0 <= desc < k and k not in found \
                and isinstance(inputs[desc], Value):
            inputs.append(inputs[desc])
        elif isinstance(desc, (tuple, list)) and len(desc) == 4 and k not in found:
            dtype, shape, strides, device = desc
            inputs.append(TensorType(shape, dtype, device, strides))
        else:
            return None
    if any(k >= len(in_desc) for k in found):
        return None
    outs: list[Value | None] = []
    for j in out_desc:
        if not isinstance(j, int) or j >= len(values):
            return None
        outs.append(values[j] if j >= 0 else None)
    exported = {v for v in outs if v is not None}
    for v in values:  # only the composite's outputs may be read from outside
        if v not in exported and (v in graph_outputs or
                                  any(u not in member_set for u in v.uses)):
            return None
    types = [v.type if isinstance(v, Value) else v for v in inputs]
    if _fingerprint(composite, nodes, slots, types) != _mark(nodes[0])[0]:
        return None
    return Instance(op, {k: v for k, v in pairs}, tuple(inputs), tuple(outs), tuple(nodes))


def _fingerprint(composite: Sequence[Any], nodes: Iterable[Node], slots: Iterable[Sequence[int]],
                 input_types: Sequence[Any]) -> str:
    lines = [format_attr(tuple(composite)), ",".join(map(format_type, input_types))]
    for n, row in zip(nodes, slots):
        lines.append(f"{n.op}({','.join(map(str, row))}){format_attrs(unmarked_attrs(n))}:"
                     f"{','.join(format_type(v.type) for v in n.outputs)}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


__all__ = ["DECOMPOSED", "COMPOSITE", "Instance", "mark_decomposition", "find_instances",
           "is_marked", "unmarked_attrs"]
