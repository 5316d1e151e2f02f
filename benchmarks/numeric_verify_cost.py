"""The cost of ``verify = "numeric"`` on the example workloads (issue 43): every
``examples/*.py`` compiled through ``explain`` (every pass runs, the compile cache off)
with the default pipeline under ``verify = "each"`` and ``"numeric"``, interleaved, and the
pass manager's CPU time (the sum of the passes' ``cpu_ms``, which includes verification)
compared per workload (the best of ``ROUNDS``; torch on one thread, so CPU time is not
inflated by OpenMP threads spinning on a loaded machine). Prints a Markdown table; ``python benchmarks/numeric_verify_cost.py
[ROUNDS]``. Not a pytest module: absolute times, reported in ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = '[pipeline]\nname = "default-{v}"\nextends = "default"\nverify = "{v}"\n'


def pass_cpu_ms(workload: Path, pipeline: Path) -> tuple[float, int, int]:
    from torchloom.report.explain import explain
    with contextlib.redirect_stdout(io.StringIO()):
        result = explain(str(workload), pipeline=str(pipeline))
    passes = result.data["passes"]
    changed = sum(1 for p in passes if p["changed"])
    return sum(p.get("cpu_ms", p["ms"]) for p in passes), len(passes), changed


def main(rounds: int = 3) -> None:
    import torch
    torch.set_num_threads(1)  # CPU time without OpenMP's spinning on a shared 2-vCPU machine
    tmp = Path(tempfile.mkdtemp())
    files = {}
    for v in ("each", "numeric"):
        files[v] = tmp / f"{v}.toml"
        files[v].write_text(PIPELINE.format(v=v))
    print("| workload | graphs' passes run (changed) | passes, verify each (ms CPU) | "
          "verify numeric (ms CPU) | added |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for workload in sorted((ROOT / "examples").glob("*.py")):
        best = {"each": float("inf"), "numeric": float("inf")}
        runs = changed = 0
        for _ in range(rounds):
            for v in ("each", "numeric"):
                ms, runs, changed = pass_cpu_ms(workload, files[v])
                best[v] = min(best[v], ms)
        added = best["numeric"] - best["each"]
        print(f"| {workload.stem} | {runs} ({changed}) | {best['each']:.1f} | "
              f"{best['numeric']:.1f} | {added:+.1f} ms ({best['numeric'] / best['each']:.2f}x) |",
              flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
