"""Minor page faults and time per step of a CPU row, torchloom / eager / Inductor in one
process, interleaved (what ``test_codegen_cpu_bench.py`` pairs), one thread.

    python benchmarks/step_faults.py mlp_block_training_step [ROUNDS]

Faults are ``getrusage``'s ``ru_minflt`` around each step. They depend on the allocator's
state, which the three sides share: glibc keeps freed memory or gives it back (and faults
it in again) by its dynamic thresholds. ``MALLOC_MMAP_THRESHOLD_=131072`` (fixed, so no
longer adjusted) makes every allocation of 128 KB or more a fresh mapping: the count is
then each side's fresh pages per step, a deterministic measure of what it allocates.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from cpu_rows import row, step


def sides(name: str, cache_dir: Path) -> dict:
    from torchloom.backend import torchloom_backend
    from torchloom.tools import Compiler
    fn, inputs, train = row(name)
    compiler = Compiler("default", cache_dir=cache_dir, compile_cache=False, strict=True)
    compiled = torch.compile(fn, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    found = {"torchloom": step(compiled, inputs, train), "eager": step(fn, inputs, train),
             "inductor": step(torch.compile(fn), inputs, train)}
    for run in found.values():  # compiled, and the allocator warmed, before measuring
        run()
        run()
    return found


def main(name: str, rounds: int) -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        runs = sides(name, Path(tmp))
        times: dict[str, list[float]] = {k: [] for k in runs}
        faults: dict[str, list[int]] = {k: [] for k in runs}
        for _ in range(rounds):
            for side, run in runs.items():
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                start = time.perf_counter()
                run()
                times[side].append(time.perf_counter() - start)
                faults[side].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(f"{name}: {rounds} rounds, load average {os.getloadavg()[0]:.2f}, 1 thread")
    for side in runs:
        print(f"  {side:9s} median {statistics.median(times[side]) * 1e3:8.2f} ms, faults "
              f"median {statistics.median(faults[side]):6.0f} (min {min(faults[side])}, "
              f"max {max(faults[side])})")
    for side in ("eager", "inductor"):
        ratio = statistics.median(times[side]) / statistics.median(times["torchloom"])
        print(f"  torchloom vs {side}: {ratio:.3f}x (medians)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mlp_block_training_step",
         int(sys.argv[2]) if len(sys.argv) > 2 else 15)
