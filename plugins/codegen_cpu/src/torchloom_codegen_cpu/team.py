"""Several nests in one parallel region: a function whose nests are all plain loops over
rows (static sizes; no column sums, overrun, blocks or staging) runs them in one
``#pragma omp parallel`` region, each nest's rows shared by ``#pragma omp for`` (a small
nest: one thread, ``#pragma omp single``), as Inductor's combo kernels do::

    #pragma omp parallel num_threads(nthreads)
    {
      #pragma omp for schedule(static)
      for (int64_t x = 0; x < 8192; x++) { ... }     a parameter's update
      #pragma omp single
      for (int64_t x = 0; x < 1; x++) { ... }        the step counts
    }

Each construct ends at a barrier, so nests still run one after the other (inplace.py's
order holds). Entering a region costs ~µs: a combined optimizer step (``fusion.combine``)
pays it once per function, not once per nest, and a nest of a few thousand elements
still gets every thread (in a cold cache two threads stream more than one).
"""

from __future__ import annotations

from torchloom.api import stmt

from torchloom_codegen_cpu.kernel import KernelWriter
from torchloom_codegen_cpu.render import Pragma, in_block
from torchloom_codegen_cpu.overrun import PARALLEL, PARALLEL_MIN, work

#: below this many element-arrays (elements times arrays touched) a nest of a team runs
#: on one thread: a barrier's cost against a share of the work
SHARED_MIN = 8192


def teamable(nests: list[KernelWriter]) -> bool:
    """Whether the nests can share one parallel region: more than one, each a plain loop
    over rows of static sizes, and work enough for threads in all."""
    if len(nests) < 2:
        return False
    for w in nests:
        if w.loop.var != "x" or w.loop.blocks is not None or w.columns or w.em.overran \
                or w.staged or not isinstance(w.loop.trips, int) or \
                not isinstance(w.numel, int):
            return False
    return sum(work(w.numel, w.planned[2]) for w in nests) >= 2 * PARALLEL_MIN


def team_body(nests: list[KernelWriter]) -> list:
    """The nests' statements in one parallel region (see the module docstring)."""
    body: list = []
    for w in nests:
        before, rows, arrays = w.planned
        shared = w.loop.trips > 1 and work(w.numel, arrays) >= SHARED_MIN
        pragma = Pragma("#pragma omp for schedule(static)" if shared else "#pragma omp single")
        body += in_block(before, [stmt.Loop("x", "0", str(w.loop.trips), tuple(rows),
                                            annotation=pragma)])
    return [stmt.Block(tuple(body), Pragma(PARALLEL))]
