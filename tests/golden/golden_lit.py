"""A small ``lit``: runs the ``// RUN:`` lines of golden IR files.

A RUN line is a pipeline of commands joined by ``|``, as a shell reads it::

    // RUN: torchloom opt %s --passes cse | filecheck %s
    // RUN: not torchloom opt %s --passes views.collapse 2>&1 | filecheck %s --check-prefix ERR

``%s`` is the file's path. ``torchloom ...`` runs the real command line in this process
(``torchloom.cli.main``: no interpreter start per file); ``2>&1`` sends its stderr into
the pipe; ``not`` expects a non-zero exit; ``filecheck ...`` runs the ``filecheck``
package's tool on what the pipe carries. The same line also runs unchanged under a shell
(``sh -c``), which :func:`shell_command` gives.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import attrs


@attrs.frozen
class Outcome:
    ok: bool
    #: what went wrong: the command, its exit code and output (empty when ok)
    report: str = ""


def run_lines(path: Path) -> list[str]:
    """The RUN lines of a file, ``%s`` not yet substituted."""
    return [ln.split("RUN:", 1)[1].strip() for ln in path.read_text().splitlines()
            if ln.lstrip().startswith("//") and "RUN:" in ln]


def shell_command(line: str, path: Path) -> str:
    """The RUN line as a shell command (``%s`` quoted)."""
    return line.replace("%s", shlex.quote(str(path)))


def run_file(path: Path) -> Outcome:
    """Run every RUN line of ``path``; the first failure's report, or ok."""
    lines = run_lines(path)
    if not lines:
        return Outcome(False, f"{path}: no // RUN: line")
    for line in lines:
        outcome = run_line(line, path)
        if not outcome.ok:
            return outcome
    return Outcome(True)


def run_line(line: str, path: Path) -> Outcome:
    data = ""
    for command in line.split("|"):
        words = [w.replace("%s", str(path)) for w in shlex.split(command)]
        expect_failure = words[:1] == ["not"]
        words = words[1:] if expect_failure else words
        merge = "2>&1" in words
        words = [w for w in words if w != "2>&1"]
        if not words:
            return Outcome(False, f"RUN: {line}\nempty command in the pipe")
        if words[0] == "torchloom":
            code, out, err = _torchloom(words[1:], data)
        elif words[0] == "filecheck":
            code, out, err = _filecheck(words[1:], data)
        else:
            return Outcome(False, f"RUN: {line}\nunknown command {words[0]!r} (torchloom, "
                                  f"filecheck, not)")
        if expect_failure == (code == 0):
            return Outcome(False, f"RUN: {line}\n`{' '.join(words)}` exited with {code}"
                                  f"{' (expected a failure)' if expect_failure else ''}\n"
                                  f"--- stdout\n{out}--- stderr\n{err}")
        data = out + err if merge else out
    return Outcome(True)


def _torchloom(argv: list[str], stdin: str) -> tuple[int, str, str]:
    from torchloom.cli import main
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


def _filecheck(argv: list[str], stdin: str) -> tuple[int, str, str]:
    exe = shutil.which("filecheck") or str(Path(sys.executable).parent / "filecheck")
    run = subprocess.run([exe, *argv], input=stdin, text=True, capture_output=True,
                         timeout=120)
    return run.returncode, run.stdout, run.stderr
