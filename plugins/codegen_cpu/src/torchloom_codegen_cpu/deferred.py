"""A kernel whose library is still being built: the codegen protocol's background kernels.

``prepare`` starts the graph's library building on a thread (one compiler call for every
group) and returns; ``load`` then hands back, for each group of a library not built yet, a
:class:`Deferred`: it says whether the build has ended (``ready()``, never waits), and
``resolve()`` waits for it and gives the kernel (a launcher of the loaded library; if the
build failed, the kernel built alone, as a failed ``prepare`` always did). Calling it
resolves it first. What the plan reads while it is made (``exact_layouts``, ``inplace``,
``trusting``) comes from the metadata, known before the build ends: the plan is made while
the compiler runs, and the runtime may run the group op by op until then
(:mod:`torchloom.runtime.tiered`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchloom.api import Kernel

from torchloom_codegen_cpu.launcher import inplace_pairs


class Deferred:
    """A kernel that ``resolve`` makes once its library is built (see the module's doc)."""

    #: its outputs are laid out as their types, as the launcher's
    exact_layouts = True

    def __init__(self, make: Callable[[], Kernel], done: Callable[[], bool],
                 meta: dict[str, Any]):
        self.meta = meta
        #: (input, output) pairs ``into`` may be given one tensor for (the launcher's)
        self.inplace = inplace_pairs(meta)
        self._make, self._done = make, done
        self._kernel: Kernel | None = None
        self._lock = threading.Lock()

    def ready(self) -> bool:
        """Whether ``resolve`` would not wait for a compiler (the build has ended)."""
        return self._kernel is not None or self._done()

    def resolve(self) -> Kernel:
        """The kernel, waiting for the build; raises what building it raised."""
        if self._kernel is None:
            with self._lock:  # (plans of two threads may call it at once)
                if self._kernel is None:
                    self._kernel = self._make()
        return self._kernel

    def __call__(self, *args):
        return (self._kernel or self.resolve())(*args)

    def into(self, outs: tuple, *args):
        return (self._kernel or self.resolve()).into(outs, *args)

    def trusting(self, inputs: dict[int, Any], outputs: dict[int, Any],
                 whole: bool = False) -> Deferred:
        """The launcher's ``trusting`` of these positions, once it is resolved."""
        return Deferred(lambda: self.resolve().trusting(inputs, outputs, whole=whole),
                        self.ready, self.meta)


#: the niceness of a build thread and of the compiler it runs (Linux: a thread's own, which
#: the processes it starts inherit): the interpreter's thread, making the plan meanwhile,
#: comes first on a machine of few cores; a compiler waited for has the cores to itself
BUILD_NICENESS = 10


def _lower_priority() -> None:
    """This thread (and what it starts) at :data:`BUILD_NICENESS`, on Linux only (where
    ``setpriority`` of a thread id touches that thread alone); silently kept elsewhere."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BUILD_NICENESS)


class Building:
    """A library being built on a thread: its cache key (known before the build ends: a
    kernel's metadata names it) and, once built, its path. The thread and its compiler
    run at a lower priority (:data:`BUILD_NICENESS`).

    A process forked while it builds has no such thread: there ``done()`` is true and
    ``wait()`` builds the library itself (finding the parent's, if that one finished, in the
    cache), so a child never waits for a build that will not end."""

    def __init__(self, key: str):
        self.key = key
        self._future: concurrent.futures.Future = concurrent.futures.Future()
        self._build: Callable[[], Path] | None = None
        self._pid = os.getpid()

    def start(self, build: Callable[[], Path], name: str | None = None) -> None:
        """Run ``build`` (returns the library's path) on a thread (named ``name``)."""
        self._build = build

        def run() -> None:
            _lower_priority()
            try:
                self._future.set_result(build())
            except BaseException as exc:  # noqa: BLE001 (handed to whoever waits)
                self._future.set_exception(exc)
        threading.Thread(target=run, name=name or f"torchloom-cpu-{self.key[:8]}",
                         daemon=True).start()

    def done(self) -> bool:
        return self._future.done() or os.getpid() != self._pid

    def wait(self) -> Path:
        """The library's path, waiting for the build; raises what the build raised."""
        if os.getpid() != self._pid and not self._future.done() and self._build is not None:
            return self._build()  # (forked while it built: built here)
        return self._future.result()


class Ahead:
    """The library of a codegen's ``library_call`` functions (depthwise convolutions,
    dropout, each direction of attention): built on a thread ahead of its first call
    (``start``, once a plan that calls it is being made), or by that call; ``ready()``
    says whether a call would not wait for it; ``open()`` loads it."""

    def __init__(self, key: str, build: Callable[[], Path], name: str, otherwise: str):
        #: ``name``: what the log calls it; ``otherwise``: what runs where it did not build
        self.key, self.name, self.otherwise = key, name, otherwise
        self._build = build
        self._building: Building | None = None

    @property
    def started(self) -> bool:
        """Whether its build was started ahead."""
        return self._building is not None

    def start(self, after: Ahead | None = None) -> None:
        """Build it on a thread, once. With ``after``, the compiler starts once that
        library's build (started ahead) has ended: one wanted later does not slow it. An
        error is its first call's to report, as when built then."""
        if self._building is not None:
            return
        first = after._building if after is not None else None

        def build() -> Path:
            if first is not None:
                with contextlib.suppress(Exception):  # (that library's call reports it)
                    first.wait()
            return self._build()
        self._building = Building(self.key)
        self._building.start(build, name=f"torchloom-{self.key}")

    def ready(self) -> bool:
        """Whether ``path`` would not wait for a compiler (built, or never started ahead:
        then the call builds it)."""
        return self._building is None or self._building.done()

    def path(self) -> Path:
        """The built library's path, waiting for (or running) its build."""
        return self._build() if self._building is None else self._building.wait()

    def open(self, log) -> ctypes.CDLL | None:
        """The library loaded, or None (logged on ``log``: its ops run as eager's) where
        it did not build."""
        try:
            return ctypes.CDLL(str(self.path()))
        except (RuntimeError, OSError) as exc:
            log.warning("torchloom: cpu codegen: the %s library did not build (%s); %s",
                        self.name, exc, self.otherwise)
            return None


class Offered:
    """A library function the plan calls in place of an op (``library_call``) whose
    library may still be building: ``ready()`` says whether a call would not wait for it
    (the runtime may call the op itself until then)."""

    __slots__ = ("_fn", "ready")

    def __init__(self, fn: Callable, ready: Callable[[], bool]):
        self._fn = fn
        self.ready = ready

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)
