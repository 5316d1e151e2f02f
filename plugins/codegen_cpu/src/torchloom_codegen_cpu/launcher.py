"""Calling a compiled C function: ``kernel(*inputs) -> tuple(outputs)``.

The function takes the inputs' data pointers (scalar inputs by value), the outputs' data
pointers, the value of each size symbol (``int64_t S_0, ...``: kernels of groups with
symbolic sizes) and the thread count (``torch.get_num_threads()`` at call time). It is
called through its CPython entry (entry.py) where the library has one, else through ctypes.

A launcher copies an input whose strides are not the ones the kernel was written for
(strides of size-1 dims never matter), allocates the outputs, and skips the call when every
output is empty. Its ``into(outs, *inputs)`` writes into the tensors ``outs`` gives (dead
buffers the plan reuses, see ``torchloom.codegen.buffers``) where they have the output's
dtype, shape and strides, and allocates the others. With symbolic sizes, it reads each size from the first input dim that is
that bare size (``symbols.bind_symbols``, the binding the graph's guards use), from the
int input the metadata names for it, or from the input stride that is that size argument
(a view's stride of sizes no dim holds), and evaluates the output shapes and the expected
strides from them, and raises eager's error where a max, min, argmax or argmin reduces a
row of symbolic length that is 0 at the call (``nonempty`` in the metadata).
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch
from torchloom.api import check_source, laid_out_as, same_strides, symbols

from torchloom_codegen_cpu.entry import python_entry

_TORCH_DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16,
                 "bf16": torch.bfloat16, "i64": torch.int64, "i32": torch.int32,
                 "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8, "b8": torch.bool}
_SCALAR_CTYPES = {"float": ctypes.c_double, "int": ctypes.c_int64, "bool": ctypes.c_bool}


def launcher(lib: ctypes.CDLL, meta: dict[str, Any]) -> "Launcher":
    """The callable for the kernel ``meta`` describes, in the loaded library ``lib``."""
    return Launcher(lib, meta)


def _function(lib: ctypes.CDLL, meta: dict[str, Any]) -> tuple[Any, bool]:
    """The kernel's Python entry (entry.py), which takes a tensor whole for a data pointer
    too, else its ctypes function, which takes ints; and whether it takes tensors."""
    entry = python_entry(lib, meta["kernel"])
    if entry is not None:
        return entry, True
    argtypes = [_SCALAR_CTYPES[d["scalar"]] if "scalar" in d else ctypes.c_void_p
                for d in meta["inputs"]]
    # a function of its own from a prototype (the library's cached one keeps its types)
    prototype = ctypes.CFUNCTYPE(ctypes.c_int if "checks" in meta else None, *argtypes, *[ctypes.c_void_p] * len(meta["outputs"]),
                                 *[ctypes.c_int64] * len(meta.get("sizes", ())), ctypes.c_int)
    return prototype((meta["kernel"], lib)), False


def inplace_pairs(meta: dict[str, Any]) -> frozenset[tuple[int, int]]:
    """The (input, output) pairs of the metadata whose output ``into`` may be given the
    input itself (the C function reads each element of it before writing the output's)."""
    return frozenset(tuple(pair) for pair in meta.get("inplace", ()))


class Launcher:
    """``kernel(*inputs) -> outputs`` through one generated Python function (a call costs a
    few attribute reads and the ctypes call: kernels of small tensors are dominated by it).
    Its text is built from the metadata's dims through ``symbols.python_source`` (integer
    arithmetic only) and fixed templates: metadata read back from a cache never writes
    code."""

    #: its outputs are laid out as their types (the codegen protocol): allocated so, or
    #: given buffers used only when they are
    exact_layouts = True

    def __init__(self, lib: ctypes.CDLL, meta: dict[str, Any]):
        self.lib = lib  # keeps the library loaded
        self.meta = meta
        self.fn, self._tensors = _function(lib, meta)
        self.source, self._call = _launch_source(meta, self.fn, self._tensors)
        self._into = None
        #: (input, output) pairs ``into`` may be given one tensor for (the C function
        #: reads the input's element before it writes the output's)
        self.inplace = inplace_pairs(meta)

    def into(self, outs: tuple, *args):
        """The kernel writing output j into ``outs[j]`` (a tensor, or None: allocated)."""
        if self._into is None:  # built on first use: most kernels are never given buffers
            self._into = _launch_source(self.meta, self.fn, self._tensors, into=True)[1]
        return self._into(outs, *args)

    def __call__(self, *args):
        return self._call(*args)

    def trusting(self, inputs: dict[int, Any], outputs: dict[int, Any],
                 whole: bool = False) -> "Launcher":
        """This kernel without the layout checks of the inputs (given output buffers) at
        the positions of ``inputs`` (``outputs``) whose type, which the caller guarantees
        (the codegen protocol, ``torchloom.codegen.base``), is the layout it expects; with
        ``whole`` (the caller guarantees plain tensors with storage) their data pointers
        are read in C."""
        ins = frozenset(i for i, t in inputs.items() if _expected(t, self.meta["inputs"][i]))
        outs = frozenset(j for j, t in outputs.items()
                         if _expected(t, self.meta["outputs"][j]))
        return self if not ins and not outs else _Trusting(self, ins, outs, whole)


class _Trusting:
    """A :class:`Launcher` trusting the layouts of some inputs and given outputs."""

    exact_layouts = True

    def __init__(self, base: Launcher, inputs: frozenset[int], outputs: frozenset[int],
                 whole: bool):
        self.meta, self.inplace = base.meta, base.inplace
        self._base, self._inputs, self._outputs, self._whole = base, inputs, outputs, whole
        self.source, self._call = _launch_source(base.meta, base.fn, base._tensors,
                                                 trusted=inputs, whole=whole) \
            if inputs else (base.source, base)
        self._into = None

    def into(self, outs: tuple, *args):
        if self._into is None:
            self._into = _launch_source(self.meta, self._base.fn, self._base._tensors,
                                        into=True, trusted=self._inputs,
                                        given=self._outputs, whole=self._whole)[1]
        return self._into(outs, *args)

    def __call__(self, *args):
        return self._call(*args)


def _expected(t: Any, d: dict[str, Any]) -> bool:
    """Whether a tensor of the static type ``t`` has the layout the kernel's parameter
    ``d`` (metadata) takes, strides of dims of size 1 aside."""
    if d.get("unread"):
        return True  # (read for its shape only: any layout)
    if "scalar" in d or d.get("strides") is None or not getattr(t, "is_static", False):
        return False
    if t.dtype != d["dtype"] or list(t.shape) != list(d["shape"]):
        return False
    return same_strides(t.shape, t.actual_strides(), d["strides"])


def size_sources(meta: dict[str, Any]) -> dict[str, tuple[int, str, int]]:
    """Where the launcher reads each size argument of a kernel (metadata): size -> (input,
    ``"shape"`` / ``"int"`` / ``"stride"``, dim); a dim of an input's shape first, then an
    int input that is the size's value, then an input's stride (inputs copied dense in
    their ``order`` when laid out otherwise). Raises SymbolicDimError naming a size read
    from nowhere: ``supports`` declines such a group, so no kernel fails at load."""
    inputs = meta["inputs"]
    shapes = [None if "scalar" in d else d["shape"] for d in inputs]
    found = {s: (i, "shape", k) for s, (i, k) in symbols.bind_symbols(shapes).items()}
    for i, d in enumerate(inputs):
        for s in d.get("sizes", ()):
            found.setdefault(s, (i, "int", 0))
    for i, d in enumerate(inputs):
        for k, e in enumerate(d.get("strides") or ()):
            if "order" in d and symbols.is_symbol(e):
                found.setdefault(e, (i, "stride", k))
    for s in meta.get("sizes", []):
        if s not in found:
            raise symbols.SymbolicDimError(f"size {s} is not read from any input")
    return found


def _launch_source(meta: dict[str, Any], fn, tensors: bool, into: bool = False,
                   trusted: frozenset[int] = frozenset(),
                   given: frozenset[int] = frozenset(),
                   whole: bool = False) -> tuple[str, Any]:
    """The launch function's source and the function; no layout checks of the inputs
    ``trusted`` and of the output buffers ``given`` (``into``: used as they are), and with
    ``whole`` those handed to the entry as tensors (``tensors``: it takes them)."""
    inputs, outputs = meta["inputs"], meta["outputs"]
    params = ["_outs"] * into + [f"a{i}" for i in range(len(inputs))]
    namespace: dict[str, Any] = {**symbols.guard_namespace(), "_fn": fn, "_alloc": _alloc,
                                 "_threads": torch.get_num_threads, "_fix": laid_out_as,
                                 "_dense": _dense}
    lines = [f"def launch({', '.join(params)}):"]
    rebind: dict[int, list[str]] = {}  # input -> its size arguments read from its strides
    for s, (i, place, k) in size_sources(meta).items():
        read = f"sym_{s} = a{i}" + {"shape": f".shape[{k}]", "int": "",
                                    "stride": f".stride()[{k}]"}[place]
        lines.append(f"    {read}")
        if place == "stride":
            rebind.setdefault(i, []).append(read)

    def items(dims) -> list[str]:
        return [symbols.python_source(d, lambda s: f"sym_{s}") for d in dims]

    checks, checked = check_source(meta.get("nonempty", ()), lambda d: items([d])[0])
    namespace.update(checks)  # eager's error for empty rows a max reduces
    lines += checked

    def tup(dims) -> str:
        return f"({', '.join(items(dims))}{',' if len(dims) == 1 else ''})"

    for i, d in enumerate(inputs):
        if "scalar" in d or i in trusted or d.get("unread"):
            continue  # (an input read for its shape only: any layout)
        if d["strides"] is None:  # symbolic sizes, contiguous
            lines.append(f"    if not a{i}.is_contiguous(): a{i} = a{i}.contiguous()")
        elif i in rebind:  # another layout: a dense copy in the kernel's order, read again
            lines.append(f"    if a{i}.stride() != {tup(d['strides'])}:")
            lines.append(f"        a{i} = _dense(a{i}, {tuple(d['order'])!r})")
            lines += [f"        {line}" for line in rebind[i]]
        else:  # strides of size-1 dims never matter (torch gives them any value)
            lines.append(f"    if a{i}.stride() != (_e := {tup(d['strides'])}): "
                         f"a{i} = _fix(a{i}, _e)")
    if into:
        lines.append(f"    {''.join(f'o{j}, ' for j in range(len(outputs)))}= _outs")
    for j, o in enumerate(outputs):
        namespace[f"_d{j}"] = _TORCH_DTYPES[o["dtype"]]
        # symbolic sizes, contiguous: the strides torch.empty would give, at each call
        strides = tup(o["strides"]) if o["strides"] is not None else \
            _contiguous_source(items(o["shape"]), o["shape"])
        indent = "    "
        if j in given:
            continue  # the caller's buffer, laid out as the output
        if into:  # a given buffer is used only when it is laid out as the output
            layout = (f"o{j}.is_contiguous()" if o["strides"] is None else
                      f"o{j}.stride() == {tup(o['strides'])}")
            lines.append(f"    if o{j} is None or o{j}.dtype is not _d{j} or "
                         f"o{j}.shape != {tup(o['shape'])} or not {layout}:")
            indent = "        "
        lines.append(f"{indent}o{j} = _alloc({tup(o['shape'])}, {strides}, _d{j})")
    # the entry reads in C the pointers of tensors allocated here, and of those the
    # caller vouches for (``whole``); never of another tensor it was given, which might
    # have no storage (entry.py)
    def pointer(name: str, whole_here: bool) -> str:
        return name if tensors and whole_here else f"{name}.data_ptr()"
    pointers = [f"a{i}" if "scalar" in d else pointer(f"a{i}", whole and i in trusted)
                for i, d in enumerate(inputs)]
    pointers += [pointer(f"o{j}", not into or (whole and j in given))
                 for j in range(len(outputs))]
    pointers += [f"sym_{s}" for s in meta.get("sizes", ())]
    call = f"_fn({', '.join(pointers)}, _threads())"
    if "checks" in meta:  # an index of a gather out of range: eager's error
        namespace["_index_error"] = index_error
        call = f"if {call}: _index_error()"
    # skipped when every output is empty: sizes are >= 0, so an output has elements when
    # no int dim is 0 and each symbolic dim is nonzero
    conditions, always = [], False
    for o in outputs:
        if 0 in o["shape"]:
            continue  # empty at every size
        dims = [text for text, d in zip(items(o["shape"]), o["shape"]) if not isinstance(d, int)]
        always = always or not dims
        conditions.append(" and ".join(dict.fromkeys(dims)))
    if always or "checks" in meta:  # (eager checks the indices of an empty result too)
        lines.append(f"    {call}")
    elif conditions:
        lines.append(f"    if {' or '.join(f'({c})' for c in dict.fromkeys(conditions))}:")
        lines.append(f"        {call}")
    lines.append(f"    return ({', '.join(f'o{j}' for j in range(len(outputs)))},)")
    source = "\n".join(lines) + "\n"
    exec(compile(source, f"<torchloom launch {meta['kernel']}>", "exec"), namespace)
    return source, namespace["launch"]


def index_error() -> None:
    """Eager's error for an index of an embedding outside its table."""
    raise IndexError("index out of range in self")


def _dense(a: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """A dense copy of ``a`` whose dims lie in memory in ``order`` (outermost first)."""
    strides, acc = [0] * a.dim(), 1
    for d in reversed(order):
        strides[d] = acc
        acc *= max(a.shape[d], 1)
    return torch.empty_strided(a.shape, strides, dtype=a.dtype).copy_(a)


def _contiguous_source(texts: list[str], dims: list) -> str:
    """A tuple expression of the row-major strides of the shape whose dims are ``dims``
    (ints or symbolic) and whose Python expressions are ``texts``: sizes of 0 count as 1,
    as in ``torch.empty``."""
    strides, const, factors = [], 1, []
    for text, d in zip(reversed(texts), reversed(dims)):
        strides.append(" * ".join([str(const), *factors]) if factors else str(const))
        if isinstance(d, int):
            const *= max(d, 1)
        else:
            factors.append(f"({text} or 1)")  # a size is >= 0: max(size, 1) without a call
    return f"({', '.join(reversed(strides))}{',' if len(strides) == 1 else ''})"


def _allocator():
    """``alloc(shape, strides, dtype)``: a new CPU tensor. torch's C++ fast path for
    Inductor's generated code where this torch has it (0.5 us against torch.empty's 1.6
    us on the CI machine), else ``torch.empty_strided``."""
    try:
        from torch._C._dynamo.guards import _empty_strided_cpu
        return _empty_strided_cpu
    except ImportError:  # another torch: the public function
        return lambda shape, strides, dtype: torch.empty_strided(shape, strides, dtype=dtype)


_alloc = _allocator()
