"""What the parts of ``device_check.py`` share: the part and row records, the results
writer (each row to ``results.md`` and ``results.jsonl`` the moment it is measured), the
timers (``triton.testing.do_bench``, or CUDA events without Triton; wall clock for
launch-bound rows), interleaved rounds, the copy bandwidth, and compiling a callable with
Inductor or torchloom while keeping what each compile reports."""

from __future__ import annotations

import json
import statistics
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

#: the columns every table ends with
TAIL = ("status", "note")


@attrs.frozen
class Row:
    """One measured row: ``build(device, full)`` makes its workload (full size on the GPU,
    tiny on the CPU), ``smoke(built)`` runs it eagerly once (the dry run's check that the
    workload still builds and runs), ``measure(ctx, built)`` returns its metrics."""

    name: str
    build: Callable[[str, bool], Any]
    smoke: Callable[[Any], Any]
    measure: Callable[[Any, Any], dict]


@attrs.frozen
class Part:
    """A part of the check. ``rows(quick)`` lists its rows (none for the parts the driver
    runs itself: the machine, the tests); ``quick_budget_s`` 0: left out of ``--quick``."""

    name: str
    what: str
    budget_s: int
    quick_budget_s: int
    columns: tuple[str, ...]
    rows: Callable[[bool], Sequence[Row]] = lambda quick: ()

    def budget(self, quick: bool) -> int:
        return self.quick_budget_s if quick else self.budget_s


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v) for v in value)
    return "" if value is None else str(value).replace("|", "/").replace("\n", " ")


class Results:
    """``results.md`` (a table per part) and ``results.jsonl`` (a JSON object per row),
    appended and flushed row by row: a run cut short keeps every row it measured."""

    def __init__(self, out: Path, t0: float):
        self.out, self.t0 = out, t0
        self.md, self.jsonl = out / "results.md", out / "results.jsonl"

    def _append(self, path: Path, text: str) -> None:
        with open(path, "a") as f:
            f.write(text)
            f.flush()

    def text(self, markdown: str) -> None:
        self._append(self.md, markdown)

    def header(self, part: Part, budget: int) -> None:
        cols = ("row",) + part.columns + TAIL
        self.text(f"\n### {part.name} (budget {budget} s)\n\n{part.what}\n\n"
                  f"| {' | '.join(cols)} |\n|{' --- |' * len(cols)}\n")

    def row(self, part: Part, name: str, status: str, note: str = "", **metrics) -> None:
        record = {"part": part.name, "row": name, "status": status, "note": note,
                  "elapsed_s": round(time.time() - self.t0, 1), **metrics}
        self._append(self.jsonl, json.dumps(record, default=str) + "\n")
        cells = [name] + [fmt(metrics.get(c)) for c in part.columns] + [status, fmt(note)]
        self._append(self.md, "| " + " | ".join(cells) + " |\n")
        shown = ", ".join(f"{c}={fmt(metrics[c])}" for c in part.columns
                          if metrics.get(c) is not None)
        print(f"[row] {part.name}/{name}: {status}" + (f" {shown}" if shown else "")
              + (f" ({fmt(note)[:300]})" if note else ""), flush=True)


def error_text(exc: BaseException, limit: int = 400) -> str:
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[0] if first else ''}"[:limit]


# --- timing -------------------------------------------------------------------------

def gpu_ms(fn: Callable[[], Any], grad_to_none=None, rep_ms: int = 40) -> float:
    """Median milliseconds of one call on the GPU: ``triton.testing.do_bench`` (the L2 cache
    flushed before each call), or CUDA events around each call when Triton is missing."""
    import torch
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    if do_bench is not None:
        return float(do_bench(fn, warmup=10, rep=rep_ms, grad_to_none=grad_to_none,
                              return_mode="median"))
    for _ in range(3):
        fn()
    times = []
    for _ in range(20):
        for t in grad_to_none or ():
            t.grad = None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def wall_us(fn: Callable[[int], Any], calls: int) -> float:
    """Mean wall microseconds per call of ``calls`` back-to-back calls ``fn(i)``, the GPU
    synchronised before and after: what a launch-bound loop costs, CPU overhead included."""
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def interleaved(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Median over ``rounds`` of each variant's timer, the variants alternating within a
    round (the first one rotating), so that a slow spell of the machine hits all alike."""
    names = list(variants)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(variants[name]())
    return {n: statistics.median(s) for n, s in samples.items()}


def measure_copy_bandwidth(mib: int = 512) -> float:
    """Bytes per second of a device-to-device copy of ``mib`` MiB (read + write)."""
    import torch
    src = torch.empty(mib * 2 ** 18, device="cuda")
    dst = torch.empty_like(src)
    ms = min(gpu_ms(lambda: dst.copy_(src), rep_ms=50) for _ in range(3))
    return 2 * src.numel() * 4 / (ms * 1e-3)


def copy_bandwidth(out: Path) -> float:
    """The copy bandwidth the ``copy_bandwidth`` part measured in this run, or measured now."""
    path = out / "copy_bandwidth.json"
    if path.exists():
        return json.loads(path.read_text())["bytes_per_s"]
    return measure_copy_bandwidth()


# --- compiling ----------------------------------------------------------------------

def own_code(fn, tag: str):
    """``fn`` with a code object of its own: dynamo caches per code object, so each
    variant keeps its compiled graph however calls alternate."""
    if not isinstance(fn, types.FunctionType):
        return fn
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__,
                              fn.__closure__)


@attrs.frozen
class Variant:
    """A compiled callable and what its first call (the compile) reported."""

    fn: Callable
    compile_s: float
    kernels: int | None = None
    codegens: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    compiler: Any = None


def compile_variant(fn, first_call: Callable[[Callable], Any], backend: str,
                    mode: str | None = None, dynamic: bool | None = False) -> Variant:
    """Compile ``fn`` with ``backend`` ("inductor" or "torchloom") and run ``first_call``
    on it (the compile happens there), timed to the GPU's end."""
    import torch
    if isinstance(fn, torch.nn.Module):  # a frame of its own per variant (see own_code)
        module = fn

        def fn(*args, **kwargs):
            return module(*args, **kwargs)
    fn = own_code(fn, f"{backend}_{(mode or 'default').replace('-', '_')}")
    compiler = None
    if backend == "inductor":
        from torch._inductor import metrics
        metrics.reset()
        compiled = torch.compile(fn, dynamic=dynamic, mode=mode)
    else:
        from torchloom.tools import Compiler
        compiler = Compiler("default", mode=mode)
        compiled = torch.compile(fn, backend="torchloom", dynamic=dynamic,
                                 options={"compiler": compiler})
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    first_call(compiled)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if compiler is None:
        return Variant(compiled, seconds, kernels=metrics.generated_kernel_count)
    return Variant(compiled, seconds, *torchloom_report(compiler), compiler=compiler)


def torchloom_report(compiler) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    """(kernels per call, codegens that ran groups, notes and fallbacks) of a compiler's
    compilations so far."""
    from torchloom.tools import count_kernels
    comps = compiler.compilations
    kernels = sum(count_kernels(c.graph, compiler.registry) for c in comps
                  if c.graph is not None)
    codegens = sorted({ch.codegen for c in comps if c.compiled for ch in c.compiled.choices})
    notes = [f"{c.name} fell back: {c.fallback_reason}" for c in comps if c.fallback_reason]
    notes += [n for c in comps for n in c.notes  # what was done as planned is no news
              if not n.startswith(("loaded from the compile cache", "dedup."))]
    return kernels, tuple(codegens), tuple(dict.fromkeys(notes))


def matches(got, want, rtol: float, atol: float) -> str:
    """"yes", or "NO: " and the first line of ``assert_close``'s message."""
    import torch
    try:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
        return "yes"
    except AssertionError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        return "NO: " + "; ".join(lines[:3])[:300]
