"""What the shared-cache tests share, and the function their child processes run.

A spawned (or forkserver) child imports the module that defines the function it runs; this
one imports nothing from the tests (no ``conftest``: in a child that name resolves to
whichever ``conftest.py`` comes first on the inherited ``sys.path``), so a child can always
load it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

KEY = "fleet-secret"

WORKLOAD = """
import torch

def workload():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 16), torch.nn.LayerNorm(16))
    return model, [torch.randn(8, 16)]
"""


def remote_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "remote cache" in r.getMessage()]


def entries(client, namespace: str) -> list[bytes]:
    return sorted(client.scan_iter(f"torchloom:{namespace}:*"))


def recording_cc(directory: Path) -> tuple[Path, Path]:
    """A C compiler that notes each run in ``<dir>/cc-runs.txt`` and runs ``cc``:
    ``(the script, its log)``. Point ``CC`` at the script to count compiler runs."""
    log = directory / "cc-runs.txt"
    script = directory / "recording-cc"
    script.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec {shutil.which("cc")} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, log


def runs(log: Path) -> list[str]:
    """The compiler runs ``log`` (see :func:`recording_cc`) holds."""
    return log.read_text().splitlines() if log.exists() else []


def explain_in_new_process(redis_url: str, workload: Path, cache_dir: Path) -> dict:
    """``torchloom explain --json --cached`` of ``workload`` in a new process whose local
    cache is ``cache_dir``, against the shared cache at ``redis_url``: the explain data."""
    env = {**os.environ, "TORCHLOOM_REMOTE_CACHE": redis_url,
           "TORCHLOOM_REMOTE_CACHE_KEY": KEY, "TORCHLOOM_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-m", "torchloom", "explain", str(workload),
                           "--json", "--cached"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def explain_on_new_machine(args: tuple) -> dict:
    """In a pool worker: once every worker is at ``barrier`` (a manager's proxy), explain
    ``--cached`` the workload with an empty local cache against the shared cache; the
    explain data, with the warnings logged while compiling."""
    url, workload, cache_dir, barrier = args
    os.environ.update(TORCHLOOM_REMOTE_CACHE=url, TORCHLOOM_REMOTE_CACHE_KEY=KEY,
                      TORCHLOOM_CACHE_DIR=cache_dir)
    from torchloom.report.explain import explain

    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("torchloom").addHandler(handler)
    barrier.wait(timeout=240)
    data = explain(workload, cached=True).data
    return {**data, "warnings": warnings}
