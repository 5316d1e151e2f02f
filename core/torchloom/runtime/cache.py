"""The kernel cache: compiled kernels in memory, and their sources on disk.

In memory, kernels are keyed by codegen and the group's structural hash, so groups equal
up to renaming compile once per process. With a directory, what a codegen generated is
also kept on disk as text — never pickle — so a second process generates nothing:

```
<dir>/<entry>.json                  {"format", "key", "codegen", "metadata", "compile_ms",
                                     "source_file", "source_sha256", "checksum"}
<dir>/<entry>-<sha256[:16]>.src     the kernel source, exactly as generate() returned it
```

``<entry>`` hashes the group key, the codegen's name, version and source, and the
pipeline fingerprint. Files are written to a temporary file in the same directory and
``os.replace``-d into place (JSON last), and a source file is named after its content,
so concurrent writers never leave a broken entry. An entry whose JSON does not parse,
whose checksums disagree, whose ``source_file`` is not the name its entry and checksum
give, or whose files lead outside the directory (a symlink out of it), is reported once
(a warning naming the file), regenerated and rewritten. The checksums catch accidents
(torn writes, disk errors), not someone who can write the directory: see the README's
trust model.

With a ``remote`` (:class:`~torchloom.runtime.remote_cache.RemoteCache`), a kernel found
neither in memory nor on disk is looked up there (namespace ``kernel``, under the same
``<entry>`` name: the JSON above with the source inline, signed), loaded and kept on disk;
every kernel generated here is written there too. Autotune results are shared the same
way (namespace ``tune``), for kernels that take part (see :mod:`torchloom.codegen.base`):
a kernel found with a result applies it instead of tuning, and a kernel that tunes writes
its result.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchloom.codegen.base import Codegen, Kernel, KernelSource, Reason
from torchloom.ir.canon import structural_hash
from torchloom.ir.graph import Node
from torchloom.runtime.remote_cache import RemoteCache

log = logging.getLogger("torchloom.cache")

FORMAT = 2


class CorruptEntry(Exception):
    """A cache entry on disk that cannot be trusted."""


class StaleEntry(Exception):
    """A well-formed entry in another format version: a miss, not an error."""


def codegen_identity(codegen: Codegen) -> str:
    """Name, version and a hash of the sources next to the module defining the codegen
    (its package's files), so an edited codegen never loads kernels its old code made."""
    module = sys.modules.get(type(codegen).__module__)
    path = getattr(module, "__file__", None)
    digest = hashlib.sha256()
    try:
        for source in sorted(Path(path).parent.glob("*.py")) if path else ():
            digest.update(source.name.encode() + b"\0" + source.read_bytes())
    except OSError:
        pass
    return f"{codegen.name}:{codegen.version}:{digest.hexdigest()[:16]}"


class DiskCache:
    """What the kernel and the compile caches share: a directory that may turn out unusable
    (reported once, then entries stay in memory) and entries found broken (each reported
    once, counted in ``corrupt``). Subclasses name their entries and what a broken one costs."""

    #: "<cache> cache", what is kept in memory instead, what happens to a broken entry
    label, kept, broken, redo = "cache", "entries are", "is corrupt", "recomputing it"

    def __init__(self, directory: str | Path | None):
        self.directory = Path(directory) if directory is not None else None
        self._reported: set[str] = set()
        self.corrupt = 0

    def _unusable(self, exc: OSError) -> None:
        """Stop using the directory, saying so once (entries stay in memory)."""
        if self.directory is not None:
            log.warning("torchloom: %s directory %s is unusable (%s); %s cached in memory "
                        "only, for this process", self.label, self.directory,
                        exc.strerror or exc, self.kept)
            self.directory = None

    def _report(self, path: Path, exc: Exception) -> None:
        self.corrupt += 1
        if str(path) not in self._reported:
            self._reported.add(str(path))
            log.warning("torchloom: %s entry %s %s (%s); %s", self.label, path, self.broken,
                        self._describe(exc), self.redo)

    @staticmethod
    def _describe(exc: Exception) -> str:
        return str(exc)


class KernelCache(DiskCache):
    """Kernels by ``(codegen name, codegen version, structural hash of the region)``.

    ``directory`` (optional) adds the on-disk layer; ``fingerprint`` (the pipeline's)
    enters every disk key. A directory that turns out unusable (a file in its place, no
    permission, a read-only disk) is reported once and dropped: kernels stay in memory,
    and every group still compiles. Counters: ``compiles`` (``generate`` calls), ``disk_hits``,
    ``hits`` (in memory), ``corrupt`` (entries found broken), ``remote_hits`` (kernels read
    from ``remote``, the shared cache); ``stats()`` adds the shared cache's errors and the
    built artifacts (cpu libraries) codegens read from it.
    """

    label, kept, broken, redo = "kernel cache", "kernels are", "is corrupt", "regenerating it"

    def __init__(self, directory: str | Path | None = None, fingerprint: str = "",
                 remote: RemoteCache | None = None):
        super().__init__(directory)
        self.remote = remote
        self.remote_hits = 0
        self.fingerprint = fingerprint
        self._kernels: dict[tuple[str, str, str], Kernel] = {}
        #: what each kernel was loaded from (generated here, or read from disk or remote):
        #: dumps and reports read it instead of generating the kernel again
        self._sources: dict[tuple[str, str, str], KernelSource] = {}
        self._declined: dict[tuple[str, str, str], Reason] = {}
        #: id(codegen) -> (codegen, its identity); holding the codegen keeps the id unique
        self._identities: dict[int, tuple[Codegen, str]] = {}
        self.compiles = 0
        self.hits = 0
        self.disk_hits = 0
        self.compile_seconds = 0.0  # spent in generate() + load() for kernels compiled here
        self.disk_saved_seconds = 0.0  # what the entries loaded from disk took to compile

    @staticmethod
    def key(codegen: Codegen, group: Node) -> tuple[str, str, str]:
        return (codegen.name, str(codegen.version), structural_hash(group.region))

    def cached(self, codegen: Codegen, group: Node) -> Kernel | None:
        """The kernel already made in this process for a group of this structure (a hit),
        or None; the disk and the shared cache are not consulted."""
        kernel = self._kernels.get(self.key(codegen, group))
        if kernel is not None:
            self.hits += 1
        return kernel

    def source(self, codegen: Codegen, group: Node) -> KernelSource | None:
        """What the kernel of a group of this structure was loaded from, or None."""
        return self._sources.get(self.key(codegen, group))

    def has(self, codegen: Codegen, group: Node) -> bool:
        return self.key(codegen, group) in self._kernels

    def declined(self, codegen: Codegen, group: Node) -> Reason | None:
        """Why ``codegen`` declined a group of this structure earlier, or None."""
        return self._declined.get(self.key(codegen, group))

    def decline(self, codegen: Codegen, group: Node, reason: Reason) -> None:
        """Remember that ``codegen`` does not support groups of this structure (its
        ``supports`` is asked once per structure, however many groups share it)."""
        self._declined[self.key(codegen, group)] = reason

    def stored(self, codegen: Codegen, group: Node, registry: Any) -> Kernel | None:
        """The kernel of a group of this structure that an earlier process stored (on disk,
        else in the shared cache), loaded without judging or generating it, when the codegen
        has ``available(group)`` and it finds nothing missing on this machine; else None.
        A stored entry was accepted by ``supports`` of the same code (its identity is in
        the key), so only what the machine lacks (a compiler, CUDA) can decline it now."""
        available = getattr(codegen, "available", None)
        if not callable(available) or available(group) is not None:
            return None
        key = self.key(codegen, group)
        kernel = self._load_stored(codegen, key, registry)
        if kernel is not None:
            self._kernels[key] = kernel
        return kernel

    def has_stored(self, codegen: Codegen, group: Node) -> bool:
        """Whether this directory holds an entry for the group's structure (not read)."""
        entry = self._entry(codegen, self.key(codegen, group))
        return entry is not None and entry.with_suffix(".json").exists()

    def _load_stored(self, codegen: Codegen, key: tuple[str, str, str],
                     registry: Any) -> Kernel | None:
        entry = self._entry(codegen, key)
        kernel = self._load_from_disk(entry, key, codegen, registry) if entry else None
        if kernel is None and self.remote is not None:
            kernel = self._load_remote(self._entry_name(codegen, key), entry, key, codegen,
                                       registry)
        if kernel is not None and self.remote is not None:
            self._share_tuning(self._entry_name(codegen, key), kernel)
        return kernel

    def get_or_compile(self, codegen: Codegen, group: Node, registry: Any) -> Kernel:
        key = self.key(codegen, group)
        kernel = self._kernels.get(key)
        if kernel is not None:
            self.hits += 1
            return kernel
        kernel = self._load_stored(codegen, key, registry)
        if kernel is not None:
            self._kernels[key] = kernel
            return kernel
        name = self._entry_name(codegen, key)
        entry = self._entry(codegen, key)
        t0 = time.perf_counter()
        generated = self._sources[key] = codegen.generate(group, registry)
        kernel = codegen.load(generated, registry)
        seconds = time.perf_counter() - t0
        self.compile_seconds += seconds
        self.compiles += 1
        if entry is not None:
            self._store(entry, key, generated, seconds)
        if self.remote is not None:
            self._share(name, key, generated, seconds)
            self._share_tuning(name, kernel)
        self._kernels[key] = kernel
        return kernel

    def __len__(self) -> int:
        return len(self._kernels)

    def stats(self) -> dict[str, Any]:
        """Counters for ``explain``; the saved-time estimate prices every reuse (in memory
        or from disk) at the average measured compile time."""
        average = self.compile_seconds / self.compiles if self.compiles else 0.0
        saved = self.hits * average + self.disk_saved_seconds
        remote = self.remote
        # the codegens' built artifacts (cpu libraries) count with the kernels they build
        remote_errors = remote.stats("kernel")["errors"] + remote.total(
            "artifact-", "errors") if remote else 0
        return {"unique": len(self), "compiles": self.compiles, "hits": self.hits,
                "disk_hits": self.disk_hits, "corrupt": self.corrupt,
                "remote_hits": self.remote_hits, "remote_errors": remote_errors,
                "remote_artifact_hits": remote.total("artifact-", "hits") if remote else 0,
                "compile_ms": round(self.compile_seconds * 1e3, 3),
                "saved_ms_estimate": round(saved * 1e3, 3)}

    # ---- disk layer ------------------------------------------------------------------
    def _entry(self, codegen: Codegen, key: tuple[str, str, str]) -> Path | None:
        """The entry's path on disk (None without a directory)."""
        if self.directory is None:
            return None
        return self.directory / self._entry_name(codegen, key)

    def _entry_name(self, codegen: Codegen, key: tuple[str, str, str]) -> str:
        known = self._identities.get(id(codegen))
        if known is None:
            known = self._identities[id(codegen)] = (codegen, codegen_identity(codegen))
        blob = json.dumps([key[2], known[1], self.fingerprint])
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    # ---- remote layer ----------------------------------------------------------------
    def _load_remote(self, name: str, entry: Path | None, key: tuple[str, str, str],
                     codegen: Codegen, registry: Any) -> Kernel | None:
        text = self.remote.get("kernel", name)
        if text is None:
            return None
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise CorruptEntry("no format version" if not isinstance(data, dict) else
                                   f"format {data.get('format')!r}, expected {FORMAT}")
            if data.get("key") != list(key) or data.get("codegen") != codegen.name:
                raise CorruptEntry(f"written for {data.get('codegen')!r} {data.get('key')!r}")
            generated = KernelSource(codegen.name, str(data["source"]), data["metadata"])
            compile_ms = float(data["compile_ms"])
            kernel = codegen.load(generated, registry)
        except Exception as exc:  # a broken entry is rebuilt, never trusted
            self.remote.reject("kernel", name, f"{type(exc).__name__}: {exc}")
            return None
        self.remote_hits += 1
        self.disk_saved_seconds += compile_ms / 1e3
        self._sources[key] = generated
        if entry is not None:
            self._store(entry, key, generated, compile_ms / 1e3)
        return kernel

    def _share_tuning(self, name: str, kernel: Kernel) -> None:
        """Apply the fleet's autotune result to ``kernel`` (one rejected by the kernel is
        reported once), or have the kernel write its own there when it tunes."""
        if not hasattr(kernel, "apply_tuning"):
            return
        text = self.remote.get("tune", name)
        if text is not None:
            try:
                kernel.apply_tuning(json.loads(text))
                return
            except Exception as exc:  # tuned again here, and rewritten
                self.remote.reject("tune", name, f"{type(exc).__name__}: {exc}")
        if hasattr(kernel, "share_tuning"):
            remote = self.remote
            kernel.share_tuning(lambda record: remote.put("tune", name, json.dumps(record)))

    def _share(self, name: str, key: tuple[str, str, str], generated: KernelSource,
               seconds: float) -> None:
        body = {"format": FORMAT, "key": list(key), "codegen": generated.codegen,
                "metadata": generated.metadata, "source": generated.source,
                "compile_ms": round(seconds * 1e3, 3)}
        try:
            text = json.dumps(body, sort_keys=True)
        except (TypeError, ValueError):  # metadata that is not JSON stays in memory
            return
        self.remote.put("kernel", name, text)

    def _load_from_disk(self, entry: Path, key: tuple[str, str, str], codegen: Codegen,
                        registry: Any) -> Kernel | None:
        meta_path = entry.with_suffix(".json")
        try:
            if not meta_path.exists():
                return None
            source, compile_ms = _read_entry(meta_path, codegen)
        except StaleEntry:
            return None  # regenerated and rewritten in this format
        except (FileNotFoundError, IsADirectoryError) as exc:  # the entry, not the directory
            self._report(meta_path, exc)
            return None
        except OSError as exc:
            self._unusable(exc)
            return None
        except Exception as exc:  # a broken entry is regenerated, never trusted
            self._report(meta_path, exc)
            return None
        try:
            kernel = codegen.load(source, registry)
        except Exception as exc:
            self._report(meta_path, exc)
            return None
        self.disk_hits += 1
        self.disk_saved_seconds += compile_ms / 1e3
        self._sources[key] = source
        return kernel

    def _store(self, entry: Path, key: tuple[str, str, str], generated: KernelSource,
               seconds: float = 0.0) -> None:
        source_sha = hashlib.sha256(generated.source.encode()).hexdigest()
        source_path = entry.parent / f"{entry.name}-{source_sha[:16]}.src"
        body = {"format": FORMAT, "key": list(key), "fingerprint": self.fingerprint,
                "codegen": generated.codegen, "metadata": generated.metadata,
                "source_file": source_path.name, "source_sha256": source_sha,
                "compile_ms": round(seconds * 1e3, 3)}
        try:
            text = json.dumps({**body, "checksum": checksum(body)}, indent=1, sort_keys=True)
        except (TypeError, ValueError) as exc:  # metadata that is not JSON stays in memory
            log.debug("torchloom: not caching %s on disk: metadata is not JSON (%s)", key, exc)
            return
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(source_path, generated.source)
            atomic_write(entry.with_suffix(".json"), text)  # last: it vouches for the source
        except OSError as exc:  # a read-only or full disk costs speed, not correctness
            self._unusable(exc)


def directory_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot hold a cache (it cannot be created, listed or written to:
    a file in its place, no permission, a read-only disk), or None when it can."""
    try:
        if directory.exists() and not directory.is_dir():
            return "a file is in its place"
        directory.mkdir(parents=True, exist_ok=True)
        os.listdir(directory)
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{exc.strerror or exc}"
    return None


def checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def within(directory: Path, path: Path) -> bool:
    """Whether ``path``, symlinks followed, lies inside ``directory`` (itself resolved)."""
    try:
        return path.resolve().is_relative_to(directory.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        return False


def _read_entry(meta_path: Path, codegen: Codegen) -> tuple[KernelSource, float]:
    """The entry's kernel source and the milliseconds it took to compile."""
    if not within(meta_path.parent, meta_path):
        raise CorruptEntry(f"{meta_path.name} leads outside the cache directory")
    data = json.loads(meta_path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("format"), int):
        raise CorruptEntry("no format version")
    if data["format"] != FORMAT:
        raise StaleEntry(data["format"])
    recorded = data.pop("checksum", None)
    if recorded != checksum(data):
        raise CorruptEntry("metadata checksum mismatch")
    if data.get("codegen") != codegen.name:
        raise CorruptEntry(f"written by codegen {data.get('codegen')!r}")
    # the source file's name is a function of the entry and its checksum: a name read
    # from the entry never chooses which file is read
    expected = f"{meta_path.stem}-{str(data['source_sha256'])[:16]}.src"
    if data["source_file"] != expected:
        raise CorruptEntry(f"source_file {data['source_file']!r} is not {expected!r}")
    source_path = meta_path.parent / expected
    if not within(meta_path.parent, source_path):
        raise CorruptEntry(f"{expected} leads outside the cache directory")
    source = source_path.read_bytes().decode()
    if hashlib.sha256(source.encode()).hexdigest() != data["source_sha256"]:
        raise CorruptEntry(f"{source_path.name} does not match its checksum")
    return KernelSource(data["codegen"], source, data["metadata"]), float(data["compile_ms"])


def atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)  # no fsync: a torn file after a crash fails its checksum
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


__all__ = ["KernelCache", "CorruptEntry", "StaleEntry", "atomic_write", "checksum", "codegen_identity",
           "within", "directory_problem",
           "Callable"]
