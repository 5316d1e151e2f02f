"""glibc's malloc told to keep the memory a step frees, for the next step's kernel outputs.

A kernel's output (and a GEMM's, an op's between kernels) is a fresh tensor of megabytes:
glibc serves it from its heap, or maps fresh pages for it, and every fresh 4 KB page
faults on its first write (~1-2 us each here). By default glibc adjusts its thresholds
as it goes: it gives the heap's free top back to the system once more than twice the
largest freed mapping lies there, and the next step faults it all in again. Measured per
step (minor faults, ConvNeXt inference at 224 px, 1 thread, 2026-11-29): torchloom 2,680,
Inductor 0 (whose buffer plan frees less between steps), eager 3,660; the step took 20.4
ms against Inductor's 14.9, and 14.2 against 14.1 once glibc kept its memory
(``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` set: 0 faults on every side).

So when the cpu codegen loads a kernel, it sets glibc's mmap threshold to
:data:`MMAP_THRESHOLD` (allocations below it come from the heap and go back to it) and
its trim threshold to :data:`TRIM_THRESHOLD` (free heap below it is kept), as jemalloc or
tcmalloc, which PyTorch recommends on CPUs, keep freed memory too. The cost: the process
keeps up to that much freed memory mapped. It is the process's allocator, so eager and
Inductor code in the same process run with it too. ``TORCHLOOM_CPU_MALLOC=system`` leaves
glibc as it is (and an explicit ``MALLOC_*_THRESHOLD_`` variable is never overridden);
on a C library without ``mallopt`` (musl, macOS) nothing changes.
"""

from __future__ import annotations

import ctypes
import os

#: allocations below this come from the heap (glibc's largest dynamic threshold: 32 MB)
MMAP_THRESHOLD = 32 << 20
#: free heap memory up to this much is kept for later allocations
TRIM_THRESHOLD = 512 << 20
#: ``mallopt`` parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: ``int mallopt(int param, int value)``
_MALLOPT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int)
#: the environment variables that set them (glibc reads them at start-up)
GLIBC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def setting(environ=os.environ) -> str:
    """``TORCHLOOM_CPU_MALLOC``: ``keep`` (the default) or ``system``; ValueError else."""
    value = environ.get("TORCHLOOM_CPU_MALLOC", "keep").strip().lower()
    if value not in ("keep", "system"):
        raise ValueError(f"TORCHLOOM_CPU_MALLOC is {value!r}; choose keep (glibc keeps "
                         f"freed memory for later kernels' outputs) or system (glibc as it is)")
    return value


def keep_freed_memory(environ=os.environ) -> bool:
    """Set glibc's thresholds (see the module docstring) unless the environment says
    otherwise; whether they were set. Idempotent: calling it for every kernel loaded
    costs a microsecond."""
    if setting(environ) == "system" or any(v in environ for v in GLIBC_VARIABLES):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc only: another libc's mallopt differs)
        mallopt = _MALLOPT(("mallopt", libc))
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
