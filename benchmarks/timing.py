"""Timing helpers shared by the CPU benchmarks."""

from __future__ import annotations

import contextlib
import gc
import json
import subprocess
import sys
import time
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


def python_speed(rounds: int = 3) -> float:
    """CPU seconds of a fixed pure-Python workload (best of ``rounds``): what a pass does
    per node (objects with slots, attribute reads, use-list appends, dicts and sets keyed
    by objects, small tuples), on 200k objects. This 2-vCPU machine runs the same Python
    code up to ~15% slower for minutes at a time when its neighbours are busy (measured
    in RESULTS.md: the pipeline at 10k and this figure move together), so a budget in
    seconds "on this machine" is checked against times scaled by this figure."""

    class _Obj:
        __slots__ = ("index", "src", "uses")

        def __init__(self, index: int, src: "_Obj | None"):
            self.index, self.src, self.uses = index, src, []

    best = float("inf")
    with gc_paused():
        for _ in range(rounds):
            t0 = time.process_time()
            objs: list[_Obj] = []
            for i in range(200_000):
                obj = _Obj(i, objs[i - 7] if i >= 7 else None)
                if obj.src is not None:
                    obj.src.uses.append(obj)
                objs.append(obj)
            order: dict[_Obj, tuple[int, int]] = {}
            seen: set[_Obj] = set()
            for obj in objs:
                order[obj] = (obj.index, len(obj.uses))
                if obj.src is not None and obj.src in order:
                    seen.add(obj.src)
            assert len(seen) == len(objs) - 7
            best = min(best, time.process_time() - t0)
            del objs, order, seen
    return best
