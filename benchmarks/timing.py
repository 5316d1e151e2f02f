"""Timing helpers shared by the CPU benchmarks."""

from __future__ import annotations

import contextlib
import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def gc_paused():
    """Collect now, then keep Python's cyclic collector out of the timed region (as
    ``timeit`` does): a collection's cost depends on everything else alive in the process,
    not on the code being timed, and would distort size-to-size ratios."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def in_fresh_interpreter(script: str, *args: str, timeout: float = 1200) -> Any:
    """Run ``python script args...`` in a new interpreter and return the JSON it prints
    on its last line of output. A long test session's heap (the collector's passes over
    it, its cache misses) then weighs on neither size of a ratio."""
    child = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                           timeout=timeout, cwd=Path(script).parent)
    assert child.returncode == 0, child.stderr[-4000:]
    return json.loads(child.stdout.strip().splitlines()[-1])
