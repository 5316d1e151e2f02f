"""Hashes of the source a pass can reach, for its cache identity.

A pass's output depends on more than the file defining its class: ``fusion.vertical``
keeps its logic in ``groups.py``, and every pass calls the core's IR API. So a pass's
source hash covers every Python file of the top-level package its class comes from
(``torchloom_fusion/**.py`` for ``torchloom_fusion.vertical``; the whole ``torchloom``
package for the built-ins), and a pipeline's fingerprint adds the core's. Editing any of
those files (an editable install, same version) changes the compile-cache key.

Hashing reads every file once per :class:`SourceHashes` (a plugin set keeps one, so a
compiler reads them once): after that the memo answers, as the code already imported
does not change either.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

CORE_PACKAGE = "torchloom"


class SourceHashes:
    """Source hashes of top-level packages, memoized (one per plugin set)."""

    def __init__(self) -> None:
        #: package roots -> hash
        self._memo: dict[tuple[str, ...], str] = {}

    def of_class(self, cls: type) -> str:
        """Hash of every source file of the top-level package defining ``cls``."""
        return self.of_package(cls.__module__.split(".")[0], fallback=cls.__qualname__)

    def of_package(self, name: str, fallback: str = "") -> str:
        """Hash of every ``.py`` file under the (already imported) top-level module
        ``name``: all its directories for a package, its one file for a module."""
        module = sys.modules.get(name)
        roots = [str(p) for p in getattr(module, "__path__", None) or ()]
        if not roots and getattr(module, "__file__", None):
            roots = [module.__file__]
        if not roots:  # defined in no file (an interactive session, a test's exec)
            return hashlib.sha256(f"{name}:{fallback}".encode()).hexdigest()[:16]
        key = tuple(sorted(roots))
        if key in self._memo:
            return self._memo[key]
        digest = hashlib.sha256()
        # relative names: the same code installed elsewhere hashes the same
        for rel, f in _source_files(key):
            digest.update(rel.encode() + b"\0")
            try:
                digest.update(f.read_bytes())
            except OSError as exc:  # unreadable: still part of the identity, by the error
                digest.update(f"<{type(exc).__name__}>".encode())
            digest.update(b"\0")
        value = digest.hexdigest()[:16]
        self._memo[key] = value
        return value


def _source_files(roots: tuple[str, ...]) -> list[tuple[str, Path]]:
    """(name relative to the root's parent, path) of every source file, sorted."""
    files: set[tuple[str, Path]] = set()
    for root in map(Path, roots):
        found = ([p for p in root.rglob("*.py") if "__pycache__" not in p.parts]
                 if root.is_dir() else [root] if root.exists() else [])
        files.update((p.relative_to(root.parent).as_posix(), p) for p in found)
    return sorted(files)


__all__ = ["SourceHashes", "CORE_PACKAGE"]
