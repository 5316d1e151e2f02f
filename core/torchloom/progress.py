"""Progress of the slow steps (autotuning, the C compiler, ``bench``'s compiles), so that
nothing sits silent for minutes.

On a terminal (stderr is a tty) a step is one line rewritten in place and erased when it
ends; otherwise (CI logs, a pipe) it goes through the ``torchloom.progress`` logger at
INFO: once when it has taken ``delay`` seconds, every ``every`` seconds after, and once
when it ends. Steps faster than ``delay`` say nothing::

    with Progress("triton: autotuning fused_exp", total=len(configs)) as p:
        for k, config in enumerate(configs):
            ...
            p.update(k + 1)

    with Activity("bench: compiling with Inductor"):   # ticks by itself, every second
        compiled(*inputs)

Plugins reach both through :mod:`torchloom.api`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import IO

log = logging.getLogger("torchloom.progress")

#: seconds before a step says anything, and between log lines when not on a terminal
DELAY, EVERY = 1.0, 10.0


class Progress:
    """One long step; ``update`` as it advances, ``close`` (or leave the ``with``) at its end."""

    def __init__(self, label: str, total: int | None = None, *, stream: IO[str] | None = None,
                 tty: bool | None = None, delay: float | None = None,
                 every: float | None = None):
        self.label, self.total = label, total
        self.stream = stream if stream is not None else sys.stderr
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty and isatty())
        self.tty = tty
        self.delay = DELAY if delay is None else delay
        self.every = EVERY if every is None else every
        self.start = time.perf_counter()
        self.done: int | None = None
        self.detail = ""
        self.shown = False  # said anything yet
        self.last_log = float("-inf")
        self.lock = threading.Lock()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def text(self) -> str:
        count = "" if self.done is None else (
            f" {self.done}/{self.total}" if self.total is not None else f" {self.done}")
        detail = f" {self.detail}" if self.detail else ""
        return f"{self.label}{count}{detail} ({self.elapsed():.0f} s)"

    def update(self, done: int | None = None, detail: str | None = None) -> None:
        """Record how far the step is (``done`` of ``total``; ``detail``: what it is on)
        and show it when due."""
        with self.lock:
            if done is not None:
                self.done = done
            if detail is not None:
                self.detail = detail
            elapsed = self.elapsed()
            if elapsed < self.delay:
                return
            if self.tty:
                self.stream.write("\r\033[K" + self.text())
                self.stream.flush()
            elif elapsed - self.last_log >= self.every:
                log.info("torchloom: %s", self.text())
                self.last_log = elapsed
            else:
                return
            self.shown = True

    def close(self) -> None:
        """End the step: erase the line on a terminal, or log that it is done."""
        with self.lock:
            if not self.shown:
                return
            if self.tty:
                self.stream.write("\r\033[K")
                self.stream.flush()
            else:
                log.info("torchloom: %s: done in %.1f s", self.label, self.elapsed())
            self.shown = False


class Activity(Progress):
    """A step with nothing to count (a compiler running): a thread ticks it every
    ``tick`` seconds, showing the elapsed time, until it ends."""

    def __init__(self, label: str, *, tick: float = 1.0, **kwargs):
        super().__init__(label, **kwargs)
        self.stopped = threading.Event()
        self.update()  # shown at once when there is no delay
        self.thread = threading.Thread(target=self._tick, args=(tick,), daemon=True,
                                       name=f"torchloom progress: {label}")
        self.thread.start()

    def _tick(self, tick: float) -> None:
        while not self.stopped.wait(tick):
            self.update()

    def close(self) -> None:
        self.stopped.set()
        if self.thread is not threading.current_thread():
            self.thread.join()
        super().close()
