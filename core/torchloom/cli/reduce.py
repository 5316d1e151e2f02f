"""``torchloom reduce DIR``: shrink a failing reproducer to a small graph that fails the
same way, as ``mlir-reduce`` and ``creduce`` do.

A reproducer (:mod:`torchloom.compiler.reproduce`) holds the IR from before a failing pass. The
reducer replays it to learn how it fails (:class:`Failure`: the pass, and whether it
raised, broke the graph or changed values, with the exception's type), then tries smaller
graphs and keeps each that still fails the same way (delta debugging, chunks halving):

1. drop graph outputs (what no kept output needs goes with them), and drop nodes from
   the bottom up, what they read becoming outputs in their place;
2. replace nodes' results by fresh graph inputs of their types (the nodes above them go
   too), earliest nodes first;
3. shrink shapes: every dim size in the text becomes 1, 2 or half of it where the graph
   still parses, verifies and fails;

and repeats while a round gains. A candidate is never larger than the graph it replaces
(fewer nodes, or as many with fewer elements). The result is written beside the original
as ``reduced.ir`` with ``reduced.toml``, the failing pass alone under the reproducer's
verify policy, which ``torchloom opt reduced.ir --pipeline reduced.toml`` replays.
Nothing read is executed: the IR is parsed and verified.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from torchloom.errors import NumericError, PassError, TorchloomError, VerifyError
from torchloom.ir.graph import CALL_SUBGRAPH, Graph, Node, Value, clone_graph
from torchloom.ir.text import print_graph
from torchloom.ir.types import TensorType
from torchloom.ir.verify import verify
from torchloom.passes.base import PassContext
from torchloom.passes.manager import PassManager
from torchloom.passes.pipeline_dict import pipeline_toml
from torchloom.progress import Progress
from torchloom.compiler.reproduce import Reproducer, load_reproducer

#: rounds of the three steps at most (each round that gains nothing ends it)
MAX_ROUNDS = 4


@attrs.frozen
class Failure:
    """How a run failed: the pass, what kind of failure, and the exception's type."""

    pass_name: str
    kind: str  # "raised" | "verify" | "numeric"
    error_type: str
    message: str = attrs.field(eq=False)

    def describe(self) -> str:
        what = {"raised": f"raises {self.error_type}", "verify": "breaks the graph",
                "numeric": "changes values"}[self.kind]
        return f"pass {self.pass_name!r} {what}"


@attrs.frozen
class Reduction:
    """What :func:`reduce_reproducer` did: sizes before and after, files written."""

    failure: Failure
    nodes_before: int
    nodes_after: int
    tests: int  # candidate graphs tried
    ir_path: Path
    pipeline_path: Path
    graph: Graph = attrs.field(eq=False, repr=False)


def failure_of(graph: Graph, r: Reproducer, inputs=None) -> Failure | None:
    """Run the reproducer's pipeline on a copy of ``graph``: how it fails, or None."""
    pipeline = attrs.evolve(r.pipeline, on_error="raise")
    ctx = PassContext(registry=r.plugins.registry, device=r.device)
    try:
        PassManager(pipeline, r.plugins, numeric_inputs=inputs).run(graph.clone(), ctx)
    except PassError as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        kind = ("numeric" if isinstance(cause, NumericError)
                else "verify" if isinstance(cause, VerifyError) else "raised")
        return Failure(exc.pass_name, kind, type(cause).__name__, str(exc))
    return None


def size_of(graph: Graph) -> tuple[int, int]:
    """(nodes, regions and shared subgraphs included; elements of the graph's values)."""
    graphs = [graph, *graph.subgraphs.values()]
    nodes = sum(1 for g in graphs for _ in g.walk())
    numel = sum(_numel(v.type) for g in graphs for n in g.walk() for v in n.outputs)
    return nodes, numel + sum(_numel(v.type) for v in graph.inputs)


def _numel(t) -> int:
    if isinstance(t, TensorType):
        n = t.numel()
        return n if n is not None else 1
    return 1


def extract(graph: Graph, outputs: Sequence[Value], cut: set[Node] = frozenset(), *,
            smaller: bool = False) -> Graph | None:
    """A new graph returning ``outputs`` of ``graph`` and holding only the nodes they
    need; the results of ``cut`` nodes (and graph inputs still read) become its inputs.
    With ``smaller``, None (before anything is built) when it would keep every node."""
    needed: set[Node] = set()
    stack = [v.producer for v in outputs if v.producer is not None and v.producer not in cut]
    while stack:
        node = stack.pop()
        if node in needed:
            continue
        needed.add(node)
        stack.extend(v.producer for v in node.inputs
                     if v.producer is not None and v.producer not in cut)
    if smaller and len(needed) >= len(graph):
        return None
    g = Graph(graph.name)
    mapping: dict[Value, Value] = {}
    read = {v for n in needed for v in n.inputs} | set(outputs)
    for v in graph.inputs:  # the original inputs first, in their order
        if v in read:
            mapping[v] = g.add_input(v.type, v.name)

    def value(v: Value) -> Value:
        if v not in mapping:  # a cut node's result: a fresh input
            mapping[v] = g.add_input(v.type, v.name)
        return mapping[v]

    callees: set[str] = set()
    for node in graph.nodes:
        if node not in needed:
            continue
        new = g.create(node.op, [value(v) for v in node.inputs], [v.type for v in node.outputs],
                       node.attrs, names=[v.name for v in node.outputs],
                       region=node.region.clone() if node.region is not None else None)
        mapping.update(zip(node.outputs, new.outputs))
        if node.op == CALL_SUBGRAPH:
            callees.add(node.attrs["callee"])
    g.set_outputs([value(v) for v in outputs])
    for name, sub in graph.root.subgraphs.items():
        if name in callees or _calls_inside(graph, name):
            g.add_subgraph(sub.clone())
    return g


def _calls_inside(graph: Graph, callee: str) -> bool:
    """Whether a shared subgraph calls ``callee`` (kept whole: they call each other)."""
    return any(n.op == CALL_SUBGRAPH and n.attrs.get("callee") == callee
               for sub in graph.root.subgraphs.values() for n in sub.walk())


class _Search:
    """The reduction's state: the smallest failing graph so far, and how many candidates
    were tried (shown as progress)."""

    def __init__(self, graph: Graph, r: Reproducer, failure: Failure, progress: Progress):
        self.best, self.size = graph, size_of(graph)
        self.r, self.failure, self.progress = r, failure, progress
        self.tests = 0

    def attempt(self, candidate: Graph | None) -> bool:
        """Keep ``candidate`` when it is smaller and fails the same way."""
        if candidate is None or size_of(candidate) >= self.size:
            return False
        self.tests += 1
        self.progress.update(self.tests, f"candidates, best {self.size[0]} nodes")
        try:
            verify(candidate, self.r.plugins.registry)
            if failure_of(candidate, self.r) != self.failure:
                return False
        except Exception:  # a candidate that breaks anything else is not the same failure
            return False
        self.best, self.size = candidate, size_of(candidate)
        return True

    def chunks(self, items: Callable[[], list], make: Callable[[list], Graph | None]) -> bool:
        """Delta debugging over ``items()`` (read again after every success): try
        removing chunks of half the items, then quarters, ..., down to one."""
        gained = False
        size = max(1, len(items()) // 2)
        while True:
            i = 0
            while i < len(current := items()):
                if self.attempt(make(current[i:i + size])):
                    gained = True  # the next chunk now starts at i
                else:
                    i += size
            if size == 1:
                return gained
            size = max(1, size // 2)

    def drop_outputs(self) -> bool:
        def make(chunk):
            keep = [v for v in self.best.outputs if v not in chunk]
            return extract(self.best, keep, smaller=True) if keep else None
        return self.chunks(lambda: list(dict.fromkeys(self.best.outputs)), make)

    def cut_nodes(self) -> bool:
        return self.chunks(lambda: list(self.best.nodes),
                           lambda chunk: extract(self.best, self.best.outputs, set(chunk),
                                                 smaller=True))

    def drop_nodes(self) -> bool:
        """Remove nodes from the bottom up: what a removed node read becomes an output in
        its place (a chunk that kept outputs still need is not smaller, so not tried)."""
        def make(chunk):
            doomed = set(chunk)
            outputs = [v for v in self.best.outputs if v.producer not in doomed]
            outputs += [v for node in chunk for v in node.inputs
                        if v.producer is not None and v.producer not in doomed]
            outputs = list(dict.fromkeys(outputs))
            return extract(self.best, outputs, smaller=True) if outputs else None
        return self.chunks(lambda: list(self.best.nodes)[::-1], make)

    def shrink_shapes(self) -> bool:
        gained = False
        for dim in sorted(_dims_of(self.best), reverse=True):
            for smaller in sorted({1, 2, dim // 2}):
                if smaller < dim and self.attempt(_resized(self.best, dim, smaller)):
                    gained = True
                    break
        return gained


def _dims_of(graph: Graph) -> set[int]:
    return {d for g in [graph, *graph.subgraphs.values()]
            for v in [*g.inputs, *(o for n in g.walk() for o in n.outputs)]
            if isinstance(v.type, TensorType) for d in v.type.shape
            if isinstance(d, int) and d > 1}


def _resized(graph: Graph, dim: int, smaller: int) -> Graph:
    """``graph`` with the size ``dim`` made ``smaller`` everywhere: in every tensor type
    and in every int attribute equal to it (view sizes, split sizes and dims alike:
    ``attempt`` keeps a resize only when it verifies and fails the same way)."""
    def size(d):
        return smaller if d == dim and type(d) is int else d

    def attr(a):
        if isinstance(a, (list, tuple)):
            return type(a)(attr(x) for x in a)
        return size(a)
    return clone_graph(graph, dim=size, attr=attr)[0]


def reduce_reproducer(directory: str | Path, plugins=None, *,
                      progress: Progress | None = None) -> Reduction:
    """Shrink the reproducer in ``directory`` and write ``reduced.ir`` and
    ``reduced.toml`` beside it. A directory that is not a reproducer, or one that no
    longer fails, is a :class:`TorchloomError` (exit code 2)."""
    r = load_reproducer(directory, plugins)
    failure = failure_of(r.graph, r, r.inputs)
    if failure is None:
        raise TorchloomError(f"{r.directory}: the reproducer no longer fails ({r.what} runs "
                             f"without error on before.ir), so there is nothing to reduce")
    if failure_of(r.graph, r) != failure:  # the reduced graphs get seeded inputs
        raise TorchloomError(f"{r.directory}: {failure.describe()} on the reproducer's saved "
                             f"inputs but not on seeded ones, which reduced graphs need")
    progress = progress or Progress(f"reduce: {r.directory.name}")
    with progress:
        search = _Search(r.graph, r, failure, progress)
        for _ in range(MAX_ROUNDS):
            gained = search.drop_outputs()
            gained = search.drop_nodes() or gained
            gained = search.cut_nodes() or gained
            gained = search.shrink_shapes() or gained
            if not gained:
                break
    ir_path, toml_path = r.directory / "reduced.ir", r.directory / "reduced.toml"
    before, after = size_of(r.graph)[0], search.size[0]
    toml_path.write_text(_replay_pipeline(r))
    ir_path.write_text(
        f"// reduced by torchloom reduce from {r.directory / 'before.ir'} ({before} nodes -> "
        f"{after}): {failure.describe()}\n"
        f"// RUN: torchloom opt %s --pipeline {toml_path.name}\n{print_graph(search.best)}")
    return Reduction(failure, before, after, search.tests, ir_path, toml_path, search.best)


def _replay_pipeline(r: Reproducer) -> str:
    """The pipeline ``opt`` replays the reduced graph with: the failing pass alone (or the
    reproducer's whole pipeline, for a failure pinned on none)."""
    if r.meta["pass"] is None:
        return r.pipeline.text
    head = {"name": "reduced", "codegen": "eager", "verify": r.pipeline.verify,
            "on_error": "raise"}
    data = {"pipeline": head, "pass": [{"name": r.meta["pass"], **r.meta["options"]}]}
    if r.pipeline.disable:
        data["plugins"] = {"disable": list(r.pipeline.disable)}
    return pipeline_toml(data)


def summary(result: Reduction) -> str:
    """What ``torchloom reduce`` prints."""
    shrunk = (f"{result.nodes_before} -> {result.nodes_after} nodes"
              if result.nodes_after < result.nodes_before else
              f"{result.nodes_after} nodes, already minimal")
    return (f"reduced: {shrunk} ({result.tests} candidates tried); still fails: "
            f"{result.failure.describe()}\nwrote {result.ir_path} and {result.pipeline_path}\n"
            f"replay: torchloom opt {result.ir_path} --pipeline {result.pipeline_path}\n")


__all__ = ["Failure", "Reduction", "extract", "failure_of", "reduce_reproducer", "size_of",
           "summary"]
