"""``torchloom bench``: time eager, Inductor and torchloom on one workload, in one run.

Every variant is compiled and warmed up first (untimed), then timed in interleaved rounds
(eager, inductor, torchloom, eager, ...) so that a machine's drift hits all of them alike;
the reported time is the median over rounds of the mean time per call. Only ratios
measured in the same run mean anything: ``speedup`` is eager's time over the variant's.
Inductor is skipped, with the reason, when it cannot run here (no C++ compiler for CPU,
no Triton for CUDA, or its compilation fails). Forward only.
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import attrs
import torch

from torchloom.report.diagnose import compiled_failure
from torchloom.progress import Activity, Progress
from torchloom.workloads import flatten, load_workload, max_abs_error, run_eagerly

VARIANTS = ("eager", "inductor", "torchloom")


@attrs.define
class BenchResult:
    data: dict[str, Any]


def inductor_unavailable(device: str) -> str | None:
    """Why Inductor cannot run on ``device`` here, or None when it may."""
    try:
        import torch._inductor  # noqa: F401
    except Exception as exc:  # pragma: no cover - depends on the torch build
        return f"torch._inductor cannot be imported: {exc}"
    if device.startswith("cuda"):
        try:
            import triton  # noqa: F401
        except ImportError:
            return "Triton is not installed (Inductor needs it for CUDA)"
        return None
    if not any(shutil.which(cc) for cc in ("g++", "c++", "clang++", "cl")):
        return "no C++ compiler found (Inductor needs one for CPU)"
    return None


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time_calls(fn: Callable, inputs: list, iters: int, device: str) -> float:
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn(*inputs)
    _sync(device)
    return (time.perf_counter() - t0) / iters * 1e3


def bench(workload: str | Path, *, pipeline: str = "default", device: str = "cpu",
          iters: int = 20, rounds: int = 5, warmup: int = 3,
          inductor: bool = True) -> BenchResult:
    from torchloom.compiler import Compiler
    from torchloom.backend import torchloom_backend
    model, inputs = load_workload(workload, device)
    if isinstance(model, torch.nn.Module):
        model.eval()
    compiler = Compiler(pipeline, device=device, strict=True)
    fns: dict[str, Callable] = {"eager": model}
    results: dict[str, dict[str, Any]] = {}
    reason = inductor_unavailable(device) if inductor else "disabled with --no-inductor"
    torch._dynamo.reset()
    with torch.no_grad():
        expected = [t.detach() for t in flatten(run_eagerly(workload, lambda: model(*inputs)))]
        candidates = {"torchloom": lambda: torch.compile(model, backend=lambda gm, ex:
                                                         torchloom_backend(gm, ex, options={
                                                             "compiler": compiler}))}
        if reason is None:
            candidates["inductor"] = lambda: torch.compile(model, backend="inductor")
        else:
            results["inductor"] = {"skipped": reason}
        for name, make in candidates.items():
            try:
                fn = make()
                with Activity(f"bench: compiling {name}"):  # Inductor: minutes, silently
                    out = fn(*inputs)  # compiles
            except Exception as exc:
                if name == "torchloom":
                    error = compiled_failure(workload, compiler, exc)
                    raise error from (exc if error.__cause__ is exc else None)
                results[name] = {"skipped": f"compilation failed: "
                                            f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
                continue
            error = max_abs_error(expected, [t.detach() for t in flatten(out)])
            results[name] = {"max_abs_error": error if error != float("inf") else None}
            fns[name] = fn
        for fn in fns.values():
            for _ in range(warmup):
                fn(*inputs)
        samples: dict[str, list[float]] = {name: [] for name in fns}
        with Progress("bench: timing rounds", total=rounds) as progress:
            for r in range(rounds):
                for name, fn in fns.items():
                    samples[name].append(_time_calls(fn, inputs, iters, device))
                progress.update(r + 1)
    torch._dynamo.reset()
    eager_ms = statistics.median(samples["eager"])
    results["eager"] = {"max_abs_error": 0.0}
    for name, times in samples.items():
        ms = statistics.median(times)
        results[name].update(ms=round(ms, 5), speedup=round(eager_ms / ms, 3) if ms else None)
    data = {"workload": str(workload), "device": device, "pipeline": compiler.pipeline.name,
            "iters": iters, "rounds": rounds,
            "results": {name: results[name] for name in VARIANTS if name in results}}
    return BenchResult(data)


def format_bench(result: BenchResult) -> str:
    d = result.data
    lines = [f"workload {d['workload']} on {d['device']}, pipeline {d['pipeline']!r}: "
             f"median of {d['rounds']} rounds x {d['iters']} calls, forward only"]
    for name, r in d["results"].items():
        if "skipped" in r:
            lines.append(f"  {name:<10} skipped: {r['skipped']}")
            continue
        error = r.get("max_abs_error")
        check = "" if name == "eager" else (
            "  outputs differ from eager" if error is None else f"  max abs error {error:.3g}")
        lines.append(f"  {name:<10} {r['ms']:10.4f} ms/call  {r['speedup']:6.2f}x eager{check}")
    return "\n".join(lines)
