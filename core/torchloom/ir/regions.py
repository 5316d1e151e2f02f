"""Region surgery: the edits that build, grow and trim region nodes (fusion groups, or any
node owning a region), each keeping use lists consistent by construction.

One-off edits of a region node's inputs and outputs keep every use list exact at once::

    add_region_input(group, outer, "v_in")    # a new parameter reading ``outer``
    add_subgraph_input(sub, outer, "v_in")     # the same for a shared subgraph's calls
    remove_region_input(group, i)             # a parameter nothing inside reads
    select_region_inputs(group, [2, 0])       # keep and reorder parameters
    select_region_outputs(group, [0, 2])      # keep and reorder results

A :class:`RegionEditor` grows regions of one graph in time proportional to what moves
(wrap a node into a group, absorb a producer into a group, merge two groups). A node that
moves into a region stops reading the outer values it read; its entries in their use
lists are left *stale* (the node is no longer in the value's graph) and are swept once
when the editor closes, so that a value read by thousands of nodes costs nothing per
move::

    with RegionEditor(graph) as edit:
        group = edit.wrap(node)               # before: %y = aten.exp(%x)
        edit.absorb(producer, group, at=group)
        merged = edit.merge(group, other, at=other)
    # here every value's uses are exactly the nodes reading it

Inside the ``with`` block a use list may hold stale entries: a reader counts when it is in
the value's graph (:func:`live_uses`). Whether a move is *legal* (topological order,
what may share a kernel) is the caller's rule; these edits keep the list order
topological when the caller's slot is valid (see :meth:`RegionEditor.merge`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from torchloom.ir.graph import CALL_SUBGRAPH, FUSION_GROUP, Graph, Node, Value


# ---- one-off edits of a region node's inputs and outputs --------------------------------
def add_region_input(node: Node, outer: Value, name: str) -> Value:
    """Pass ``outer`` to region node ``node`` as a new last input; returns the parameter
    (of ``outer``'s type, named after ``name``) that reads it inside the region."""
    inner = node.region.add_input(outer.type, name)
    node.inputs.append(outer)
    outer.uses.append(node)
    return inner


def subgraph_calls(sub: Graph) -> list[Node]:
    """The ``torchloom.call_subgraph`` nodes, anywhere under ``sub``'s top-level graph
    (regions and shared subgraphs included), that call shared subgraph ``sub``."""
    root = sub.root
    return [n for g in (root, *root.subgraphs.values()) for n in g.walk()
            if n.op == CALL_SUBGRAPH and n.attrs.get("callee") == sub.name]


def add_subgraph_input(sub: Graph, outer: Value, name: str) -> Value:
    """Pass ``outer``, an input of the top-level graph owning shared subgraph ``sub``, to
    ``sub`` as a new last input at every call (each a node of the top-level graph's own
    list, where ``outer`` is visible); returns ``sub``'s new parameter (of ``outer``'s
    type, named after ``name``). Raises ``ValueError`` where a call is elsewhere."""
    root = sub.root
    if root is sub or root.subgraphs.get(sub.name) is not sub:
        raise ValueError(f"@{sub.name} is no shared subgraph of a top-level graph")
    if outer not in root.inputs:
        raise ValueError(f"%{outer.name} is no input of @{root.name}")
    calls = subgraph_calls(sub)
    elsewhere = [c for c in calls if c.graph is not root]
    if elsewhere:
        raise ValueError(f"@{sub.name} is called inside a region or subgraph "
                         f"({elsewhere[0]}), where %{outer.name} is not visible")
    inner = sub.add_input(outer.type, name)
    for call in calls:
        call.inputs.append(outer)
        outer.uses.append(call)
    return inner


def remove_region_input(node: Node, i: int) -> None:
    """Drop input ``i`` of region node ``node`` and its parameter, which nothing inside the
    region may read."""
    _check_unread(node, i)
    outer = node.inputs.pop(i)
    outer.uses.remove(node)
    node.region.inputs.pop(i)


def select_region_inputs(node: Node, slots: Sequence[int]) -> None:
    """Keep the inputs of region node ``node`` at ``slots``, in that order (a reorder
    when ``slots`` is a permutation); the parameters of dropped inputs must be unread."""
    kept = set(slots)
    if len(kept) != len(slots):
        raise ValueError(f"{node.op}: input slots {list(slots)} repeat")
    region = node.region
    for i, v in enumerate(node.inputs):
        if i not in kept:
            _check_unread(node, i)
            v.uses.remove(node)
    region.inputs = [region.inputs[i] for i in slots]
    node.inputs = [node.inputs[i] for i in slots]


def select_region_outputs(node: Node, slots: Sequence[int]) -> None:
    """Keep the outputs of region node ``node`` at ``slots``, in that order (with the
    region's matching results); a dropped output must be read by no node (the caller
    knows it is no graph output)."""
    kept = set(slots)
    if len(kept) != len(slots):
        raise ValueError(f"{node.op}: output slots {list(slots)} repeat")
    for i, v in enumerate(node.outputs):
        if i not in kept and v.uses:
            raise ValueError(f"cannot drop output {v!r} of {node.op}: it is still read")
    region = node.region
    region.outputs = [region.outputs[i] for i in slots]
    node.outputs = [node.outputs[i] for i in slots]
    for i, v in enumerate(node.outputs):
        v.index = i


def _check_unread(node: Node, i: int) -> None:
    param = node.region.inputs[i]
    if param.uses or param in node.region.outputs:
        raise ValueError(f"cannot drop input {i} of {node.op}: its parameter {param!r} is read")


def live_uses(v: Value) -> list[Node]:
    """The entries of ``v``'s use list whose node is in ``v``'s graph (inside a
    :class:`RegionEditor`, the others are stale)."""
    home = v.graph
    return [u for u in v.uses if u.graph is home]


def read_by_other(v: Value, other: Node) -> bool:
    """Whether a node of ``v``'s graph other than ``other`` reads ``v`` (stale entries
    skipped; the first entry usually answers)."""
    home = v.graph
    for u in v.uses:
        if u is not other and u.graph is home:
            return True
    return False


class RegionEditor:
    """Wraps, absorbs and merges region nodes of ``graph`` with deferred use-list sweeps.

    Graph outputs are redirected through an index kept here (O(1) per value), so the
    graph's outputs change only through this editor while it is open. :meth:`close` (or
    leaving the ``with`` block) sweeps the stale use entries.
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        #: each graph output value with its slots in ``graph.outputs``
        self._slots = graph.output_slots()
        #: values whose use lists may hold entries of nodes that left their graph
        self._dirty: set[Value] = set()

    def __enter__(self) -> "RegionEditor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def graph_outputs(self):
        """The graph's output values (a live, read-only set-like view)."""
        return self._slots.keys()

    def close(self) -> None:
        """Sweep stale entries from use lists: afterwards every value's uses are exactly
        the nodes reading it. The editor may go on being used (and closed again)."""
        for v in self._dirty:
            home = v.graph
            v.uses[:] = [u for u in v.uses if u.graph is home]
        self._dirty.clear()

    # ---- redirects ---------------------------------------------------------------------
    def redirect(self, old: Value, new: Value) -> None:
        """Point every live reader of ``old`` (graph outputs included) at ``new``."""
        live = live_uses(old)
        for user in dict.fromkeys(live):
            user.inputs = [new if x is old else x for x in user.inputs]
        new.uses.extend(live)
        old.uses.clear()
        self.graph.replace_outputs({old: new}, self._slots)

    # ---- wrap, absorb, merge -------------------------------------------------------------
    def wrap(self, node: Node, op: str = FUSION_GROUP, name: str | None = None) -> Node:
        """A new region node ``op`` (a fusion group) in ``node``'s place, whose region
        (``name``, by default ``fused_<first output>``) holds ``node`` alone; its inputs
        are ``node``'s distinct inputs and its outputs replace ``node``'s.

        before::

            %y = aten.exp.default(%x) : f32[4]

        after::

            %y = torchloom.fusion_group(%x) : f32[4] region @fused_y(%x: f32[4]) {
              %y = aten.exp.default(%x) : f32[4]
              return %y
            }
        """
        g = self.graph
        region = Graph(name or f"fused_{node.outputs[0].name}")
        inner_of: dict[Value, Value] = {}
        for v in node.inputs:
            if v not in inner_of:
                inner_of[v] = region.add_input(v.type, v.name)
        group = Node(op, list(inner_of), region=region)
        region.owner = group
        group.outputs = [Value(v.name, v.type, group, i, g) for i, v in enumerate(node.outputs)]
        g.insert(group, before=node)  # the group takes the node's place in each use list
        for old, new in zip(node.outputs, group.outputs):
            self.redirect(old, new)
        self._dirty.update(inner_of)  # the node's entries go stale: it moves inside
        g.detach(node)
        node.inputs = [inner_of[v] for v in node.inputs]
        region.insert(node)  # registers the uses of the parameters; claims the names
        region.set_outputs(list(node.outputs))
        return group

    def absorb(self, producer: Node, group: Node, at: Node) -> dict[Value, Value]:
        """Move plain node ``producer`` (before ``group``) to the start of ``group``'s
        region; the group then stands at ``at``'s place (``group`` or ``producer``).
        Outputs of ``producer`` read outside the group (or returned) become new group
        outputs; returns them, each ``producer`` output -> the group output replacing it.

        Slot ``group`` is valid when every other reader of ``producer`` comes after the
        group; slot ``producer`` when every input of the group is defined before it."""
        g, region = self.graph, group.region
        outer, inner = group.inputs, region.inputs  # (the group's own lists)
        inner_of = {u: inner[outer.index(u)] for u in producer.inputs if u in outer}
        exported: dict[Value, Value] = {}
        drop: list[int] = []
        for out in producer.outputs:
            outer_users = [u for u in out.uses if u is not group and u.graph is g]
            out.uses.clear()
            if outer_users or out in self._slots:  # still read outside: export it
                new = Value(out.name, out.type, group, len(group.outputs), g)
                group.outputs.append(new)
                region.outputs.append(out)
                for user in dict.fromkeys(outer_users):
                    user.inputs = [new if x is out else x for x in user.inputs]
                new.uses.extend(outer_users)
                g.replace_outputs({out: new}, self._slots)
                exported[out] = new
            if out in outer:  # the group read it: its parameter's readers read it now
                for i, v in enumerate(outer):
                    if v is out:
                        region.replace_all_uses(inner[i], out)
                        region.release_name(inner[i].name)
                        drop.append(i)
        for i in sorted(drop, reverse=True):
            del outer[i], inner[i]
        before = producer.prev
        region.move_node(producer, None)  # first in the region; claims its names
        new_outer: list[Value] = []
        for u in producer.inputs:
            if u not in inner_of:  # the producer's new inputs come first, in its order
                inner_of[u] = Value(region.fresh_name(u.name), u.type, graph=region)
                new_outer.append(u)
                u.uses.append(group)
            self._dirty.add(u)  # the producer's entry goes stale
        if new_outer:
            outer[:0] = new_outer
            inner[:0] = [inner_of[u] for u in new_outer]
        producer.inputs = [inner_of[u] for u in producer.inputs]
        for v in producer.inputs:
            v.uses.append(producer)
        if at is producer:
            g.move_node(group, before)
        return exported

    def merge(self, a: Node, b: Node, at: Node) -> Node:
        """Merge region nodes ``a`` (earlier) and ``b`` into one, standing at ``at``'s
        place (``a`` or ``b``); returns it. The nodes of the smaller region move into the
        larger one (the *host*, which survives); ``b``'s inputs made by ``a`` become
        internal, and ``a``'s outputs read by no one but ``b`` (nor returned) are dropped.

        Slot ``b`` is valid when every other reader of ``a``'s outputs comes after ``b``;
        slot ``a`` when every input of ``b`` not made by ``a`` is defined before ``a``.

        before::

            %a = torchloom.fusion_group(%x) : f32[4] region @g0(%p: f32[4]) {
              %e = aten.exp.default(%p) : f32[4]
              return %e
            }
            %b = torchloom.fusion_group(%a) : f32[4] region @g1(%q: f32[4]) {
              %t = aten.tanh.default(%q) : f32[4]
              return %t
            }

        after::

            %b = torchloom.fusion_group(%x) : f32[4] region @g0(%p: f32[4]) {
              %e = aten.exp.default(%p) : f32[4]
              %t = aten.tanh.default(%e) : f32[4]
              return %t
            }
        """
        g = self.graph
        ra, rb = a.region, b.region
        a_index = {v: i for i, v in enumerate(a.inputs)}
        outer_in, inner_in = list(a.inputs), list(ra.inputs)
        substitute: list[tuple[Value, Value]] = []
        for u, bi in zip(b.inputs, rb.inputs):
            if u.producer is a:
                substitute.append((bi, ra.outputs[u.index]))
            elif u in a_index:
                substitute.append((bi, inner_in[a_index[u]]))
            else:
                a_index[u] = len(outer_in)
                outer_in.append(u)
                inner_in.append(bi)
        for bi, target in substitute:
            rb.replace_all_uses(bi, target)
            rb.release_name(bi.name)  # the name is free again for moved values
        kept = [i for i, v in enumerate(a.outputs) if read_by_other(v, b) or v in self._slots]
        outer_out = [a.outputs[i] for i in kept] + list(b.outputs)
        inner_out = [ra.outputs[i] for i in kept] + list(rb.outputs)
        host, guest = (a, b) if len(ra) >= len(rb) else (b, a)
        # use lists: only the host's entries change; the guest's go stale (it leaves)
        _reread(host, outer_in)
        self._dirty.update(guest.inputs)
        region = host.region
        anchor = region.last if host is a else None
        for n in list(guest.region.nodes):  # in order, to the end (or the start) of host's
            region.move_node(n, anchor)
            anchor = n
        region.inputs = inner_in
        for v in inner_in:
            if v.graph is not region:
                v.graph = region
                region.claim_name(v)
        region.outputs = inner_out
        host.inputs = outer_in
        host.outputs = outer_out
        for i, v in enumerate(outer_out):
            v.producer, v.index = host, i
        if at is not host:
            g.move_node(host, at.prev)
        g.detach(guest)
        guest.region = None
        return host


def _reread(node: Node, inputs: list[Value]) -> None:
    """Make ``node``'s use entries those of reading ``inputs`` (its inputs to be): entries
    it loses go first (in its inputs' order), then those it gains (in ``inputs``' order)."""
    have, want = Counter(node.inputs), Counter(inputs)
    for u in node.inputs:
        if have[u] > want[u]:
            u.uses.remove(node)
            have[u] -= 1
    for u in inputs:
        if want[u] > have[u]:
            u.uses.append(node)
            have[u] += 1
