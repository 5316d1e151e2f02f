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
        group join before it); a failed producer is retried after each success."""
        ed = self.ed
        group = ed.wrap(consumer)
        failed: set = set()
        while True:
            candidates = sorted({p for p in {v.producer for v in group.inputs}
                                 if p is not None and p not in failed
                                 and ed.kind(p) is not None},
                                key=ed.order.__getitem__, reverse=True)
            for producer in candidates:
                merged = ed.try_merge(producer, group)
                if merged is not None:
                    group = merged
                    failed.clear()
                    break
                failed.add(producer)
            else:
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
        for node in siblings:
            if node.graph is not graph:  # merged away through an earlier shared value
                continue
            for i, head in enumerate(heads):
                if head.graph is not graph or ed.domain(head) != ed.domain(node):
                    continue
                merged = ed.try_merge(head, node)
                if merged is not None:
                    heads[i] = merged
                    break
            else:
                if len(heads) < self.max_siblings:
                    heads.append(node)
