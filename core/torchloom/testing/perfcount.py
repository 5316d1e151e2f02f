"""Instruction counting for perf gates (``measure="instructions"``): the CPU's retired
user-space instructions of this thread, read through ``perf_event_open`` (Linux, called
with ctypes), used as the gate's clock. Counts barely move with machine load, so a gate in
this mode decides in few rounds; it counts only the calling thread (work handed to other
threads, OpenMP workers or a GPU, is not counted), so it suits single-threaded CPU code.

Where the kernel or the machine does not allow it (not Linux, ``perf_event_paranoid`` above
2, a virtual machine without a virtual PMU: the event does not exist), :func:`open_counter`
raises :class:`CountersUnavailable` saying which, and the gate skips with that reason.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from pathlib import Path

_SYSCALL = {"x86_64": 298, "aarch64": 241, "arm64": 241}
_PERF_TYPE_HARDWARE = 0
_PERF_COUNT_HW_INSTRUCTIONS = 1
_ATTR_SIZE = 128
# perf_event_attr flag bits: disabled, exclude_kernel, exclude_hv
_FLAGS = (1 << 0) | (1 << 5) | (1 << 6)
# ioctls: _IO('$', 0), _IO('$', 1), _IO('$', 3)
_ENABLE, _DISABLE, _RESET = 0x2400, 0x2401, 0x2403


class CountersUnavailable(RuntimeError):
    """perf_event_open cannot count instructions here; the message says why."""


def paranoid_level() -> int | None:
    path = Path("/proc/sys/kernel/perf_event_paranoid")
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class InstructionCounter:
    """An open counter: :meth:`read` returns the instructions retired so far (a clock
    that ticks per instruction); :meth:`close` releases it."""

    def __init__(self, fd: int, libc):
        self.fd = fd
        self.libc = libc

    def read(self) -> float:
        return float(struct.unpack("q", os.read(self.fd, 8))[0])

    def close(self) -> None:
        self.libc.ioctl(self.fd, _DISABLE, 0)
        os.close(self.fd)

    def __enter__(self) -> InstructionCounter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_counter() -> InstructionCounter:
    """Open and start a user-space instruction counter for the calling thread."""
    if platform.system() != "Linux":
        raise CountersUnavailable(f"instruction counts need Linux's perf_event_open; this "
                                  f"is {platform.system()}")
    number = _SYSCALL.get(platform.machine())
    if number is None:
        raise CountersUnavailable(f"perf_event_open's syscall number on "
                                  f"{platform.machine()} is not known to torchloom")
    level = paranoid_level()
    if level is not None and level > 2:
        raise CountersUnavailable(f"/proc/sys/kernel/perf_event_paranoid is {level}: the "
                                  f"kernel allows no counters to users (2 or less needed)")
    libc = ctypes.CDLL(None, use_errno=True)
    attr = bytearray(_ATTR_SIZE)
    struct.pack_into("IIQQQQQ", attr, 0, _PERF_TYPE_HARDWARE, _ATTR_SIZE,
                     _PERF_COUNT_HW_INSTRUCTIONS, 0, 0, 0, _FLAGS)
    buf = (ctypes.c_char * _ATTR_SIZE).from_buffer(attr)
    fd = libc.syscall(number, buf, 0, -1, -1, 0)
    if fd < 0:
        err = ctypes.get_errno()
        hint = (" (the CPU exposes no hardware counter here: a virtual machine without a "
                "virtual PMU)" if err in (2, 95) else "")
        raise CountersUnavailable(f"perf_event_open(PERF_COUNT_HW_INSTRUCTIONS) failed: "
                                  f"{os.strerror(err)}{hint}; perf_event_paranoid is "
                                  f"{level}")
    libc.ioctl(fd, _RESET, 0)
    libc.ioctl(fd, _ENABLE, 0)
    return InstructionCounter(fd, libc)
