"""Building and merging fusion groups, in time proportional to what moves.

A *cluster* is a fusible plain node or a ``torchloom.fusion_group`` node. The
:class:`GroupEditor` of one pass run keeps, for every node of the graph, an ordinal that
agrees with the list order (a merged group inherits the ordinal of the slot it occupies),
so topological questions are answered without renumbering the graph:

- merging A (earlier) and B (later) at B's slot is valid when every other user of A's
  outputs comes after B;
- merging at A's slot is valid when every input of B not produced by A is defined
  before A.

Either slot keeps the list topologically ordered, so no merge creates a cycle. A merge
moves the nodes of the smaller region into the larger one (a plain producer moves
straight into its consumer's region); inputs and outputs are reconnected in
O(inputs + outputs), never by rebuilding the group. The surgery itself is the IR's
(:class:`~torchloom.ir.regions.RegionEditor`): use lists are swept once, by
:meth:`GroupEditor.finish`, so a value read by thousands of nodes costs nothing per merge;
this module keeps fusion's rules (which merges are valid, and at which slot).

Every merge records what it may have made mergeable elsewhere
(:meth:`GroupEditor.take_touched`), so that a pass can revisit just those clusters
until nothing merges (:mod:`torchloom_fusion.closure`) instead of sweeping the whole graph
again.

Mutation hazards: values are split into alias classes (views and in-place results join
their source). A cluster that touches a class some node writes is *pinned*: it may join a
group only when no mutating node lies between its old and new place.
"""

from __future__ import annotations

import bisect

import attrs

from torchloom.api import (GATHER_OPS, Graph, Node, Pass, PassContext, RegionEditor, TensorType,
                           Value)

from torchloom_fusion.fusibility import REDUCTION, VIEW, compatible, is_group, node_kind, \
    numel, reads_column_result, reduction_signature


#: validator of a pass option that counts something: an int >= 1
POSITIVE = [attrs.validators.instance_of(int), attrs.validators.ge(1)]


@attrs.frozen
class GroupLimits(Pass):
    """The options of every fusion pass that builds groups: a group's distinct inputs
    stay within ``max_group_inputs`` and its outputs within ``max_group_outputs``."""

    max_group_inputs: int = attrs.field(default=128, validator=POSITIVE)
    max_group_outputs: int = attrs.field(default=64, validator=POSITIVE)

    def editor(self, graph: Graph, ctx: PassContext) -> GroupEditor:
        return GroupEditor(graph, ctx.registry, self.max_group_inputs, self.max_group_outputs,
                           gathers=ctx.codegen == "cpu")


class GroupEditor:
    """Per-run state of a fusion pass over one graph (never stored between runs)."""

    def __init__(self, graph: Graph, registry, max_inputs: int, max_outputs: int,
                 gathers: bool = False):
        self.graph, self.registry = graph, registry
        #: whether gathers (``fusibility.GATHERS``) join groups: the cpu codegen takes them
        self.gathers = gathers
        self.max_inputs, self.max_outputs = max_inputs, max_outputs
        self.order: dict[Node, int] = {}
        self.mutation_points: list[int] = []
        for i, node in enumerate(graph.nodes):
            self.order[node] = i
            if not is_group(node) and registry.get(node.op).mutates:
                self.mutation_points.append(i)
        #: the IR's region surgery, with use lists swept by finish()
        self.edit = RegionEditor(graph)
        #: the graph's output values (kept up to date by the surgery)
        self.graph_outputs = self.edit.graph_outputs
        self._kind: dict[Node, str | None] = {}
        self._sigs: dict[Node, frozenset] = {}
        self._domain: dict[Node, tuple] = {}
        self.hazard_values = self._mutated_alias_values() if self.mutation_points else set()
        self.merges = 0
        self.created = 0
        #: groups made by merges, and producers whose readers moved past others, since
        #: the last take_touched()
        self._merged: set[Node] = set()
        self._passed: set[Node] = set()

    def finish(self) -> None:
        """Sweep stale entries from use lists; call before anyone else reads them."""
        self.edit.close()

    # ---- classification --------------------------------------------------------------
    def kind(self, node: Node) -> str | None:
        """``group``, ``pointwise``, ``reduction``, ``view`` or None (not a cluster)."""
        if node not in self._kind:
            if is_group(node):
                self._kind[node] = "group"
            elif node.region is not None:
                self._kind[node] = None
            else:
                self._kind[node] = node_kind(node, self.registry, self.gathers)
        return self._kind[node]

    def signatures(self, node: Node) -> frozenset:
        found = self._sigs.get(node)
        if found is None:
            if is_group(node):
                found = frozenset(reduction_signature(n) for n in node.region.nodes
                                  if self.registry.get(n.op).category == REDUCTION)
            elif self.kind(node) == REDUCTION:
                found = frozenset([reduction_signature(node)])
            else:
                found = frozenset()
            self._sigs[node] = found
        return found

    def domain(self, node: Node) -> tuple:
        """The largest iteration space of a cluster (numel of its biggest tensor)."""
        found = self._domain.get(node)
        if found is None:
            values = []
            if is_group(node):
                for n in node.region.nodes:
                    values.extend(n.outputs)
                    if self.registry.get(n.op).category == REDUCTION:
                        values.append(n.inputs[0])
            else:
                values.extend(node.outputs)
                if self.kind(node) == REDUCTION:
                    values.append(node.inputs[0])
            found = max((numel(v.type) for v in values), default=(0, (), 1))
            self._domain[node] = found
        return found

    def _merge_domains(self, merged: Node, a: Node, b: Node) -> None:
        """The domain of ``a`` and ``b`` merged, when both are known; else it is found
        from the merged region when asked (vertical fusion never asks)."""
        da, db = self._domain.get(a), self._domain.get(b)
        if da is not None and db is not None:
            self._domain[merged] = max(da, db)
        else:
            self._domain.pop(merged, None)

    def device(self, node: Node) -> str | None:
        for v in node.outputs:
            if isinstance(v.type, TensorType):
                return v.type.device
        return None

    def pinned(self, node: Node) -> bool:
        hv = self.hazard_values
        return bool(hv) and (any(v in hv for v in node.inputs) or
                             any(v in hv for v in node.outputs))

    def _mutated_alias_values(self) -> set[Value]:
        """Values in an alias class that some node writes in place."""
        parent: dict[Value, Value] = {}

        def find(v: Value) -> Value:
            root = v
            while parent.get(root, root) is not root:
                root = parent[root]
            while parent.get(v, v) is not root:
                parent[v], v = root, parent[v]
            return root

        def union(a: Value, b: Value) -> None:
            ra, rb = find(a), find(b)
            if ra is not rb:
                parent[ra] = rb

        written: list[Value] = []
        values: list[Value] = list(self.graph.inputs)
        for node in self.graph.nodes:
            values.extend(node.outputs)
            if is_group(node):
                for out, src in _group_aliases(node, self.registry):
                    union(out, src)
                continue
            opdef = self.registry.get(node.op)
            for i in range(len(node.outputs)):
                src = opdef.aliased_input(node, i)
                if src is not None:
                    union(node.outputs[i], node.inputs[src])
            written.extend(node.inputs[i] for i in opdef.mutated_inputs(node))
        roots = {find(v) for v in written}
        return {v for v in values if find(v) in roots}

    # ---- checks ----------------------------------------------------------------------
    def gather_indices(self, node: Node) -> list[Value]:
        """The values a cluster's gathers (``GATHER_OPS``) read as indices, as its inputs:
        never computed in the gather's group, but read from memory (T5's relative position
        buckets, ``log`` and ``where`` over ``[q, k]``, gathered for each of ``H`` heads,
        were computed again for each head: its inference 10 % slower)."""
        if not is_group(node):
            return [node.inputs[1]] if node.op in GATHER_OPS else []
        inner = {n.inputs[1] for n in node.region.nodes if n.op in GATHER_OPS}
        return [v for v, w in zip(node.inputs, node.region.inputs) if w in inner]

    def fits(self, node: Node) -> bool:
        """A cluster alone respects the input and output limits."""
        inputs = node.inputs
        return (len(inputs) <= self.max_inputs or len(set(inputs)) <= self.max_inputs) \
            and len(node.outputs) <= self.max_outputs

    def can_merge(self, a: Node, b: Node, slot_a: bool = True) -> str | None:
        """Which slot (``"a"`` or ``"b"``) merging clusters a (earlier) and b can use,
        or None when no valid merge exists. O(inputs + uses of a's outputs).
        ``slot_a=False``: the caller knows slot ``"a"`` is invalid (an input of b comes
        from a node between a and b), so it is not checked again."""
        g, order = self.graph, self.order
        oa, ob = order[a], order[b]
        # a's outputs read by others than b stay group outputs ("kept"); slot b needs
        # every such reader after b. (First: the usual reason to refuse, found cheaply.)
        count = len(a.outputs) + len(b.outputs) > self.max_outputs
        kept, late = 0, True
        for v in a.outputs:
            read = v in self.graph_outputs
            for u in v.uses:
                if u is not b and u.graph is g:
                    read = True
                    if not late or order[u] <= ob:  # (once late is False, read suffices)
                        late = False
                        break
            kept += read
            if not late and not count:
                break
        if not (late or slot_a) or count and kept + len(b.outputs) > self.max_outputs:
            return None
        if not late and not self._inputs_before(b, a):
            return None  # only slot "a" could hold: checked first, siblings on a path refuse
        if self.device(a) != self.device(b):
            return None
        if self.gathers and any(v.producer is a for v in self.gather_indices(b)):
            return None  # (a kernel would compute each index once per element of its row)
        sa, sb = self.signatures(a), self.signatures(b)
        if (len(sa) > 1 or len(sb) > 1 or (sa and sb and sa != sb)) and (
                not compatible(sa | sb) or reads_column_result(
                    (a, b), lambda n: self.registry.get(n.op).category == REDUCTION)):
            return None  # reductions over other rows, or a column result read in the kernel
        if len(a.inputs) + len(b.inputs) > self.max_inputs:  # else the limit holds anyway
            inputs = set(a.inputs)
            inputs.update(v for v in b.inputs if v.producer is not a)
            if len(inputs) > self.max_inputs:
                return None
        blocked = self._mutation_between(oa, ob)
        if late and not (blocked and self.pinned(a)):
            return "b"
        if slot_a and not (blocked and self.pinned(b)) and (
                not late or self._inputs_before(b, a)):
            return "a"
        return None

    def _inputs_before(self, b: Node, a: Node) -> bool:
        """Every input of b is a graph input or made by a or before it (slot "a")."""
        order, oa = self.order, self.order[a]
        return all(v.producer is None or v.producer is a or order[v.producer] < oa
                   for v in b.inputs)

    def _mutation_between(self, lo: int, hi: int) -> bool:
        pts = self.mutation_points
        if not pts:
            return False
        i = bisect.bisect_right(pts, lo)
        return i < len(pts) and pts[i] < hi

    # ---- edits -----------------------------------------------------------------------
    def try_merge(self, x: Node, y: Node, slot_a: bool = True) -> Node | None:
        """Merge two clusters into one group when valid; returns the group or None.
        ``slot_a``: as for :meth:`can_merge`."""
        a, b = (x, y) if self.order[x] < self.order[y] else (y, x)
        slot = self.can_merge(a, b, slot_a)
        if slot is None:
            return None
        if slot == "b":  # a's content moves past the other readers of its producers
            self._passed.update(v.producer for v in a.inputs if v.producer is not None)
        if is_group(b) and not is_group(a):
            merged = self.absorb_producer(a, b, slot)
        else:
            merged = self.merge(self.wrap(a), self.wrap(b), slot)
        self._merged.add(merged)
        return merged

    def take_touched(self) -> set[Node]:
        """The clusters whose merge options the merges since the last call may have
        changed: each merged group (new inputs, outputs, siblings), its consumers (a new
        producer; after slot ``"a"`` their other producers may now precede them) and,
        where an earlier part moved later (slot ``"b"``), its producers and their other
        consumers (a reader that stood before them has moved past them). Collected once
        per call, however often a group grew in between."""
        g = self.graph
        sources = {n for n in (*self._merged, *self._passed) if n.graph is g}
        touched = set(sources)
        for node in sources:
            for v in node.outputs:
                touched.update(u for u in v.uses if u.graph is g)
        self._merged, self._passed = set(), set()
        return touched

    def absorb_producer(self, p: Node, group: Node, slot: str) -> Node:
        """Move plain node ``p`` (earlier) to the start of ``group``'s region: the fast
        path of vertical fusion (no one-node group is built for ``p``)."""
        exported = self.edit.absorb(p, group, at=p if slot == "a" else group)
        self._inherit_hazards(exported.items())
        if slot == "a":
            self.order[group] = self.order[p]
        sp = self.signatures(p)
        if sp:
            self._sigs[group] = self.signatures(group) | sp
        self._merge_domains(group, group, p)
        for cache in (self._sigs, self._domain, self._kind):
            cache.pop(p, None)
        del self.order[p]
        self.merges += 1
        return group

    def wrap(self, node: Node) -> Node:
        """The node itself if it is a group, else a new one-node group in its place."""
        if is_group(node):
            return node
        olds = list(node.outputs)
        group = self.edit.wrap(node)
        self._inherit_hazards(zip(olds, group.outputs))
        self.order[group] = self.order.pop(node)
        self._sigs[group] = self.signatures(node)
        if node in self._domain:
            self._domain[group] = self._domain[node]
        self._kind[group] = "group"
        self.created += 1
        return group

    def _inherit_hazards(self, pairs) -> None:
        """A value replacing a pinned one (old -> new pairs) is pinned too."""
        hv = self.hazard_values
        for old, new in pairs:
            if old in hv:
                hv.add(new)

    def merge(self, a: Node, b: Node, slot: str) -> Node:
        """Merge groups ``a`` (earlier) and ``b``; the result sits at ``slot``."""
        place = a if slot == "a" else b
        host = self.edit.merge(a, b, at=place)
        guest = b if host is a else a
        self.order[host] = self.order[place]
        del self.order[guest]
        self._sigs[host] = self.signatures(a) | self.signatures(b)
        self._merge_domains(host, a, b)
        for cache in (self._sigs, self._domain, self._kind):
            cache.pop(guest, None)
        self.merges += 1
        return host


def _group_aliases(group: Node, registry) -> list[tuple[Value, Value]]:
    """Pairs of values sharing storage across a group: an output and the group input it
    is (a view of), and two outputs of one storage (a value and its view, both returned:
    a write to one is seen through the other)."""
    region = group.region
    root: dict[Value, object] = {v: i for i, v in enumerate(region.inputs)}
    for n in region.nodes:
        opdef = registry.get(n.op)
        for i, v in enumerate(n.outputs):
            src = opdef.aliased_input(n, i)
            root[v] = root.get(n.inputs[src], n.inputs[src]) if src is not None else v
    pairs: list[tuple[Value, Value]] = []
    first: dict[object, Value] = {}
    for i, v in enumerate(region.outputs):
        r = root.get(v, v)
        if isinstance(r, int):
            pairs.append((group.outputs[i], group.inputs[r]))
        elif r in first:
            pairs.append((group.outputs[i], first[r]))
        else:
            first[r] = group.outputs[i]
    return pairs


def starts_group(kind: str | None) -> bool:
    """Views never form a group alone: outside a group they cost nothing."""
    return kind is not None and kind != VIEW
