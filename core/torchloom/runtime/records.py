"""What a pipeline run reports: one record per pass, and notes.

The pass manager makes them; the compiled-graph cache (:mod:`.graph_cache`) stores them
with the graph, so they live below both.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class Deduplication:
    """What a pass that replaced repeated code with shared subgraphs
    (``torchloom.call_subgraph``) did, reported through ``PassResult.deduplication``.
    ``explain``'s ``dedup`` summary adds up these, whichever pass reports them (the core
    names no plugin's pass): shared subgraphs made (``regions``), the places a call
    replaced (``occurrences``), and the nodes later passes no longer see
    (``nodes_deduplicated``)."""

    regions: int = 0
    occurrences: int = 0
    nodes_deduplicated: int = 0

    def __add__(self, other: "Deduplication") -> "Deduplication":
        return Deduplication(self.regions + other.regions, self.occurrences + other.occurrences,
                             self.nodes_deduplicated + other.nodes_deduplicated)


def _deduplication(value: Any) -> Deduplication | None:
    """A record's ``deduplication`` as stored (a dict in the compile cache's JSON)."""
    return Deduplication(**value) if isinstance(value, dict) else value


@attrs.define
class PassRecord:
    name: str
    ms: float
    changed: bool
    stats: dict[str, int]
    distribution: str
    skipped: str | None = None  # why, when on_error = "skip" dropped it
    deduplication: Deduplication | None = attrs.field(default=None, converter=_deduplication)


@attrs.define
class RunReport:
    records: list[PassRecord] = attrs.field(factory=list)
    notes: list[str] = attrs.field(factory=list)

    def total_ms(self) -> float:
        return sum(r.ms for r in self.records)
