"""Calling a compiled C function: ``kernel(*inputs) -> tuple(outputs)``.

The function takes the inputs' data pointers (scalar inputs by value), the outputs' data
pointers, the value of each size symbol (``int64_t S_0, ...``: kernels of groups with
symbolic sizes) and the thread count (``torch.get_num_threads()`` at call time).

A launcher copies an input whose strides are not the ones the kernel was written for
(strides of size-1 dims never matter), allocates the outputs, and skips the call when every
output is empty. With symbolic sizes, one generated function (``symbols.size_function``)
reads each size from the first input dim that is that bare size (as the graph's guards bind
symbols) or from the int input the metadata names for it, and evaluates the output shapes
and the expected strides from them.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch
from torchloom.api import symbols

_TORCH_DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16,
                 "bf16": torch.bfloat16, "i64": torch.int64, "i32": torch.int32,
                 "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8, "b8": torch.bool}
_SCALAR_CTYPES = {"float": ctypes.c_double, "int": ctypes.c_int64, "bool": ctypes.c_bool}


def launcher(lib: ctypes.CDLL, meta: dict[str, Any]):
    """The callable for the kernel ``meta`` describes, in the loaded library ``lib``."""
    return SymbolicLauncher(lib, meta) if meta.get("sizes") else Launcher(lib, meta)


def _function(lib: ctypes.CDLL, meta: dict[str, Any]):
    fn = getattr(lib, meta["kernel"])
    argtypes = [_SCALAR_CTYPES[d["scalar"]] if "scalar" in d else ctypes.c_void_p
                for d in meta["inputs"]]
    fn.argtypes = [*argtypes, *[ctypes.c_void_p] * len(meta["outputs"]),
                   *[ctypes.c_int64] * len(meta.get("sizes", ())), ctypes.c_int]
    fn.restype = None
    return fn


class Launcher:
    """The launcher of a kernel with static sizes."""

    def __init__(self, lib: ctypes.CDLL, meta: dict[str, Any]):
        self.lib = lib  # keeps the library loaded
        self.meta = meta
        self.fn = _function(lib, meta)
        self.outputs = [(tuple(o["shape"]), tuple(o["strides"]), _TORCH_DTYPES[o["dtype"]],
                         tuple(o["strides"]) == _contiguous(o["shape"]))
                        for o in meta["outputs"]]
        self.checks = []
        self.scalars = {i for i, d in enumerate(meta["inputs"]) if "scalar" in d}
        for i, d in enumerate(meta["inputs"]):
            if "scalar" in d:
                continue
            dims = tuple(k for k, s in enumerate(d["shape"]) if s != 1)
            self.checks.append((i, dims, tuple(d["strides"][k] for k in dims),
                                tuple(d["shape"]), tuple(d["strides"])))
        self.empty = all(0 in o[0] for o in self.outputs)  # nothing to write

    def __call__(self, *args):
        args = list(args)
        for i, dims, expected, shape, strides in self.checks:
            stride = args[i].stride()
            if stride != strides and tuple(stride[k] for k in dims) != expected:
                fixed = torch.empty_strided(shape, strides, dtype=args[i].dtype)
                args[i] = fixed.copy_(args[i])
        outs = [torch.empty(shape, dtype=dtype) if contiguous else
                torch.empty_strided(shape, strides, dtype=dtype)
                for shape, strides, dtype, contiguous in self.outputs]
        if not self.empty:
            pointers = [a if i in self.scalars else a.data_ptr() for i, a in enumerate(args)]
            self.fn(*pointers, *[o.data_ptr() for o in outs], torch.get_num_threads())
        return tuple(outs)


class SymbolicLauncher:
    """The launcher of a kernel taking symbolic sizes as arguments (metadata ``sizes``:
    the symbols' names, which the inputs' and outputs' dims are written in)."""

    def __init__(self, lib: ctypes.CDLL, meta: dict[str, Any]):
        self.lib = lib
        self.meta = meta
        self.fn = _function(lib, meta)
        inputs, outputs = meta["inputs"], meta["outputs"]
        self.scalars = {i for i, d in enumerate(inputs) if "scalar" in d}
        groups: list[list] = [list(meta["sizes"])]  # what one call evaluates, in groups

        def group(dims) -> int:
            groups.append(list(dims))
            return len(groups) - 1

        self.contiguous = [i for i, d in enumerate(inputs)
                           if "scalar" not in d and d["strides"] is None]
        self.strided = [(i, group(d["strides"])) for i, d in enumerate(inputs)
                        if "scalar" not in d and d["strides"] is not None]
        self.outputs = [(group(o["shape"]), None if o["strides"] is None else group(o["strides"]),
                         _TORCH_DTYPES[o["dtype"]]) for o in outputs]
        shapes = [None if "scalar" in d else d["shape"] for d in inputs]
        scalars = {d["size"]: i for i, d in enumerate(inputs) if "size" in d}
        self.sizes = symbols.size_function(shapes, groups, scalars)

    def __call__(self, *args):
        values = self.sizes(*args)
        args = list(args)
        for i in self.contiguous:
            if not args[i].is_contiguous():
                args[i] = args[i].contiguous()
        for i, g in self.strided:
            a, expected = args[i], values[g]
            stride = a.stride()
            if stride != expected and any(n != 1 and s != e for n, s, e in
                                          zip(a.shape, stride, expected)):
                args[i] = torch.empty_strided(a.shape, expected, dtype=a.dtype).copy_(a)
        outs = [torch.empty(values[shape], dtype=dtype) if strides is None else
                torch.empty_strided(values[shape], values[strides], dtype=dtype)
                for shape, strides, dtype in self.outputs]
        if any(o.numel() for o in outs):
            pointers = [a if i in self.scalars else a.data_ptr() for i, a in enumerate(args)]
            self.fn(*pointers, *[o.data_ptr() for o in outs], *values[0],
                    torch.get_num_threads())
        return tuple(outs)


def _contiguous(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))
