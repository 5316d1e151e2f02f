"""Fusion merges driven to their fixpoint within one pass run.

A sweep over the graph merges what it can in one visit per cluster, but a merge can
make other merges valid: a producer whose other reader has just moved past its
consumer, a consumer whose other producers now precede it, two groups that now share an
input. Sweeping the whole graph again (what a fixpoint of passes does) finds them one
layer per sweep, so a deep graph took a sweep per layer and never converged within the
pipeline's ``max_iterations``. Instead, every merge records the clusters it may have
affected (``GroupEditor.take_touched``) and :meth:`Fusion.settle` revisits exactly those,
latest first, until no merge happens: the work is proportional to the merges, and
running the pass again finds nothing to do.
"""

from __future__ import annotations

import heapq

from torchloom.api import Node, Value

from torchloom_fusion.fusibility import is_group
from torchloom_fusion.groups import GroupEditor, starts_group


class Fusion:
    """The vertical rule (a consumer absorbs its producers) and the sibling rule (clusters
    reading one value merge), applied by sweeps and then to touched clusters."""

    def __init__(self, ed: GroupEditor, *, vertical: bool, siblings: bool,
                 max_siblings: int = 8):
        self.ed, self.graph = ed, ed.graph
        self.vertical, self.siblings = vertical, siblings
        self.max_siblings = max_siblings

    # ---- sweeps ----------------------------------------------------------------------
    def sweep_consumers(self) -> None:
        """Visit every node from the last: each cluster absorbs its producers. (The list
        is taken first: a group that moves to an earlier slot skips no node.)"""
        for node in reversed(list(self.graph.nodes)):
            if node.graph is self.graph:
                self._absorb_if_consumer(node)

    def sweep_values(self) -> None:
        """Visit every value, in order: clusters that read it merge when they may."""
        graph = self.graph
        values: list[Value] = list(graph.inputs)
        for node in graph.nodes:
            values.extend(node.outputs)
        for v in values:
            self._merge_readers(v)

    def settle(self) -> None:
        """Revisit touched clusters, latest first, until no merge touches any."""
        ed, graph = self.ed, self.graph
        while True:
            batch = sorted(ed.take_touched(), key=ed.order.__getitem__, reverse=True)
            if not batch:
                return
            seen: set[Value] = set()
            for node in batch:
                if node.graph is not graph:
                    continue  # merged away earlier in this batch
                if self.vertical and (is_group(node) or not self.siblings):
                    node = self._absorb_if_consumer(node)
                if self.siblings and node.graph is graph:
                    for v in list(node.inputs):
                        if v not in seen:
                            seen.add(v)
                            self._merge_readers(v)

    # ---- the vertical rule -----------------------------------------------------------
    def _absorb_if_consumer(self, node: Node) -> Node:
        ed = self.ed
        if starts_group(ed.kind(node)) and ed.fits(node):
            return self._absorb_producers(node)
        return node

    def _absorb_producers(self, consumer: Node) -> Node:
        """Absorb producers, latest first (so the nodes between an early producer and the
        group join before it), until none can join; a producer that failed is tried again
        when a later success may have changed its answer.

        A success q that joins at the group's slot leaves the answer of a refused
        producer p later than q as it was: the group keeps its place; the inputs it
        loses (q's results) and gains (q's inputs) are all made before q, so before p;
        device, reduction signatures, pinning and column reads only grow; unless q read
        p (p has fewer other readers now) or the input limit refused p (the group's
        input count may fall). Those, the refused producers earlier than q (q may have
        been one tried again) and, when q moved the group up to its own slot, every
        refused producer are tried again: the merges are those of retrying every refusal
        after each success, without its quadratic cost (candidates are taken latest
        first, so q is usually earlier than every refusal). The candidates are kept in a
        heap, updated by each success from the inputs q brings, so a success costs
        O(q's inputs + the refusals), not O(the group's inputs)."""
        ed = self.ed
        order = ed.order
        group = ed.wrap(consumer)
        heap: list[tuple[int, Node]] = []  # (-order, producer): candidates, latest first
        known: set[Node] = set()   # producers of the group's inputs
        later: set[Node] = set()   # of them, the refused and those that are no cluster
        failed: set[Node] = set()  # refused since they were last (re)queued
        limited: list[Node] = []   # refusals the input limit may have caused

        def add(values) -> None:
            for v in values:
                p = v.producer
                if p is None:
                    continue
                if p not in known:
                    known.add(p)
                    if ed.kind(p) is None:
                        later.add(p)
                    else:
                        heapq.heappush(heap, (-order[p], p))
                elif p in failed:  # q read p: p's other readers changed
                    requeue(p)

        def requeue(p: Node) -> None:
            failed.discard(p)
            later.discard(p)
            heapq.heappush(heap, (-order[p], p))

        add(group.inputs)
        # slot "a" (the group moves up to the producer) needs every other input made
        # before it: only a producer later than all refused and non-cluster ones has it
        bar = max(map(order.__getitem__, later), default=-1)
        while heap:
            _, producer = heapq.heappop(heap)  # (never a refused one: requeue unmarks it)
            q_inputs, q_order, slot = producer.inputs, order[producer], order[group]
            merged = ed.try_merge(producer, group, q_order > bar)
            if merged is None:
                failed.add(producer)
                later.add(producer)
                bar = max(bar, q_order)
                if len(producer.inputs) + len(group.inputs) > ed.max_inputs:
                    limited.append(producer)
                continue
            group = merged
            known.discard(producer)
            add(q_inputs)
            moved = order[group] != slot  # slot "a": the group now stands at q's place
            for p in [p for p in failed if moved or order[p] < q_order] + limited:
                if p in failed:
                    requeue(p)
            limited.clear()
            bar = max(map(order.__getitem__, later), default=-1)
        return group

    # ---- the sibling rule ------------------------------------------------------------
    def _merge_readers(self, v: Value) -> None:
        if len(v.uses) < 2:  # (stale entries only add to it: no sibling is missed)
            return
        ed, graph = self.ed, self.graph
        users = [u for u in v.users()
                 if u.graph is graph and starts_group(ed.kind(u)) and ed.fits(u)]
        if len(users) > 1:
            self._merge_siblings(sorted(users, key=ed.order.__getitem__))

    def _merge_siblings(self, siblings: list[Node]) -> None:
        """Each sibling joins the first compatible partial group (of at most
        ``max_siblings``) that it can merge with, or starts one."""
        ed, graph = self.ed, self.graph
        heads: list[Node] = []
        domains: list[tuple] = []  # heads[i]'s domain (a merge keeps it: domains agree)
        for node in siblings:
            if node.graph is not graph:  # merged away through an earlier shared value
                continue
            domain = ed.domain(node)
            for i, head in enumerate(heads):
                if domains[i] != domain or head.graph is not graph:
                    continue
                merged = ed.try_merge(head, node)
                if merged is not None:
                    heads[i] = merged
                    break
            else:
                if len(heads) < self.max_siblings:
                    heads.append(node)
                    domains.append(domain)
