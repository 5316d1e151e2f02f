"""The model zoo of issue 41: small Hugging Face models built from configs inside the
process (random weights, nothing downloaded), eager, Inductor and torchloom side by side in
one run, interleaved rounds, median ms per step; the speed-ups are the medians over
rounds of the two sides' step times in the same round (paired: the machine's drift between
rounds cancels).

Rows (``MODES``), per model and thread count:

- ``train``: forward with labels, ``loss.backward()``, an AdamW step (``foreach``, eager on
  every side: the same cost everywhere) and ``zero_grad``;
- ``infer``: the forward under ``torch.no_grad()`` in eval mode;
- ``optimizer``: the AdamW step alone (``foreach``; gradients set once), compiled on the
  compiled sides as PyTorch's compiled-optimizer recipe does (``torch.compile(optimizer.step)``),
  eager's ``foreach`` step on the eager side;
- ``step``: ``train`` with that recipe: the model and the AdamW step compiled on the
  compiled sides (what a user compiling both runs), eager's ``foreach`` step on the eager
  side;
- ``checkpointed``: ``train`` with activation checkpointing (each layer's activations
  recomputed in the backward, non-reentrant); every model but ConvNeXt has it;
- ``dynamic``: inference over several sequence lengths per step, in the mixed order a
  server sees them (default ``torch.compile``: the first length compiles a static graph,
  the second one with a symbolic length that the others run); models with ``lengths``.

Every side gets its own model (same seed, same weights) and optimizer. Compiled sides
start cold: Inductor inside ``torch._inductor.utils.fresh_cache()``, torchloom with a new
cache directory (its kernel cache and the cpu codegen's libraries); the first call
(compiles included, the backward's at the first backward; torchloom's ``Compiler`` too, made
when the backend is first called) is timed. torchloom's side then runs untimed steps
until its matrix products' trials (``torchloom.codegen.gemm``: each product shape's first
calls time its candidates) have decided, at most :data:`TRIAL_STEPS`: the rounds time
what a user's later steps run, not the trials. ``torch._dynamo.reset()`` after each row.

For torchloom, every fusion group no native codegen took (it runs op by op on the ``eager``
codegen) is counted with the codegens' reasons (:func:`eager_groups`); issue 41 wants none.

Run the whole zoo and get a markdown table::

    .venv/bin/python benchmarks/model_zoo.py --threads 2 1 --out table.md
    .venv/bin/python benchmarks/model_zoo.py --models gpt2 vit --modes infer --quick

``--isolate`` runs each side in a process of its own (``zoo_isolated.py``): in one
process the sides share glibc's heap, and torchloom's cpu codegen has glibc keep freed
memory, which spares eager and Inductor their page faults there too; alone, each side
runs as its user's process does. ``--beyond`` adds the models of ``zoo_models.BEYOND``
(Mistral, Gemma, GPT-NeoX, OPT, DistilBERT, RoBERTa, BART, DeiT, Swin, ResNet).

Rows print as they are measured. ``benchmarks/test_model_zoo.py`` gates a few rows in CI
(``TORCHLOOM_ZOO=full`` runs it over the whole zoo).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import torch

from timing import gc_paused
from zoo_models import (  # noqa: F401 (the zoo's names, importers take from here)
    BEYOND, IMAGE, IMAGES, MODELS, MODES, NOT_CHECKPOINTED, SERVED_LENGTHS, SIDES, TOKENS,
    TRAINING, VOCAB, ZOO, ZooModel, rows)


# ---- compiling and timing ------------------------------------------------------------------
#: the most untimed steps torchloom's side runs after its first call while its matrix
#: products' trials are under way (module text)
TRIAL_STEPS = 20


@attrs.define
class Side:
    """One side of a row: ``step()`` runs one step; ``first_call_s`` timed the first."""

    step: Callable[[], None]
    first_call_s: float
    compiler: object | None = None  # torchloom's Compiler


@contextlib.contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def make_side(name: str, mode: str, side: str, cache_root: Path) -> Side:
    """Build the model, compile it for ``side`` (``eager``: not compiled), and run the
    first step, timed. ``cache_root``: where torchloom's cold caches go."""
    spec = MODELS[name]
    torch.manual_seed(0)  # the same weights on every side
    model = spec.build().train(mode in TRAINING)
    if mode == "checkpointed":
        model.gradient_checkpointing_enable({"use_reentrant": False})
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False  # no key/value cache in the outputs
    g = torch.Generator().manual_seed(1)
    lengths = spec.lengths if mode == "dynamic" else (TOKENS,)
    batches = [spec.batch(g, n) for n in lengths]
    if mode not in TRAINING:  # a server computes no loss
        batches = [{k: v for k, v in b.items() if k != "labels"} for b in batches]
    backend, fresh = None, contextlib.nullcontext
    made: list = []  # torchloom's Compiler, made in the timed first call (as a user's is)
    if side == "inductor":
        from torch._inductor.utils import fresh_cache
        backend, fresh = "inductor", fresh_cache
    elif side == "torchloom":
        from torchloom.backend import torchloom_backend
        from torchloom.tools import Compiler
        cache_root.mkdir(parents=True, exist_ok=True)
        cache = Path(tempfile.mkdtemp(prefix=f"{name}-{mode}-", dir=cache_root))

        def backend(gm, ex):
            if not made:
                with _env("TORCHLOOM_CACHE_DIR", str(cache)):  # the cpu codegen's too
                    made.append(Compiler("default", cache_dir=cache, compile_cache=False))
            return torchloom_backend(gm, ex, options={"compiler": made[0]})
    elif side != "eager":
        raise ValueError(f"side {side!r}: expected one of {', '.join(SIDES)}")

    def compiled(f):
        return f if backend is None else torch.compile(f, backend=backend)
    if mode == "optimizer":
        for p in model.parameters():  # the same gradients on every side
            p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        step = compiled(optimizer.step)
    elif mode in TRAINING:
        fn = compiled(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        update = compiled(optimizer.step) if mode == "step" else optimizer.step

        def step():
            fn(**batches[0]).loss.backward()
            update()
            optimizer.zero_grad(set_to_none=True)
    else:
        fn = compiled(model)

        def step():
            with torch.no_grad():
                for batch in batches:
                    fn(**batch)
    with fresh():
        start = time.perf_counter()
        step()
        first = time.perf_counter() - start
    compiler = made[0] if made else None
    settle_trials(step, compiler)
    return Side(step, first, compiler)


def settle_trials(step: Callable[[], object], compiler) -> int:
    """Run ``step`` until ``compiler``'s matrix products have no trial under way, at most
    :data:`TRIAL_STEPS` times (module text); the steps run. No compiler: none."""
    ran = 0
    while compiler is not None and compiler.gemms.trials and ran < TRIAL_STEPS:
        step()
        ran += 1
    return ran


def interleaved(steps: dict[str, Callable[[], float | None]], rounds: int,
                warmup: int = 1, *, timed_inside: bool = False,
                gap_s: float = 0.0) -> dict[str, list[float]]:
    """Seconds of each side's step in each of ``rounds`` rounds that run every side once,
    the order rotated each round (drift and cache effects favour none). ``timed_inside``:
    each step returns the seconds it measured itself (a side in another process,
    :mod:`zoo_isolated`), which are taken instead of the time around the call; ``gap_s``:
    an idle pause before each step (another process's OpenMP workers stop spinning)."""
    names = list(steps)
    for _ in range(warmup):
        for n in names:
            time.sleep(gap_s)
            steps[n]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    with gc_paused():
        for r in range(rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                time.sleep(gap_s)
                start = time.perf_counter()
                took = steps[n]()
                samples[n].append(took if timed_inside else time.perf_counter() - start)
    return samples


def paired_ratios(samples: dict[str, list[float]]) -> dict[str, float]:
    """Side -> the median over rounds of its step time over torchloom's in that round
    ({} without a torchloom side)."""
    ours = samples.get("torchloom")
    return {} if ours is None else {
        k: statistics.median(a / b for a, b in zip(v, ours)) for k, v in samples.items()}


@attrs.frozen
class EagerGroups:
    """What torchloom compiled: ``groups`` fusion groups, ``on_eager`` of them run op by op,
    ``reasons`` (why the native codegens declined each, one string per group) -> count,
    ``fallbacks``: graphs that fell back whole to eager, with why."""

    graphs: int
    groups: int
    on_eager: int
    reasons: dict[str, int]
    fallbacks: tuple[str, ...]


def eager_groups(compiler) -> EagerGroups:
    reasons: collections.Counter[str] = collections.Counter()
    groups = on_eager = 0
    for comp in compiler.compilations:
        for choice in comp.compiled.choices if comp.compiled is not None else ():
            groups += 1
            if choice.codegen == "eager":
                on_eager += 1
                reasons["; ".join(str(r) for r in choice.fallback_reasons
                                  if r.codegen != "eager") or "(no reason given)"] += 1
    fallbacks = tuple(f"{c.name}: {c.fallback_reason}" for c in compiler.compilations
                      if c.fallback_reason)
    return EagerGroups(len(compiler.compilations), groups, on_eager, dict(reasons), fallbacks)


@attrs.frozen
class RowResult:
    model: str
    mode: str
    threads: int
    ms: dict[str, float]  # side -> median ms per step
    first_call_s: dict[str, float]  # side -> seconds of the first step (compiles included)
    groups: EagerGroups | None
    #: side -> the median over rounds of (its step / torchloom's step in the same round)
    paired: dict[str, float] = attrs.field(factory=dict)

    def speedup(self, over: str) -> float:
        """``over``'s time / torchloom's (above 1: torchloom is faster): the median of the
        rounds' ratios (a shared VM's speed drifts 1.5x within minutes), else the ratio
        of the medians."""
        if over in self.paired:
            return self.paired[over]
        return self.ms[over] / self.ms["torchloom"]

    @classmethod
    def of_rounds(cls, name: str, mode: str, threads: int, samples: dict[str, list[float]],
                  first_call_s: dict[str, float], groups: EagerGroups | None) -> RowResult:
        """The row from the seconds of each side's step in each round."""
        return cls(name, mode, threads,
                   {k: statistics.median(v) * 1e3 for k, v in samples.items()},
                   first_call_s, groups, paired_ratios(samples))


def measure_row(name: str, mode: str, threads: int, *, sides=SIDES, rounds: int = 7,
                warmup: int = 1, cache_root: Path | None = None) -> RowResult:
    """Compile every side of a row (cold), then time them in interleaved rounds."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # before compiling: Inductor bakes it into its kernels
    owned = cache_root is None
    cache_root = Path(tempfile.mkdtemp(prefix="zoo-")) if owned else cache_root
    try:
        built = {side: make_side(name, mode, side, cache_root) for side in sides}
        samples = interleaved({side: b.step for side, b in built.items()}, rounds, warmup)
        compiler = built["torchloom"].compiler if "torchloom" in built else None
        return RowResult.of_rounds(name, mode, threads, samples,
                                   {side: b.first_call_s for side, b in built.items()},
                                   eager_groups(compiler) if compiler is not None else None)
    finally:
        torch._dynamo.reset()
        torch.set_num_threads(before)
        if owned:
            import shutil
            shutil.rmtree(cache_root, ignore_errors=True)


# ---- the table -----------------------------------------------------------------------------
HEADER = ("| model | row | threads | eager ms | Inductor ms | torchloom ms | vs eager "
          "| vs Inductor | first call s: Inductor | torchloom | groups on eager |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def table_row(r: RowResult) -> str:
    def ms(side):
        return f"{r.ms[side]:.1f}" if side in r.ms else "-"

    def ratio(side):
        return f"{r.speedup(side):.2f}" if side in r.ms and "torchloom" in r.ms else "-"

    def first(side):
        return f"{r.first_call_s[side]:.1f}" if side in r.first_call_s else "-"
    groups = f"{r.groups.on_eager} / {r.groups.groups}" if r.groups else "-"
    if r.groups and r.groups.fallbacks:
        groups += f" ({len(r.groups.fallbacks)} graphs on eager)"
    row = f"{r.mode} ({len(MODELS[r.model].lengths)} lengths)" if r.mode == "dynamic" else r.mode
    return (f"| {MODELS[r.model].title} | {row} | {r.threads} | {ms('eager')} | "
            f"{ms('inductor')} | {ms('torchloom')} | {ratio('eager')} | "
            f"{ratio('inductor')} | {first('inductor')} | {first('torchloom')} | {groups} |")


def geomeans(results: list[RowResult]) -> list[str]:
    lines = []
    for threads in sorted({r.threads for r in results}, reverse=True):
        for over in ("eager", "inductor"):
            got = [r.speedup(over) for r in results
                   if r.threads == threads and over in r.ms and "torchloom" in r.ms]
            if got:
                mean = math.exp(sum(map(math.log, got)) / len(got))
                lines.append(f"- {threads} thread(s): torchloom {mean:.2f}x "
                             f"{'Inductor' if over == 'inductor' else over} "
                             f"(geomean of {len(got)} rows)")
    return lines


def first_calls(results: list[RowResult]) -> list[str]:
    """torchloom's first call over Inductor's: the range, and the rows above 0.3x."""
    got = [(r.first_call_s["torchloom"] / r.first_call_s["inductor"], r) for r in results
           if {"torchloom", "inductor"} <= set(r.first_call_s)]
    if not got:
        return []
    above = ", ".join(f"{MODELS[r.model].title} {r.mode} {x:.2f}" for x, r in got if x > 0.3)
    return [f"- first calls: torchloom {min(x for x, _ in got):.2f}-"
            f"{max(x for x, _ in got):.2f}x Inductor's; above 0.3x: {above or 'none'}"]


def reasons_section(results: list[RowResult]) -> list[str]:
    """Per model: groups on eager with their reasons (summed over its rows at one thread
    count: the same graphs compile at each)."""
    lines = []
    threads = max(r.threads for r in results)
    for name in dict.fromkeys(r.model for r in results):
        reasons: collections.Counter[str] = collections.Counter()
        fallbacks: list[str] = []
        for r in results:
            if r.model == name and r.threads == threads and r.groups:
                reasons.update(r.groups.reasons)
                fallbacks += r.groups.fallbacks
        total = sum(reasons.values())
        lines.append(f"- **{MODELS[name].title}**: {total} group(s) on eager"
                     + (":" if total or fallbacks else ""))
        lines += [f"  - {n}x {reason}" for reason, n in reasons.most_common()]
        lines += [f"  - graph on eager: {f}" for f in fallbacks]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(ZOO),
                        help="the zoo's by default; those of BEYOND may be named too")
    parser.add_argument("--beyond", action="store_true",
                        help="also every model beyond the zoo (zoo_models.BEYOND)")
    parser.add_argument("--isolate", action="store_true",
                        help="each side in a process of its own (zoo_isolated.py): no "
                             "allocator or thread state shared between the sides")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--threads", nargs="+", type=int, default=[2, 1])
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per row (7)")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, no warm-up round: a look, not a measurement")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    args = parser.parse_args(argv)
    if "torchloom" not in args.sides:
        parser.error("--sides must include torchloom (the ratios are torchloom's)")
    rounds, warmup = (3, 0) if args.quick else (args.rounds, 1)
    models = list(dict.fromkeys(args.models + (list(BEYOND) if args.beyond else [])))
    measure = measure_row
    if args.isolate:
        from zoo_isolated import measure_row_isolated as measure
    lines = [HEADER]
    print(HEADER, flush=True)
    results = []
    for threads in args.threads:
        for name, mode in rows(models, args.modes):
            try:
                result = measure(name, mode, threads, sides=args.sides, rounds=rounds,
                                 warmup=warmup)
            except Exception as exc:  # one model's failure costs its row, not the run
                line = (f"| {MODELS[name].title} | {mode} | {threads} | failed: "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]} |")
            else:
                results.append(result)
                line = table_row(result)
            lines.append(line)
            print(line, flush=True)
    if results:
        tail = ["", "Speed-ups (other side's ms / torchloom's ms in the same round, the "
                "median over rounds):", *geomeans(results), *first_calls(results), "",
                "Groups on eager (torchloom), with the reasons the codegens gave:",
                *reasons_section(results)]
        print("\n".join(tail), flush=True)
        lines += tail
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
