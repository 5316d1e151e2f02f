"""What the face commands (``explain``, ``bench``) tell a user when something goes wrong
that is not a torchloom error already: one paragraph that names the file, says what
failed and what to do next.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from torchloom.errors import CompiledRunError, TorchloomError
from torchloom.ir.text import print_node
from torchloom.runtime.cache import directory_problem


def check_output_dir(path: str | Path, option: str) -> Path:
    """Create the directory an option (``--dump``) names, or say why it cannot be
    written to (before anything runs)."""
    path = Path(path)
    problem = directory_problem(path)
    if problem is not None:
        raise TorchloomError(f"{option} {path}: cannot write there ({problem}); give a "
                             f"directory you can write to (it is created if missing)")
    return path


def check_output_file(path: str | Path, option: str) -> Path:
    """Say before anything runs why the file an option (``--html``) names cannot be
    written: a directory in its place, a folder that is missing or not writable."""
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        problem = "it is a directory; give a file name such as report.html"
    elif not folder.is_dir():
        problem = f"folder {folder} does not exist"
    elif not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        problem = "permission denied"
    else:
        return path
    raise TorchloomError(f"{option} {path}: cannot write there ({problem})")


def compiled_failure(workload: str | Path, compiler, exc: BaseException) -> TorchloomError:
    """The error to report when the workload, which ran eagerly, raised under
    ``torch.compile`` with torchloom: a torchloom error behind ``exc`` as it is, or a
    :class:`CompiledRunError` saying which stage (compiling a graph, or running a compiled
    graph, at which node) failed."""
    cause = torchloom_cause(exc)
    if cause is not None:
        return cause
    inner = _chain(exc)
    root = _chain(exc, implicit=False)[-1]  # not an exception it was raised while handling
    detail = f"{type(root).__name__}: {(str(root).strip().splitlines() or [''])[0]}"
    where = _compiled_frame(inner, compiler)
    if where is not None:
        what = f"the compiled graph {where} raised"
    elif any(type(e).__name__ == "BackendCompilerFailed" for e in inner):
        what = f"compiling graph{len(compiler.compilations)} failed (torchloom or a plugin)"
    else:
        what = "running it under torch.compile with the torchloom backend raised"
    error = CompiledRunError(
        f"{workload}: the workload runs eagerly without error, but fails when compiled with "
        f"torchloom (pipeline {compiler.pipeline.name!r}): {what}: {detail}. Rerun with "
        f"--traceback for the whole traceback, and with --pipeline none to see whether a "
        f"pass is involved; if so, report it to the pass's plugin, else to torchloom.")
    error.__cause__ = exc
    return error


def torchloom_cause(exc: BaseException):
    """The torchloom error behind an exception torch.compile wrapped (dynamo re-raises
    backend errors as BackendCompilerFailed), or None."""
    for e in _chain(exc):
        if isinstance(e, TorchloomError):
            return e
    return None


def _chain(exc: BaseException, implicit: bool = True) -> list[BaseException]:
    """``exc`` and the exceptions behind it, outermost first (``implicit``: also those it
    was raised while handling)."""
    seen: list[BaseException] = []
    while exc is not None and all(exc is not s for s in seen):
        seen.append(exc)
        exc = (getattr(exc, "inner_exception", None) or exc.__cause__
               or (exc.__context__ if implicit else None))
    return seen


def _compiled_frame(chain: list[BaseException], compiler) -> str | None:
    """``@graph0 at <node>`` for the innermost frame of torchloom's generated code (its
    file name is ``<torchloom @graph>``), or None when the failure was elsewhere."""
    found = None
    for e in chain:
        tb = e.__traceback__
        while tb is not None:
            m = re.fullmatch(r"<torchloom @(.+)>", tb.tb_frame.f_code.co_filename)
            if m:
                found = (m.group(1), tb.tb_lineno)
            tb = tb.tb_next
    if found is None:
        return None
    name, line = found
    for comp in compiler.compilations:
        if comp.graph is None or comp.graph.name != name or comp.compiled is None:
            continue
        lines = comp.compiled.source.splitlines()
        call = re.search(r"\bf(\d+)\(", lines[line - 1]) if 0 < line <= len(lines) else None
        nodes = list(comp.graph.nodes)
        if call and int(call.group(1)) < len(nodes):
            return f"@{name} at node `{print_node(nodes[int(call.group(1))])}`"
    return f"@{name} (line {line} of its generated code)"
