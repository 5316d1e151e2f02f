"""One command that turns a few minutes on a GPU into measured results (issue 46).

Run through ``benchmarks/gpu/device_check.sh [--quick] [--dry-run]``, which installs the
project first when needed. In order: the plan (each part's time budget), the machine
(``machine.json``), the ``cuda``-marked tests (``cuda_tests.txt``), then the parts below,
each in a process of its own (a hang or a broken CUDA context costs one part) with a hard
time limit, slowest last. Every row goes to ``results.md`` and ``results.jsonl`` under
``$OUT`` the moment it is measured; a part that fails is recorded with its error and the
rest go on; no part starts once the global deadline is near.

Without CUDA (or with ``--dry-run``) nothing is timed: every GPU row is recorded as
"skipped: no CUDA" after its workload was built and run eagerly on the CPU at a tiny
size, so that the script cannot rot unnoticed (``tests/test_device_check.py``).

    python benchmarks/gpu/device_check.py [--quick] [--dry-run] [--parts a,b] [--deadline S]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import attrs

from device_check_common import Part, Results, error_text

ROOT = Path(__file__).resolve().parents[2]
QUICK_DEADLINE_S, FULL_DEADLINE_S = 225, 455  # of 4 and 8 minutes, the install included
INSTALL_ALLOWANCE_S = 20  # the parts' budgets sum to at most the deadline less this

MACHINE = Part("machine", "GPU, driver, torch, triton, Python (machine.json).", 5, 5,
               ("gpu", "driver", "torch", "triton"))
CUDA_TESTS = Part("cuda_tests", "pytest -m cuda tests (output: cuda_tests.txt).", 75, 45,
                  ("passed", "failed", "errors", "skipped", "seconds", "timed_out"))


def all_parts() -> list[Part]:
    from device_check_models import COMPILE_TIME, HF_MODELS
    from device_check_parts import ANCHORS, COPY_BANDWIDTH, CUDAGRAPHS, TRAINING
    return [MACHINE, CUDA_TESTS, COPY_BANDWIDTH, ANCHORS, TRAINING, CUDAGRAPHS,
            COMPILE_TIME, HF_MODELS]


@attrs.frozen
class Context:
    """What a part runs with. ``deadline``: time.time() by which it stops starting rows."""

    out: Path
    quick: bool
    dry: bool
    deadline: float
    results: Results

    @property
    def rounds(self) -> int:
        return 3 if self.quick else 5


# --- the plan -----------------------------------------------------------------------

def plan_text(parts: list[Part], quick: bool, dry: bool, deadline_s: float) -> str:
    mode = "dry run (no timing)" if dry else ("quick" if quick else "full")
    lines = [f"## plan: {mode}, global deadline {deadline_s:.0f} s after the start "
             f"(the install before it, about {INSTALL_ALLOWANCE_S} s, included); a part "
             f"starts only with half its budget left and is stopped at 1.5 x its budget",
             "",
             "| part | budget s | by s | rows | what |", "| --- | --- | --- | --- | --- |"]
    total = 0
    for part in parts:
        budget = part.budget(quick)
        total += budget
        rows = ", ".join(r.name for r in part.rows(quick)) or "-"
        lines.append(f"| {part.name} | {budget} | {total} | {rows} | {part.what} |")
    return "\n".join(lines) + "\n"


# --- the machine --------------------------------------------------------------------

_DEVICE_PROPERTIES = """
import json, torch
p = torch.cuda.get_device_properties(0)
print(json.dumps({"name": p.name, "capability": f"{p.major}.{p.minor}",
                  "sms": p.multi_processor_count, "memory_gib": round(p.total_memory / 2**30, 1)}))
"""


def _nvidia_smi() -> dict:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"error": "nvidia-smi: not found"}
    info = {}
    for fields in ("name,driver_version,memory.total", "compute_cap", "clocks.max.sm",
                   "compute_mode"):
        try:
            done = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=30)
            values = [v.strip() for v in done.stdout.strip().splitlines()[0].split(",")]
            info.update(zip(fields.split(","), values))
        except Exception as exc:
            info[f"{fields}_error"] = error_text(exc)
    return info


def record_machine(ctx: Context, cuda: bool) -> dict:
    import torch
    info = {"utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dry_run": ctx.dry,
            "quick": ctx.quick, "python": platform.python_version(),
            "platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "cuda_available": cuda,
            "nvidia_smi": _nvidia_smi()}
    for name in ("triton", "transformers", "torchloom"):
        try:
            info[name] = __import__(name).__version__
        except Exception as exc:
            info[name] = f"not importable: {error_text(exc)}"
    if cuda:  # asked in a process of its own: this one keeps no CUDA context
        try:
            done = subprocess.run([sys.executable, "-c", _DEVICE_PROPERTIES],
                                  capture_output=True, text=True, timeout=60)
            info["device"] = json.loads(done.stdout.strip().splitlines()[-1])
        except Exception as exc:
            info["device"] = {"error": error_text(exc)}
    try:
        from torchloom.tools import load_plugins
        plugins = load_plugins()
        info["plugins"] = {name: list(dist) for name, dist in sorted(plugins.plugins.items())}
        info["codegens"] = sorted(plugins.codegens)
        info["runtime_wrappers"] = sorted(plugins.wrappers)
        info["plugin_errors"] = [str(e) for e in plugins.errors]
    except Exception as exc:
        info["plugin_errors"] = [error_text(exc)]
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, timeout=10,
                                        capture_output=True, text=True).stdout.strip() or None
    except Exception:
        info["commit"] = None
    install = ctx.out / "install.json"
    info["install"] = json.loads(install.read_text()) if install.exists() else None
    (ctx.out / "machine.json").write_text(json.dumps(info, indent=2) + "\n")
    smi = info["nvidia_smi"]
    ctx.results.row(MACHINE, platform.node() or "this machine",
                    "ok" if not info["plugin_errors"] else "error",
                    "; ".join(info["plugin_errors"]), gpu=smi.get("name", smi.get("error")),
                    driver=smi.get("driver_version"), torch=info["torch"],
                    triton=info["triton"])
    return info


# --- parts --------------------------------------------------------------------------

def run_rows(ctx: Context, part: Part) -> None:
    """Each row of ``part``: built and run eagerly on the CPU (dry run), or measured."""
    import torch
    for row in part.rows(ctx.quick):
        if ctx.dry:
            try:
                row.smoke(row.build("cpu", False))
                ctx.results.row(part, row.name, "skipped",
                                "skipped: no CUDA (built and run eagerly on the CPU, tiny)")
            except Exception as exc:
                ctx.results.row(part, row.name, "error",
                                f"building on the CPU failed: {error_text(exc)}")
            continue
        if time.time() > ctx.deadline:
            ctx.results.row(part, row.name, "skipped", "skipped: the part's budget is spent")
            continue
        torch._dynamo.reset()
        try:
            metrics = row.measure(ctx, row.build("cuda", True))
            note = "; ".join(metrics.pop("notes", None) or [])
            ctx.results.row(part, row.name, "ok", note, **metrics)
        except Exception as exc:
            ctx.results.row(part, row.name, "error", error_text(exc))
        gc.collect()
        torch.cuda.empty_cache()


def _tee(stream, log, to_console: bool) -> None:
    for line in iter(stream.readline, ""):
        log.write(line)
        log.flush()
        if to_console and line.startswith("[row]"):
            print(line, end="", flush=True)


def run_process(cmd: list[str], log_path: Path, timeout: float, env: dict,
                console: bool) -> tuple[int | None, float]:
    """Run ``cmd`` in a session of its own, output to ``log_path`` (rows also to the
    console); killed with its children after ``timeout``. (exit code or None, seconds)."""
    t0 = time.monotonic()
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, cwd=ROOT, start_new_session=True)
        reader = threading.Thread(target=_tee, args=(proc.stdout, log, console), daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
        reader.join(timeout=10)
    return rc, time.monotonic() - t0


def run_cuda_tests(ctx: Context, timeout: float, env: dict) -> None:
    log = ctx.out / "cuda_tests.txt"
    # a module that fails to import (under the image's torch) must not stop the others
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "tests", "-q", "-rfE",
           "-p", "no:cacheprovider", "--continue-on-collection-errors"]
    rc, seconds = run_process(cmd, log, timeout, env, console=False)
    text = log.read_text()
    totals = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|"
                                                           r"deselected|errors?)\b.* in ", ln)]
    counts = {k: int(n) for n, k in re.findall(
        r"(\d+) (passed|failed|errors?|skipped|deselected)", totals[-1] if totals else "")}
    if rc is None:  # cut short: count the progress characters printed so far
        progress = "".join(re.findall(r"^([.FEsxX]+)\s*(?:\[\s*\d+%\])?$", text, re.M))
        counts = {"passed": progress.count("."), "failed": progress.count("F"),
                  "errors": progress.count("E"), "skipped": progress.count("s")}
    failures = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)
    ok = rc == 0 or (rc == 5 and not failures)  # 5: no test selected
    ctx.results.row(CUDA_TESTS, "pytest -m cuda", "ok" if ok else "error",
                    ("; ".join(failures[:5]) + (" ..." if len(failures) > 5 else ""))
                    or (f"pytest exited {rc}" if not ok else ""),
                    passed=counts.get("passed", 0), failed=counts.get("failed", 0),
                    errors=counts.get("errors", counts.get("error", 0)),
                    skipped=counts.get("skipped", 0), seconds=round(seconds, 1),
                    timed_out=rc is None)


def child_env(caches: Path, t0: float) -> dict:
    """Fresh Triton, Inductor and torchloom caches for this run, shared by its parts."""
    env = dict(os.environ, DEVICE_CHECK_T0=str(t0), TRITON_CACHE_DIR=str(caches / "triton"),
               TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
               TORCHLOOM_CACHE_DIR=str(caches / "torchloom"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                      env.get("PYTHONPATH")]))
    return env


def run_part_child(ctx: Context, part: Part, budget: float, env: dict) -> None:
    """``part`` in a process of its own: it stops starting rows after ``budget`` and is
    killed at 1.5 x ``budget`` (or the global deadline)."""
    logs = ctx.out / "logs"
    logs.mkdir(exist_ok=True)
    cmd = [sys.executable, __file__, "--part", part.name, "--out", str(ctx.out),
           "--part-deadline", str(time.time() + budget)] + (["--quick"] if ctx.quick else [])
    limit = min(1.5 * budget, ctx.deadline - time.time())
    rc, seconds = run_process(cmd, logs / f"{part.name}.log", limit, env, console=True)
    if rc != 0:
        log = (logs / f"{part.name}.log").read_text().strip().splitlines()
        tail = " / ".join(ln for ln in log[-3:] if not ln.startswith("[row]"))[-400:]
        what = f"killed after {seconds:.0f} s (time limit)" if rc is None else \
            f"the part's process exited {rc} after {seconds:.0f} s: {tail}"
        ctx.results.row(part, "(part)", "timeout" if rc is None else "error",
                        f"{what}; rows above are what it measured; log: logs/{part.name}.log")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the subset that fits 4 minutes")
    parser.add_argument("--dry-run", action="store_true",
                        help="no timing: print the plan, record the machine, build each "
                             "workload on the CPU (automatic without CUDA)")
    parser.add_argument("--parts", help="comma-separated parts to run (default: all)")
    parser.add_argument("--deadline", type=float,
                        help=f"seconds after the start (default {FULL_DEADLINE_S}, "
                             f"--quick {QUICK_DEADLINE_S})")
    parser.add_argument("--out", help="output folder (default $OUT, else ./device_check_out)")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # internal: run one part
    parser.add_argument("--part-deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = Path(args.out or os.environ.get("OUT") or "device_check_out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = float(os.environ.get("DEVICE_CHECK_T0") or time.time())
    try:
        parts, broken = all_parts(), None
    except Exception as exc:  # torchloom not importable: the machine and the tests say why
        parts, broken = [MACHINE, CUDA_TESTS], error_text(exc)
    if args.part:  # a child: one part, rows appended to the run's files
        [part] = [p for p in parts if p.name == args.part]
        ctx = Context(out, args.quick, False, args.part_deadline, Results(out, t0))
        run_rows(ctx, part)
        return 0

    import torch
    cuda = torch.cuda.is_available()
    dry = args.dry_run or not cuda
    if args.parts:
        wanted = set(args.parts.split(","))
        unknown = wanted - {p.name for p in parts}
        if unknown:
            parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; known: "
                         f"{', '.join(p.name for p in parts)}")
        parts = [p for p in parts if p.name in wanted or p is MACHINE]
    if args.quick:
        parts = [p for p in parts if p.quick_budget_s]
    deadline_s = args.deadline or (QUICK_DEADLINE_S if args.quick else FULL_DEADLINE_S)
    results = Results(out, t0)
    for stale in (results.md, results.jsonl, out / "copy_bandwidth.json"):
        stale.unlink(missing_ok=True)
    ctx = Context(out, args.quick, dry, t0 + deadline_s, results)
    plan = plan_text(parts, args.quick, dry, deadline_s)
    print(plan, flush=True)
    results.text("# device check\n\n" + plan)
    if broken:
        print(f"the measuring parts cannot be imported: {broken}", flush=True)
        results.text(f"\nThe measuring parts cannot be imported: {broken}\n")
    caches = Path(tempfile.mkdtemp(prefix="device-check-caches-"))
    env = child_env(caches, t0)
    try:
        for part in parts:
            budget = part.budget(args.quick)
            results.header(part, budget)
            left = ctx.deadline - time.time()
            try:
                if part is MACHINE:
                    record_machine(ctx, cuda)
                elif dry:
                    if part is CUDA_TESTS:
                        results.row(part, "pytest -m cuda", "skipped", "skipped: no CUDA")
                    else:
                        run_rows(attrs.evolve(ctx, deadline=time.time() + budget), part)
                elif left < budget / 2:
                    for name in [r.name for r in part.rows(args.quick)] or [part.name]:
                        results.row(part, name, "skipped",
                                    f"skipped: global deadline ({left:.0f} s left, part "
                                    f"budget {budget} s)")
                elif part is CUDA_TESTS:
                    run_cuda_tests(ctx, min(budget, left), env)
                else:
                    run_part_child(ctx, part, min(budget, left), env)
            except Exception as exc:  # a failing part is a row; the next part runs
                results.row(part, "(part)", "error", error_text(exc))
    finally:
        shutil.rmtree(caches, ignore_errors=True)
    rows = [json.loads(ln) for ln in results.jsonl.read_text().splitlines()]
    by_status = {}
    for r in rows:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    summary = (f"done in {time.time() - t0:.0f} s: {len(rows)} rows ("
               + ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))
               + f"); results under {out}")
    results.text(f"\n{summary}\n")
    print(summary, flush=True)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
