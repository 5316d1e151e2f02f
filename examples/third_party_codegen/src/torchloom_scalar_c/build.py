"""``scalar_c``'s toolchain and launcher: the system compiler (``$CC``, default ``cc``)
builds each kernel's C into a shared library under the cache directory, named by the
digest of its source; ctypes calls it with the inputs' and fresh outputs' (and scratch
arrays') pointers, then the call's sizes (``LaunchSpec.bind``)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile

import torch
from torchloom.api import DTYPES, default_cache_dir, errors

_SCALARS = {"f64": ctypes.c_double, "i64": ctypes.c_int64, "b8": ctypes.c_bool}


def compiler_missing() -> str | None:
    cc = os.environ.get("CC", "cc")
    return None if shutil.which(cc) else f"no C compiler: {cc!r} is not on PATH (set CC)"


def _library(source: str) -> ctypes.CDLL:
    """The library built from ``source`` (built once per source, kept on disk)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    folder = default_cache_dir() / "scalar_c"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{digest}.so"
    if not path.exists():
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            c_file, built = os.path.join(tmp, "kernel.c"), os.path.join(tmp, "kernel.so")
            with open(c_file, "w") as f:
                f.write(source)
            cc = os.environ.get("CC", "cc")
            cmd = [cc, "-O2", "-std=c11", "-shared", "-fPIC", "-o", built, c_file, "-lm"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise errors.TorchloomError(f"scalar_c: {cc} failed on a kernel "
                                            f"({done.stderr.strip()[:2000]})")
            os.replace(built, path)  # atomic: another process may build the same
    return ctypes.CDLL(str(path))


def build(source: str, launch):
    """A callable running the kernel ``source``: ``kernel(*inputs) -> tuple(outputs)``."""
    function = getattr(_library(source), launch.entry)
    inputs = [p for p in launch.params if p.role in ("input", "scalar")]
    prototype = ctypes.CFUNCTYPE(None, *(_SCALARS[p.dtype] if p.role in ("scalar", "size")
                                         else ctypes.c_void_p for p in launch.params))
    call = prototype(ctypes.cast(function, ctypes.c_void_p).value)

    def kernel(*args):
        bound = launch.bind(args)  # this call's sizes: outputs' shapes, size arguments
        outs = tuple(torch.empty_strided(shape, strides, dtype=DTYPES[dtype])
                     for shape, strides, dtype in bound.outputs)
        rows = [torch.empty(numel, dtype=DTYPES[dtype]) for numel, dtype in bound.scratch]
        values = [a.data_ptr() if p.role == "input" else a for p, a in zip(inputs, args)]
        call(*values, *(o.data_ptr() for o in (*outs, *rows)), *bound.sizes)
        return outs

    return kernel
