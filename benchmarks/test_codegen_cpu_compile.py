"""Cold and warm compile time of the cpu codegen against Inductor (issue 14): the first call
of a row in a fresh process, torchloom (``torch.compile(backend="torchloom")``, default
pipeline, every group on ``cpu``) against Inductor (``torch.compile`` default backend, its
C++ kernels built by the system compiler), same rows (``cpu_rows.py``), same machine, one
run.

What is timed: from after ``import torch`` to the first result (the forward under
``no_grad``, or forward and backward for the training step): importing torchloom and its
plugins (loaded by the backend's entry point on first use), Dynamo's trace, aot_autograd,
torchloom's pipeline and kernel builds (or Inductor's), and the call itself. ``import
torch`` is left out: both sides pay it alike, and it is not the compiler's; so are the
imports of torch's compile stack every AOT backend needs (Dynamo, aot_autograd and its
partitioners, ``torch._inductor``'s package, which ``torch.compile`` imports whatever the
backend: about 1.2-2 s here), recorded as ``import_s``. Also recorded, for torchloom: its
own part (``own_s``: ``Compiler.compile_fx`` over the forward and backward graphs: FX to
IR, passes or the compile cache, C generation, the runtime plan; gcc, started there on a
thread, may end after it, during the call, which waits for it: in ``first_call_s``),
importing it (``torchloom_import_s``) and building its ``Compiler`` (plugins and the
pipeline, ``compiler_init_s``); the rest of the first call is Dynamo's trace,
aot_autograd's and the call itself.

- cold: empty caches (``TORCHLOOM_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR`` point at new
  temporary directories, so torchloom's compile cache and kernel libraries and Inductor's
  FX-graph, AOT-autograd and C++ caches all start empty);
- warm: a second fresh process over the same directories (every cache hits).

With ``TORCHLOOM_BENCH_FULL=1``, two floors are measured beside the warm runs, each in a
fresh process: ``dynamo`` (the row under ``torch.compile(backend="eager")``: Dynamo's trace
and guards, no aot_autograd, the graph run by eager: what any ``torch.compile`` backend
pays before its own work) and ``uncompiled`` (the row's first call without
``torch.compile``: its ops' own first-call costs, allocator and thread-pool start-up).
They gate nothing (about 15 s of a CI run: not there).

Gates: cold first call torchloom / Inductor <= ``COLD_RATIO`` (0.3, the issue's goal for
the MLP training step) on both rows; warm, torchloom's own part <= ``WARM_OWN_SECONDS`` and
its whole first call <= ``WARM_RATIO`` x Inductor's (regression guards: the issue asks 0.2
s for a warm start, which torchloom's own part meets on a lightly loaded machine, while
Dynamo's and aot_autograd's tracing of the training step alone take more: see
``benchmarks/RESULTS.md``).

Run: ``python -m pytest benchmarks/test_codegen_cpu_compile.py -s`` (Inductor's cold
compiles take most of its minute or two).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import pytest

#: the issue's goal: torchloom's cold first call at most this fraction of Inductor's
COLD_RATIO = 0.3
#: torchloom's warm first call (caches hit, fresh process) at most this fraction of
#: Inductor's warm first call (measured 0.09-0.45 at load averages 2-7 on 2 cores)
WARM_RATIO = 0.6
#: torchloom's own part of a warm first call (import, Compiler, compile_fx over the cached
#: graphs and libraries), seconds: the issue's 0.2 s, with room for a loaded machine
#: (0.1-0.2 s measured at load 2, 0.45-0.57 s at load 7)
WARM_OWN_SECONDS = 0.8
ROWS = ("layer_norm_residual_gelu", "mlp_block_training_step")


def first_call(backend: str, name: str) -> dict:
    """Seconds to the row's first result in this process: ``first_call_s`` from after
    the imports of torch's compile stack that every AOT backend pays alike (``import_s``:
    ``torch._inductor``'s package and Dynamo, which ``torch.compile`` imports whatever the
    backend, and aot_autograd with the partitioners, which both backends call)."""
    import torch
    start = time.perf_counter()
    import torch._dynamo.backends.common  # noqa: F401
    import torch._functorch.partitioners  # noqa: F401
    import torch._inductor  # noqa: F401
    imported = time.perf_counter()
    from cpu_rows import row, step
    fn, inputs, train = row(name)
    own = {"s": 0.0, "compilers": [], "init_s": 0.0}
    if backend == "torchloom":
        t0 = time.perf_counter()
        from torchloom.compiler import Compiler
        own["import_s"] = time.perf_counter() - t0
        original, original_init = Compiler.compile_fx, Compiler.__init__

        def timed_init(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                original_init(self, *args, **kwargs)
            finally:
                own["init_s"] += time.perf_counter() - t0
        Compiler.__init__ = timed_init

        def timed(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                own["s"] += time.perf_counter() - t0
                own["compilers"].append(self)
        Compiler.compile_fx = timed
        compiled = torch.compile(fn, backend="torchloom")
    elif backend == "dynamo":
        compiled = torch.compile(fn, backend="eager")
    elif backend == "uncompiled":
        compiled = fn
    else:
        compiled = torch.compile(fn)
    step(compiled, inputs, train)()
    done = time.perf_counter()
    result = {"first_call_s": done - imported, "import_s": imported - start}
    if backend == "torchloom":
        comps = [c for compiler in dict.fromkeys(own["compilers"]) for c in compiler.compilations]
        result.update(own_s=own["s"], torchloom_import_s=own["import_s"],
                      compiler_init_s=own["init_s"], cached=[c.cached for c in comps],
                      codegens=sorted({ch.codegen for c in comps for ch in c.compiled.choices}),
                      fallbacks=[c.fallback_reason for c in comps if c.fallback_reason])
    return result


def _run(env: dict, *args: str) -> dict:
    """This file run with ``args`` in a fresh interpreter; the JSON it prints. Bytecode is
    written and read (``PYTHONDONTWRITEBYTECODE`` dropped), as an installed package has its
    ``.pyc`` files."""
    import subprocess
    child_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    child = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                           timeout=1200, cwd=os.path.dirname(__file__), env={**child_env, **env})
    assert child.returncode == 0, child.stderr[-4000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def _installed() -> dict:
    """Import torchloom and its plugins once, writing their bytecode (what installing a
    package does), so no measured process compiles torchloom's Python sources."""
    from torchloom.tools import load_plugins
    return {"plugins": sorted(load_plugins().codegens)}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """torchloom imported once in a fresh interpreter (its bytecode written)."""
    return _run({"TORCHLOOM_CACHE_DIR": str(tmp_path_factory.mktemp("installed")),
                 "TORCHLOOM_REMOTE_CACHE": ""}, "--installed")


@pytest.mark.parametrize("name", ROWS)
def test_cold_and_warm_first_call(benchmark, tmp_path, installed, name):
    env = {"TORCHLOOM_CACHE_DIR": str(tmp_path / "torchloom"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "TORCHLOOM_REMOTE_CACHE": ""}
    assert "cpu" in installed["plugins"]
    floors = ("dynamo", "uncompiled") if os.environ.get("TORCHLOOM_BENCH_FULL") == "1" else ()

    def measure():
        cold = {b: _run(env, "--backend", b, "--row", name) for b in ("torchloom", "inductor")}
        warm = {b: _run(env, "--backend", b, "--row", name)
                for b in ("torchloom", "inductor", *floors)}
        return cold, warm
    cold, warm = benchmark.pedantic(measure, rounds=1, iterations=1)
    ours, theirs = cold["torchloom"], cold["inductor"]
    assert ours["codegens"] == ["cpu"] and not ours["fallbacks"], ours
    assert not any(ours["cached"]) and all(warm["torchloom"]["cached"]), (ours, warm)
    ratio = ours["first_call_s"] / theirs["first_call_s"]
    benchmark.extra_info.update(cold=cold, warm=warm, cold_ratio=ratio)
    print(f"\n{name}: cold torchloom {ours['first_call_s']:.2f} s (own {ours['own_s']:.2f} s), "
          f"Inductor {theirs['first_call_s']:.2f} s, ratio {ratio:.2f}; warm torchloom "
          f"{warm['torchloom']['first_call_s']:.2f} s (own {warm['torchloom']['own_s']:.3f} s, "
          f"import {warm['torchloom']['torchloom_import_s']:.3f} s, compiler "
          f"{warm['torchloom']['compiler_init_s']:.3f} s), "
          f"Inductor {warm['inductor']['first_call_s']:.2f} s (shared imports before: "
          f"{ours['import_s']:.2f} s)" + ("; floors: Dynamo alone (backend='eager') "
          f"{warm['dynamo']['first_call_s']:.2f} s, uncompiled "
          f"{warm['uncompiled']['first_call_s']:.2f} s" if floors else ""))
    assert ratio <= COLD_RATIO
    assert warm["torchloom"]["first_call_s"] <= WARM_RATIO * warm["inductor"]["first_call_s"]
    assert _own(warm["torchloom"]) <= WARM_OWN_SECONDS


def _own(side: dict) -> float:
    """torchloom's own seconds in a first call: importing it, its Compiler, compile_fx."""
    return side["own_s"] + side["torchloom_import_s"] + side["compiler_init_s"]


if __name__ == "__main__":  # one side's first call, in a fresh process
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("torchloom", "inductor", "dynamo", "uncompiled"))
    parser.add_argument("--row")
    parser.add_argument("--installed", action="store_true")
    args = parser.parse_args()
    print(json.dumps(_installed() if args.installed else first_call(args.backend, args.row)))
