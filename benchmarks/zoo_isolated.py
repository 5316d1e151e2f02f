"""The zoo's rows with every side in a process of its own (``model_zoo.py --isolate``).

In one process the sides share more than the machine: glibc's heap above all. torchloom's
cpu codegen tells glibc to keep the memory a step frees (``codegen_cpu/memory.py``), and a
process's allocator is the process's: eager and Inductor run with it too when torchloom's
side is beside them. Alone, a side gets what its user gets; Swin's training step under
Inductor alone, for one, faults in ~8,000 fresh pages a step (0 beside torchloom's side).

Here each side is a worker process (``spawn``: nothing inherited but the environment) that
builds and compiles its model and runs its first call, timed; the workers are started one
after another, so no compile overlaps another's. The parent then runs the same interleaved
rounds as :func:`model_zoo.interleaved` by messages: after a pause (:data:`GAP_S`) and
an untimed step (:data:`SETTLE_STEPS`), a worker times its next step (the message costs
nothing inside it) and sends the seconds back: each timed step follows a step of its own
side, as a user's steps follow each other. Idle workers wait on their pipe, using no CPU.
"""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from pathlib import Path

import attrs
import torch

import model_zoo
from timing import gc_paused

#: seconds a worker may take to stop before it is killed
STOP_S = 30.0
#: the pause before each step: a side's OpenMP workers spin for a while after its step
#: (libgomp's default, ~300,000 spins), which in one process keeps the shared team ready
#: for the next side's step, but from another process takes the cores from it
GAP_S = 0.05
#: untimed steps a worker runs before each timed one: its caches and OpenMP team as a
#: user's process has them, one step after another (the other sides' processes ran last)
SETTLE_STEPS = 1


class SideFailed(RuntimeError):
    """A worker's side failed to build or to step (the message says which side and why)."""


def _serve(conn, name: str, mode: str, side: str, threads: int, cache_root: str) -> None:
    """A worker: build ``side`` of the row, report, then run a step per ``"step"``."""
    try:
        torch.set_num_threads(threads)
        built = model_zoo.make_side(name, mode, side, Path(cache_root))
        groups = (model_zoo.eager_groups(built.compiler)
                  if built.compiler is not None else None)
    except BaseException as exc:  # noqa: BLE001 (reported to the parent, which raises it)
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", built.first_call_s, groups))
    with gc_paused():
        while conn.recv() == "step":
            try:
                for _ in range(SETTLE_STEPS):
                    built.step()
                start = time.perf_counter()
                built.step()
                took = time.perf_counter() - start
            except BaseException as exc:  # noqa: BLE001
                conn.send(("failed", f"{type(exc).__name__}: {exc}"))
                return
            conn.send(("took", took))


@attrs.define
class Worker:
    side: str
    process: multiprocessing.process.BaseProcess
    conn: object  # the parent's end of the pipe

    def reply(self) -> tuple:
        try:
            message = self.conn.recv()
        except EOFError:
            raise SideFailed(f"{self.side}: the worker process died (exit code "
                             f"{self.process.exitcode})") from None
        if message[0] == "failed":
            raise SideFailed(f"{self.side}: {message[1]}")
        return message

    def step(self) -> float:
        """One step, run by the worker: the seconds it measured."""
        self.conn.send("step")
        return self.reply()[1]

    def stop(self) -> None:
        try:
            self.conn.send("stop")
        except (BrokenPipeError, OSError):
            pass
        self.process.join(STOP_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def measure_row_isolated(name: str, mode: str, threads: int, *, sides=model_zoo.SIDES,
                         rounds: int = 7, warmup: int = 1,
                         cache_root: Path | None = None) -> model_zoo.RowResult:
    """:func:`model_zoo.measure_row`, each side in its own process."""
    context = multiprocessing.get_context("spawn")
    workers: dict[str, Worker] = {}
    with tempfile.TemporaryDirectory(prefix="zoo-") as scratch:
        root = str(cache_root or scratch)
        try:
            first, groups = {}, None
            for side in sides:  # one after another: no compile beside another
                parent, child = context.Pipe()
                process = context.Process(target=_serve, daemon=True,
                                          args=(child, name, mode, side, threads, root))
                process.start()
                child.close()
                workers[side] = worker = Worker(side, process, parent)
                _, first[side], got = worker.reply()
                groups = got if side == "torchloom" else groups
            samples = model_zoo.interleaved({s: w.step for s, w in workers.items()},
                                            rounds, warmup, timed_inside=True,
                                            gap_s=GAP_S)
        finally:
            for worker in workers.values():
                worker.stop()
    return model_zoo.RowResult.of_rounds(name, mode, threads, samples, first, groups)
