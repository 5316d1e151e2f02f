"""The compile cache: graphs after the pipeline, on disk, so that compiling a graph a
second time (a new process, a new ``Compiler``) runs no pass.

An entry is keyed by the input graph's canonical text (ops, attributes, types and
wiring; not value names), the pipeline's fingerprint (every pass's name, options,
distribution, version and source, the codegen, the runtime settings), the device, and the
versions of Python, torch, torchloom and every plugin. It holds, as JSON (never pickle),
the IR after the pipeline in its text form, the pass records and notes of the
compilation that wrote it, and a checksum:

```
<dir>/<key[:2]>/<key>.json   {"format", "key", "ir", "records", "notes", "checksum"}
```

Entries are written atomically (a temporary file, then ``os.replace``). A hit is parsed and verified
against the op registry before it is used; an entry that fails any of that, or whose path
leads outside the directory (a symlink out of it), is reported once (a warning naming the
file), recompiled and rewritten. The kernels of a hit come from the kernel cache as usual.
The IR of an entry is data: it can name only ops the registry knows.

With a ``remote`` (:class:`~torchloom.runtime.remote_cache.RemoteCache`), an entry absent
locally is looked up there (namespace ``graph``, same key and text; checked the same way,
then kept locally), and every entry stored is also written there.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import attrs

from torchloom.errors import TorchloomError
from torchloom.ir.canon import canonical_text
from torchloom.ir.graph import Graph
from torchloom.ir.text import parse_graph, print_graph
from torchloom.ir.verify import verify
from torchloom.runtime.records import PassRecord, RunReport
from torchloom.runtime.cache import DiskCache, atomic_write, checksum, within
from torchloom.runtime.remote_cache import RemoteCache

log = logging.getLogger("torchloom.cache")

FORMAT = 1


@attrs.frozen
class CachedGraph:
    """A compile-cache hit: the graph after the pipeline and the report that made it."""

    graph: Graph
    report: RunReport
    path: Path


class GraphCache(DiskCache):
    """Graphs after the pipeline, by input graph and compile identity (see the module).
    Counters: ``hits``, ``misses``, ``stores``, ``corrupt``, ``remote_hits`` (hits read
    from the remote cache), ``remote_errors`` (its rejected entries and failures).

    With ``directory`` None, or once the directory turns out unusable (a file in its
    place, no permission, a read-only disk: reported once), entries are kept in memory,
    in the same JSON form, for the life of this cache."""

    label, kept, broken = "compile cache", "compiled graphs are", "is unusable"
    redo = "compiling the graph again"

    def __init__(self, directory: str | Path | None, identity: dict[str, Any],
                 remote: RemoteCache | None = None):
        super().__init__(directory)
        self.remote = remote
        self._identity = json.dumps(identity, sort_keys=True, default=str)
        self._memory: dict[str, str] = {}  # key -> entry text, when not on disk
        self.hits = self.misses = self.stores = self.remote_hits = 0

    def key(self, graph: Graph) -> str:
        blob = f"{FORMAT}\0{self._identity}\0{canonical_text(graph)}"
        return hashlib.sha256(blob.encode()).hexdigest()

    def path(self, key: str) -> Path:
        return (self.directory or Path("<memory>")) / key[:2] / f"{key}.json"

    def load(self, key: str, registry) -> CachedGraph | None:
        path = self.path(key)
        try:
            if self.directory is None:
                text = self._memory.get(key)
                if text is None:
                    raise FileNotFoundError(path)
            else:
                if path.exists() and not within(self.directory, path):
                    raise ValueError("the entry leads outside the cache directory")
                text = path.read_text()
            graph, report = _decode(text, key, registry, str(path))
        except FileNotFoundError:
            return self._load_remote(key, registry)
        except (NotADirectoryError, PermissionError) as exc:  # the directory, not the entry
            self._unusable(exc)
            self.misses += 1
            return None
        except (OSError, ValueError, KeyError, TypeError, RecursionError,
                TorchloomError) as exc:  # RecursionError: JSON nested (forged) too deep
            self._report(path, exc)
            return None
        self.hits += 1
        return CachedGraph(graph, report, path)

    def _load_remote(self, key: str, registry) -> CachedGraph | None:
        text = self.remote.get("graph", key) if self.remote is not None else None
        if text is None:
            self.misses += 1
            return None
        try:
            graph, report = _decode(text, key, registry, f"remote graph entry {key}")
        except (ValueError, KeyError, TypeError, RecursionError, TorchloomError) as exc:
            self.remote.reject("graph", key, f"{type(exc).__name__}: "
                                             f"{str(exc).splitlines()[0] if str(exc) else ''}")
            self.misses += 1
            return None
        self._write(key, text)  # kept locally: the next process on this machine reads it
        self.hits += 1
        self.remote_hits += 1
        return CachedGraph(graph, report, self.path(key))

    def store(self, key: str, graph: Graph, report: RunReport) -> None:
        """Write the entry (a graph the printer rejects is not cached; one it prints but
        cannot parse back is caught, and reported, when it is loaded)."""
        try:
            ir = print_graph(graph)
            body = {"format": FORMAT, "key": key, "ir": ir,
                    "records": [attrs.asdict(r) for r in report.records],
                    "notes": list(report.notes)}
            text = json.dumps({**body, "checksum": checksum(body)}, sort_keys=True)
        except (ValueError, TypeError, TorchloomError) as exc:
            log.debug("torchloom: not caching compiled graph @%s: %s", graph.name, exc)
            return
        self._write(key, text)
        self.stores += 1
        if self.remote is not None:
            self.remote.put("graph", key, text)

    def _write(self, key: str, text: str) -> None:
        path = self.path(key)
        try:
            if self.directory is None:
                self._memory[key] = text
            else:
                if path.parent.is_symlink() and not within(self.directory, path.parent):
                    path.parent.unlink()  # never write through a link out of the cache
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, text)
        except OSError as exc:  # a read-only or full disk costs speed, not correctness
            self._unusable(exc)
            self._memory[key] = text

    @staticmethod
    def _describe(exc: Exception) -> str:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    @property
    def remote_errors(self) -> int:
        return self.remote.stats("graph")["errors"] if self.remote is not None else 0

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "stores": self.stores,
                "corrupt": self.corrupt}


def _decode(text: str, key: str, registry, source: str) -> tuple[Graph, RunReport]:
    """The graph and report of an entry's text, checked (``ValueError`` and the parser's
    and verifier's errors say why not)."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"format {found!r}, expected {FORMAT}")
    recorded = data.pop("checksum", None)
    if recorded != checksum(data) or data.get("key") != key:
        raise ValueError("checksum mismatch")
    graph = parse_graph(data["ir"], source=source)
    verify(graph, registry)
    return graph, RunReport([PassRecord(**r) for r in data["records"]], list(data["notes"]))


__all__ = ["GraphCache", "CachedGraph", "FORMAT"]
