"""The graph IR: SSA values, nodes (optionally owning a region graph) and graphs.

A graph keeps its nodes in a doubly linked list in topological order, so inserting,
erasing and moving a node is O(1); ``position`` numbers are recomputed lazily when an
ordering question is asked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from attrs import evolve as attrs_evolve

from torchloom.errors import VerifyError
from torchloom.ir.node import Node, Value
from torchloom.ir.printer import print_graph, print_node
from torchloom.ir.symbols import is_symbol
from torchloom.ir.types import (  # noqa: F401 (InputRef: re-exported)
    Dim, InputRef, ScalarType, TensorType, Type)


#: op of a node that calls a shared subgraph of the top-level graph: ``{callee = "name"}``
CALL_SUBGRAPH = "torchloom.call_subgraph"
#: op of a fusion group: a node whose region one codegen compiles into one kernel
FUSION_GROUP = "torchloom.fusion_group"
#: the IR's own leaf op: a value the compiler binds, ``{value = ...}``
CONSTANT = "torchloom.constant"


class Graph:
    """A function: inputs, nodes in topological order, outputs."""

    def __init__(self, name: str = "main"):
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.first: Node | None = None
        self.last: Node | None = None
        self.owner: Node | None = None  # the region node, when this graph is a region
        #: shared subgraphs called by ``torchloom.call_subgraph`` nodes (top-level graph only)
        self.subgraphs: dict[str, Graph] = {}
        self.parent: Graph | None = None  # the top-level graph, when this graph is a subgraph
        self._names: set[str] = set()
        self._counter = 0
        self._len = 0
        self._positions_valid = True

    # ---- iteration -------------------------------------------------------------------
    @property
    def nodes(self) -> Iterator[Node]:
        n = self.first
        while n is not None:
            nxt = n.next
            yield n
            n = nxt

    def __len__(self) -> int:
        return self._len

    def walk(self) -> Iterator[Node]:
        """All nodes, including those inside regions (pre-order)."""
        for n in self.nodes:
            yield n
            if n.region is not None:
                yield from n.region.walk()

    def num_nodes(self) -> int:
        return sum(1 for _ in self.walk())

    # ---- shared subgraphs ------------------------------------------------------------
    @property
    def root(self) -> "Graph":
        """The top-level graph that owns the shared subgraphs (self, or a subgraph's parent)."""
        g = self
        while g.owner is not None and g.owner.graph is not None:
            g = g.owner.graph
        return g.parent if g.parent is not None else g

    def add_subgraph(self, sub: "Graph") -> "Graph":
        """Register ``sub`` as a shared subgraph of this (top-level) graph."""
        root = self.root
        if sub.name in root.subgraphs or sub.name == root.name:
            raise ValueError(f"a subgraph named @{sub.name} already exists")
        sub.parent = root
        root.subgraphs[sub.name] = sub
        return sub

    def fresh_subgraph_name(self, hint: str = "region") -> str:
        root = self.root
        taken = set(root.subgraphs) | {root.name}
        hint = _sanitize(hint)
        name, i = hint, 0
        while name in taken:
            i += 1
            name = f"{hint}{i}"
        return name

    # ---- names -----------------------------------------------------------------------
    def fresh_name(self, hint: str = "v") -> str:
        hint = _sanitize(hint)
        if hint not in self._names:
            self._names.add(hint)
            return hint
        while True:
            self._counter += 1
            name = f"{hint}_{self._counter}"
            if name not in self._names:
                self._names.add(name)
                return name

    # ---- construction ----------------------------------------------------------------
    def add_input(self, type: Type, name: str = "arg") -> Value:
        v = Value(self.fresh_name(name), type, graph=self)
        self.inputs.append(v)
        return v

    def set_outputs(self, values: Sequence[Value]) -> None:
        self.outputs = list(values)

    def set_output(self, i: int, value: Value) -> None:
        self.outputs[i] = value

    def output_slots(self) -> dict[Value, list[int]]:
        """Each output value with its slots: an index ``replace_outputs`` can keep."""
        slots: dict[Value, list[int]] = {}
        for i, v in enumerate(self.outputs):
            slots.setdefault(v, []).append(i)
        return slots

    def create(self, op: str, inputs: Sequence[Value], out_types: Sequence[Type],
               attrs: Mapping[str, Any] | None = None, *, names: Sequence[str] | None = None,
               region: "Graph | None" = None, before: Node | None = None,
               after: Node | None = None) -> Node:
        """Create a node and insert it at the end, or before/after an anchor node."""
        if names is not None and len(names) != len(out_types):
            raise ValueError(f"{op}: {len(names)} names for {len(out_types)} output(s)")
        node = Node(op, inputs, attrs, region)
        hints = names or [op.split(".")[1] if op.count(".") >= 1 else op] * len(out_types)
        node.outputs = [Value(self.fresh_name(h), t, node, i, self)
                        for i, (h, t) in enumerate(zip(hints, out_types))]
        if region is not None:
            region.owner = node
        self.insert(node, before=before, after=after)
        return node

    def insert(self, node: Node, *, before: Node | None = None, after: Node | None = None) -> Node:
        """Link a detached node into this graph and register its uses."""
        if node.graph is not None:
            raise ValueError(f"{node!r} is already in a graph")
        if before is not None and after is not None:
            raise ValueError("give before or after, not both")
        anchor = before if before is not None else after
        if anchor is not None and anchor.graph is not self:
            raise ValueError(f"anchor {anchor!r} is not in graph @{self.name}")
        node.graph = self
        for v in node.outputs:
            v.graph = self
            self._names.add(v.name)
        for v in node.inputs:
            v.uses.append(node)
        if before is not None:
            prev = before.prev
        elif after is not None:
            prev = after
        else:
            prev = self.last
        self._link(node, prev)
        self._len += 1
        return node

    def _link(self, node: Node, prev: Node | None) -> None:
        nxt = self.first if prev is None else prev.next
        node.prev, node.next = prev, nxt
        if prev is None:
            self.first = node
        else:
            prev.next = node
        if nxt is None:
            self.last = node
        else:
            nxt.prev = node
        self._positions_valid = False

    def _unlink(self, node: Node) -> None:
        if node.prev is None:
            self.first = node.next
        else:
            node.prev.next = node.next
        if node.next is None:
            self.last = node.prev
        else:
            node.next.prev = node.prev
        node.prev = node.next = None

    # ---- editing ---------------------------------------------------------------------
    def erase(self, node: Node, output_slots: Mapping[Value, list[int]] | None = None) -> None:
        """Remove a node whose outputs have no uses. ``output_slots`` (``output_slots()``,
        kept current through ``replace_uses``) answers "is it returned?" in O(1) instead
        of a scan of the outputs, for a pass erasing many nodes of a large graph."""
        if node.graph is not self:
            raise ValueError(f"{node!r} is not in graph @{self.name}")
        for v in node.outputs:
            if v.uses or (output_slots.get(v) if output_slots is not None
                          else v in self.outputs):
                raise ValueError(f"cannot erase {node!r}: {v!r} is still used")
        for v in node.inputs:
            v.uses.remove(node)
        self._unlink(node)
        node.graph = None
        self._len -= 1

    def is_dead(self, value: Value) -> bool:
        """Whether nothing reads ``value``: no node and not this graph's ``return``
        (``value.uses`` alone misses the latter; see :mod:`torchloom.ir.liveness`)."""
        return not value.uses and not any(v is value for v in self.outputs)

    def erase_many(self, nodes: Sequence[Node]) -> None:
        """Remove nodes whose outputs are read only by each other (a replaced region);
        one pass over the graph's outputs instead of one per node."""
        doomed = set(nodes)
        outputs = set(self.outputs)
        for node in doomed:
            if node.graph is not self:
                raise ValueError(f"{node!r} is not in graph @{self.name}")
            for v in node.outputs:
                if v in outputs or any(u not in doomed for u in v.uses):
                    raise ValueError(f"cannot erase {node!r}: {v!r} is still used")
        read = {v for node in doomed for v in node.inputs}
        for v in read:  # one filter per value: a value read by all of them stays linear
            v.uses[:] = [u for u in v.uses if u not in doomed]
        for node in doomed:
            self._unlink(node)
            node.graph = None
        self._len -= len(doomed)

    # ---- unchecked moves (passes that keep their own order invariant) ----------------
    def detach(self, node: Node) -> None:
        """Take ``node`` out of this graph's order in O(1), leaving every use list as it is:
        the caller re-points or sweeps the entries of ``node`` (or inserts it elsewhere)."""
        if node.graph is not self:
            raise ValueError(f"{node!r} is not in graph @{self.name}")
        self._unlink(node)
        node.graph = None
        self._len -= 1

    def move_node(self, node: Node, after: Node | None) -> None:
        """Put ``node`` directly after ``after`` (at the front when None) in O(1), taking
        it from whichever graph or region holds it; its outputs' names are claimed here
        (renamed when taken). Neither order nor use lists are checked or changed: the
        caller keeps the order topological (fusion does, through its own ordinals)."""
        if after is not None and after.graph is not self:
            raise ValueError(f"anchor {after!r} is not in graph @{self.name}")
        if node is after:
            return
        old = node.graph
        if old is not None:
            old._unlink(node)
            old._len -= 1
        self._link(node, after)
        self._len += 1
        if old is not self:
            node.graph = self
            for v in node.outputs:
                v.graph = self
                self.claim_name(v)

    def claim_name(self, value: Value) -> None:
        """Register ``value``'s name in this graph, renaming the value when it is taken."""
        if value.name in self._names:
            value.name = self.fresh_name(value.name)
        else:
            self._names.add(value.name)

    def release_name(self, name: str) -> None:
        """Forget a name no value of this graph carries any more (it may be claimed again)."""
        self._names.discard(name)

    def reset_names(self, names: Sequence[str]) -> None:
        """After a pass renamed every value of this graph: ``names`` are the names now
        taken, and fresh names count from the start again."""
        self._names = set(names)
        self._counter = 0

    def rename(self, names: Mapping[Value, str], *, reset: bool = False) -> None:
        """Rename values of this graph to names no other value of it carries. ``reset``:
        they are all its values, their names the only ones taken (see ``reset_names``)."""
        if reset:
            self.reset_names(list(names.values()))
        else:
            self._names.update(names.values())
        for v, name in names.items():
            v.name = name

    def set_type(self, value: Value, type: Type) -> None:
        """Retype ``value`` (its readers' types stay the caller's to keep right)."""
        value.type = type

    def replace_all_uses(self, old: Value, new: Value) -> int:
        """Point every use of ``old`` (and graph outputs) at ``new``; returns the count."""
        if old is new:
            return 0
        count = _move_uses(old, new)
        if old in self.outputs:  # (a scan in C; the loop only when there is work)
            for i, v in enumerate(self.outputs):
                if v is old:
                    self.outputs[i] = new
                    count += 1
        return count

    def replace_uses(self, mapping: Mapping[Value, Value],
                     output_slots: dict[Value, list[int]] | None = None) -> int:
        """``replace_all_uses`` for many values at once, with one scan of the graph
        outputs (replacing values one by one scans them once per value), or none with
        ``output_slots`` (see ``replace_outputs``). A value mapped to must not itself be
        a key."""
        count = 0
        for old, new in mapping.items():
            if old is not new:
                count += _move_uses(old, new)
        return count + self.replace_outputs(mapping, output_slots)

    def replace_outputs(self, mapping: Mapping[Value, Value],
                        output_slots: dict[Value, list[int]] | None = None) -> int:
        """Output slots holding a key of ``mapping`` return its value; returns the count.
        With ``output_slots`` (from ``output_slots()``, outputs changed since only through
        it): found there in O(1) per value, and kept up to date."""
        if output_slots is None:
            slots = [(i, mapping[v]) for i, v in enumerate(self.outputs)
                     if v in mapping and mapping[v] is not v]
        else:
            slots = []
            for old, new in mapping.items():
                found = output_slots.pop(old, None) if old is not new else None
                if found:
                    output_slots.setdefault(new, []).extend(found)
                    slots += [(i, new) for i in found]
        for i, new in slots:
            self.outputs[i] = new
        return len(slots)

    def renumber(self) -> None:
        """Recompute ``Node.position`` (topological order index)."""
        if self._positions_valid:
            return
        for i, n in enumerate(self.nodes):
            n.position = i
        self._positions_valid = True

    def can_move_before(self, node: Node, anchor: Node) -> str | None:
        """Why ``node`` cannot move directly before ``anchor`` (None when it can)."""
        for n in (node, anchor):
            if n.graph is not self:
                return f"{n!r} is not in graph @{self.name}"
        self.renumber()
        dest = anchor.position - 0.5  # the slot just before the anchor
        for v in node.inputs:
            p = v.producer
            if p is not None and p.graph is self and p.position >= dest:
                return f"input {v!r} is defined at or after the destination"
        for u in node.users():
            if u.graph is self and u.position <= dest and u is not node:
                return f"user {u.op} of {node!r} would come before it"
        return None

    def move_before(self, node: Node, anchor: Node) -> None:
        """Move ``node`` directly before ``anchor``; raises if that breaks topological order."""
        if node is anchor:
            return
        reason = self.can_move_before(node, anchor)
        if reason is not None:
            raise VerifyError(f"cannot move {node!r} before {anchor!r}: {reason}")
        self._unlink(node)
        self._link(node, anchor.prev)

    def can_move_to_end(self, node: Node) -> str | None:
        """Why ``node`` cannot become the last node (None when it can)."""
        if node.graph is not self:
            return f"{node!r} is not in graph @{self.name}"
        for u in node.users():
            if u.graph is self:
                return f"user {u.op} of {node!r} would come before it"
        return None

    def move_after(self, node: Node, anchor: Node) -> None:
        """Move ``node`` directly after ``anchor``; raises if that breaks topological order."""
        if node is anchor:
            return
        if anchor.next is None:
            reason = self.can_move_to_end(node) or (
                None if anchor.graph is self else f"{anchor!r} is not in graph @{self.name}")
            if reason is not None:
                raise VerifyError(f"cannot move {node!r} after {anchor!r}: {reason}")
            self._unlink(node)
            self._link(node, self.last)
            return
        if anchor.next is not node:
            self.move_before(node, anchor.next)

    def clone(self) -> "Graph":
        """A deep copy (regions included). Names are kept."""
        return clone_graph(self)[0]

    def __str__(self) -> str:
        return print_graph(self)


def clone_graph(graph: Graph, name: str | None = None, *,
                dim: Callable[[Dim], Dim] | None = None,
                attr: Callable[[Any], Any] | None = None) -> tuple[Graph, dict[Value, Value]]:
    """Deep-copy a graph; returns the copy and the value mapping old -> new. ``dim`` maps
    every size of every tensor type (shapes and strides; regions and subgraphs too) and
    ``attr`` every attribute value as stored (a list stays a list for ``attr`` to walk):
    the same program at other sizes, built as such (``torchloom reduce`` shrinks a dim
    so), never by editing a copy or its printed text."""
    def retype(t: Type) -> Type:
        if dim is not None and isinstance(t, ScalarType) and t.size is not None:
            size = dim(t.size)  # an int that is a size: mapped with the dims
            return ScalarType(t.kind, size=size if is_symbol(size) else None)
        if dim is None or not isinstance(t, TensorType):
            return t
        return attrs_evolve(t, shape=tuple(dim(d) for d in t.shape), strides=None
                            if t.strides is None else tuple(dim(d) for d in t.strides))

    g = Graph(name or graph.name)
    mapping: dict[Value, Value] = {}
    for v in graph.inputs:
        nv = Value(v.name, retype(v.type), graph=g)
        g._names.add(v.name)
        g.inputs.append(nv)
        mapping[v] = nv
    for n in graph.nodes:
        region = (clone_graph(n.region, dim=dim, attr=attr)[0]
                  if n.region is not None else None)
        nn = Node(n.op, [mapping[v] for v in n.inputs],
                  n.attrs if attr is None else {k: attr(a) for k, a in n.attrs.items()}, region)
        if region is not None:
            region.owner = nn
        nn.outputs = [Value(v.name, retype(v.type), nn, i, g) for i, v in enumerate(n.outputs)]
        nn.meta = dict(n.meta)
        g.insert(nn)
        mapping.update(zip(n.outputs, nn.outputs))
    g.outputs = [mapping[v] for v in graph.outputs]
    g._counter = graph._counter
    for sub in graph.subgraphs.values():
        g.add_subgraph(clone_graph(sub, dim=dim, attr=attr)[0])
    return g, mapping


_NAME = re.compile(r"[A-Za-z0-9_]+\Z")
_NOT_NAME_CHAR = re.compile(r"[^A-Za-z0-9_]")


def _sanitize(hint: str) -> str:
    """An ASCII name the text form can read back (``%[A-Za-z0-9_]+``)."""
    if _NAME.match(hint):
        return hint
    return _NOT_NAME_CHAR.sub("_", hint) or "v"


def node_error(node: Node, message: str) -> VerifyError:
    """A VerifyError that shows the offending node as printed IR."""
    where = node.graph.name if node.graph is not None else "?"
    return VerifyError(f"in graph @{where}: {message}\n  {print_node(node)}")


def _move_uses(old: Value, new: Value) -> int:
    """Point every node input reading ``old`` at ``new`` (graph outputs are the caller's);
    returns the count of inputs changed."""
    count = 0
    for user in list(old.uses):
        for i, v in enumerate(user.inputs):
            if v is old:
                user.inputs[i] = new
                count += 1
    new.uses.extend(old.uses)
    old.uses.clear()
    return count
