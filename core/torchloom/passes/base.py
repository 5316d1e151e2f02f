"""The pass API.

A pass is a frozen attrs class whose fields are its options (typed, with defaults and
validators, so a pipeline file can be checked against them)::

    @attrs.frozen
    class PowToMul(Pass):
        '''x ** 2 -> x * x.

        before:  %y = aten.pow.Tensor_Scalar(%x) {exponent = 2} : f32[4]
        after:   %y = aten.mul.Tensor(%x, %x) : f32[4]
        '''
        name: ClassVar[str] = "example.pow-to-mul"
        def run(self, graph: Graph, ctx: PassContext) -> PassResult: ...

``run`` edits the graph in place and returns :class:`PassResult` saying honestly whether
anything changed. Passes keep no state between runs; configuration arrives through the
fields and the :class:`PassContext`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

import attrs

from torchloom.ir.graph import Graph
from torchloom.passes.sources import SourceHashes


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


@attrs.frozen
class PassResult:
    """What a pass did: ``changed`` is True iff the graph differs; ``stats`` are counters;
    ``deduplication`` (:class:`Deduplication`) is for a pass that made shared subgraphs,
    and is what ``explain``'s ``dedup`` summary adds up."""

    changed: bool
    stats: dict[str, int] = attrs.field(factory=dict)
    deduplication: Deduplication | None = None


@attrs.define
class PassContext:
    """What a pass may consult while running. Owned by one compilation."""

    registry: Any  # torchloom.ops.registry.OpRegistry
    device: str = "cpu"
    #: the codegen that compiles groups on ``device`` first: the first of the pipeline's
    #: codegens whose ``takes_device(device)`` says so (None: not known, a codegen before
    #: it has no ``takes_device``). Passes shaping groups for one codegen's strengths ask it
    codegen: str | None = None
    log: logging.Logger = attrs.field(factory=lambda: logging.getLogger("torchloom.passes"))
    #: counters summed over the pipeline run, "pass.counter" -> value
    stats: dict[str, int] = attrs.field(factory=dict)
    cache_dir: Path | None = None
    #: human-readable decisions passes want ``explain`` to show
    notes: list[str] = attrs.field(factory=list)
    #: work a pass may reuse within this compilation, by a key that starts with the pass's
    #: name: a pass runs on the main graph and on every shared subgraph, with this context
    memo: dict[Any, Any] = attrs.field(factory=dict)

    def note(self, message: str) -> None:
        self.notes.append(message)

    def count(self, key: str, amount: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + amount


class Pass:
    """Base class of passes. Subclasses are ``@attrs.frozen`` and set ``name``."""

    name: ClassVar[str] = ""
    #: passes that must appear earlier in the pipeline whenever this one is used
    requires: ClassVar[tuple[str, ...]] = ()
    #: passes that, when present in the pipeline, must appear earlier than this one
    after: ClassVar[tuple[str, ...]] = ()
    #: a run right after a run of this pass (same options) never changes the graph: in a
    #: fixpoint group the manager then skips it while no other pass changed the graph
    #: since its last run (tests should check the claim: a wrong one leaves work undone)
    idempotent: ClassVar[bool] = False

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        """This instance's option values, by field name."""
        return attrs.asdict(self, recurse=False)

    @classmethod
    def source_hash(cls, sources: SourceHashes | None = None) -> str:
        """Hash of every source file of the top-level package defining this pass (see
        :mod:`torchloom.passes.sources`); ``sources`` memoizes it across passes."""
        return (sources or SourceHashes()).of_class(cls)

    def identity(self, distribution: str = "?", version: str = "?",
                 sources: SourceHashes | None = None) -> dict[str, Any]:
        """What makes this pass's output reproducible: name, options, code and version."""
        return {"name": self.name, "options": {k: repr(v) for k, v in self.options().items()},
                "distribution": distribution, "version": version,
                "source": self.source_hash(sources)}
