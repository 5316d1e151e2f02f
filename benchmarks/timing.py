"""Timing helpers shared by the CPU benchmarks."""

from __future__ import annotations

import contextlib
import gc


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
