"""What a pipeline run reports: one record per pass, and notes.

The pass manager makes them; the compiled-graph cache (:mod:`.graph_cache`) stores them
with the graph, so they live below both.
"""

from __future__ import annotations

import attrs


@attrs.define
class PassRecord:
    name: str
    ms: float
    changed: bool
    stats: dict[str, int]
    distribution: str
    skipped: str | None = None  # why, when on_error = "skip" dropped it
    #: a pass's ``PassResult.deduplication`` as data: regions, occurrences and
    #: nodes_deduplicated (stored with the record in the compile cache)
    deduplication: dict[str, int] | None = None
    #: CPU milliseconds of this process in the pass, its verification and snapshot
    #: (``ms`` is wall time: under load it also counts waiting for a core)
    cpu_ms: float | None = None


@attrs.define
class RunReport:
    records: list[PassRecord] = attrs.field(factory=list)
    notes: list[str] = attrs.field(factory=list)

    def total_ms(self) -> float:
        return sum(r.ms for r in self.records)
