"""A codegen that raises while judging (``supports``) or compiling one fusion group costs
only that group: the group goes to the next codegen of the chain (at the end, ``eager``),
and the failure is kept for the bug report.

The group is written as IR text, a graph holding just that group, to
``<repro_dir>/codegen-<codegen>-<hash>.ir`` (``<cache_dir>/reproducers`` under the compiler;
the system's temporary directory when that cannot be written), with the error and its
traceback in ``//`` comment lines above it::

    // codegen 'triton' raised while judging this fusion group of @graph0
    // IndexError: tuple index out of range
    // Traceback (most recent call last): ...
    graph @graph0(%x: f32[]) {
      %s = torchloom.fusion_group(%x) : f32[] region @k_1f2e(%a: f32[]) {
        %r = aten.sum.dim_IntList(%a) {dim = [0]} : f32[]
        return %r
      }
      return %s
    }

The file is named by the hash of its codegen, the group and the error, so the same
failure in every process start reuses it. The error is logged once per distinct error
(``warned``, owned by the compiler) with the file's path; the returned :class:`Reason`
(what ``explain`` lists for the group) names the path too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import traceback
from pathlib import Path

from torchloom.codegen.base import Reason
from torchloom.ir.graph import Node
from torchloom.ir.text import format_graph_name, format_type, print_node

log = logging.getLogger("torchloom.runtime")


def codegen_failed(codegen, stage: str, group: Node, exc: Exception,
                   repro_dir: Path | None, warned: set[str]) -> Reason:
    """Record that ``codegen`` raised ``exc`` while ``stage`` (``"judging"`` or
    ``"compiling"``) ``group``: write the group's IR, log once, and say why it moves on."""
    name = str(getattr(codegen, "name", type(codegen).__name__))
    error = f"{type(exc).__name__}: {exc}"
    where = group.graph.name if group.graph is not None else "?"
    header = [f"codegen {name!r} raised while {stage} this fusion group of @{where}",
              *error.splitlines(),
              *"".join(traceback.format_exception(exc)).splitlines()]
    text = "".join(f"// {line}\n" for line in header) + group_graph_text(group)
    path, problem = _write(text, name, repro_dir)
    kept = f"group IR: {path}" if path else f"group IR not written: {problem}"
    reason = Reason(name, f"raised while {stage} the group: {error} ({kept})")
    key = f"{name} {stage}: {error}"
    if key not in warned:
        warned.add(key)
        log.warning("torchloom: codegen %r raised while %s group @%s of @%s: %s; the group "
                    "runs on the next codegen (%s; logged once per error)", name, stage,
                    group.region.name if group.region is not None else "?", where,
                    error.splitlines()[0] if error.strip() else error, kept)
    return reason


def group_graph_text(group: Node) -> str:
    """IR text of a graph holding just ``group``: its inputs, the group, its outputs."""
    inputs = list(dict.fromkeys(group.inputs))
    params = ", ".join(f"%{v.name}: {format_type(v.type)}" for v in inputs)
    name = group.graph.name if group.graph is not None else "group"
    outs = ", ".join(f"%{v.name}" for v in group.outputs)
    return (f"graph @{format_graph_name(name)}({params}) {{\n{print_node(group, '  ')}\n"
            f"  return {outs}\n}}\n")


def _write(text: str, codegen: str, repro_dir: Path | None) -> tuple[str | None, str]:
    """The file's path (None if it could not be written) and, if not, why."""
    digest = hashlib.sha256(f"{codegen}\n{text}".encode()).hexdigest()[:16]
    filename = f"codegen-{re.sub(r'[^A-Za-z0-9_.-]', '_', codegen)}-{digest}.ir"
    problem = ""
    for root in ([repro_dir] if repro_dir is not None else []) + [
            Path(tempfile.gettempdir()) / "torchloom-reproducers"]:
        try:
            return str(_write_once(root, filename, text)), ""
        except OSError as exc:
            problem = f"{root} cannot be written ({exc.strerror or exc})"
    return None, problem


def _write_once(root: Path, filename: str, text: str) -> Path:
    """``root/filename`` holding ``text``: written whole (temporary file, then renamed),
    or left as it is when an earlier identical failure wrote it."""
    path = root / filename
    if path.is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{filename}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
