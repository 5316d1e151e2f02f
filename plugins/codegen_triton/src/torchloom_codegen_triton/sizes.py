"""Symbolic sizes of a kernel: which runtime argument carries each symbol, and the
launcher's size function.

A group whose types have symbolic sizes (``f32[s0, 64]``) compiles into kernels that take
each symbol as a scalar argument ``ks<k>``, bound at launch (``bind_symbols``) from the
first input dim that is that bare symbol, else from one that is a constant multiple of it
(``4*s0``), else from an int input of the group that a view takes as that size (Dynamo
passes SymInts so); every other size (``2*s0``, ``s0*s1``) is computed in the kernel from
those. An input dim over symbols none of these give (``s0*s1`` alone) becomes a symbol of
its own (``atomize``). :func:`size_function` turns the kernel's metadata into one
Python function, compiled once per kernel, that reads the symbols from the actual inputs
and evaluates everything a launch needs: the symbol values, the outputs' shapes and
strides, the inputs' expected strides and the iteration space. Size expressions are data
(they come from IR text and the kernel cache): they reach Python only through
``symbols.python_source``, which accepts integer arithmetic over symbols and nothing else.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import attrs
from torchloom.api import (Graph, TensorType, check_source, clone_graph, int_sizes,
                           symbols)

from torchloom_codegen_triton.indexing import Unsupported


def atomize(region: Graph) -> Graph:
    """``region`` itself when every symbol its types name is a bare dim of an input;
    otherwise a copy whose types name *atoms* instead: an input dim that is an expression
    of unbound symbols (``s27*s77``, a flattened batch) becomes a symbol ``_e<k>`` of its
    own, read from that input at launch, and every size that is a constant multiple of it
    (``192*s27*s77``) that multiple. Sizes still naming unbound symbols are left for
    :func:`bind_symbols` to refuse."""
    bare = set(_bindable(region))
    if all(s in bare for d in _all_dims(region) for s in symbols.symbols_of(d)):
        return region
    atoms: dict[str, str] = {}
    for v in region.inputs:
        if isinstance(v.type, TensorType):
            for d in v.type.shape:
                if _unbound(d, bare):
                    atoms.setdefault(d, f"_e{len(atoms)}")
    if not atoms:
        return region

    def sub(d):
        if not _unbound(d, bare):
            return d
        for expr, atom in atoms.items():
            c = _ratio(d, expr)
            if c is not None:
                return atom if c == 1 else f"{c}*{atom}"
        return d

    copy, _ = clone_graph(region)
    for v in [*copy.inputs, *(v for n in copy.nodes for v in n.outputs)]:
        t = v.type
        if isinstance(t, TensorType):
            v.type = attrs.evolve(t, shape=tuple(sub(d) for d in t.shape), strides=None
                                  if t.strides is None else tuple(sub(d) for d in t.strides))
    return copy


def _bindable(region: Graph) -> dict[str, tuple[int, int, int]]:
    """Symbol -> (input, dim, c) where that input dim is ``c`` times the symbol: the first
    bare dim naming it, else the first constant multiple (``4*s0``), else an int input a
    view takes as that size (dim -1: the input is the value)."""
    dims = [(i, k, d) for i, v in enumerate(region.inputs) if isinstance(v.type, TensorType)
            for k, d in enumerate(v.type.shape)]
    bound = {d: (i, k, 1) for i, k, d in reversed(dims) if symbols.is_symbol(d)}
    dims += _scalar_sizes(region)
    for i, k, d in dims:
        names = symbols.symbols_of(d)
        if len(names) == 1 and names[0] not in bound:
            c = _ratio(d, names[0])
            if c is not None:
                bound[names[0]] = (i, k, c)
    return bound


def _scalar_sizes(region: Graph) -> list[tuple[int, int, str]]:
    """(input, -1, dim) for int inputs of the group that are a size (``int_sizes``: an
    ``int[s0]``, or an int a view takes as a size)."""
    return [(i, -1, d) for i, d in int_sizes(region)]


def _all_dims(region: Graph):
    for v in [*region.inputs, *(v for n in region.nodes for v in n.outputs)]:
        if isinstance(v.type, TensorType):
            yield from v.type.shape
            yield from v.type.strides or ()


def _unbound(d, bare: set[str]) -> bool:
    return isinstance(d, str) and any(s not in bare for s in symbols.symbols_of(d))


def _ratio(d: str, expr: str) -> int | None:
    """The int ``c`` with ``d == c * expr`` at every size (judged at three points)."""
    names = sorted({*symbols.symbols_of(d), *symbols.symbols_of(expr)})
    found = set()
    for k in range(3):
        point = {s: random.Random(f"{k}:{s}").randrange(2, 1 << 16) for s in names}
        try:
            a, b = symbols.evaluate(d, point), symbols.evaluate(expr, point)
        except (symbols.SymbolicDimError, ZeroDivisionError):
            return None
        if not b or a % b:
            return None
        found.add(a // b)
    return found.pop() if len(found) == 1 and min(found) > 0 else None


def bind_symbols(region: Graph) -> dict[str, tuple[int, int, int]]:
    """Symbol -> (input index, dim, c): the symbol is that input dim over ``c`` (1 for a
    bare dim, the first one naming it); empty for a group with static sizes, in order of
    the inputs. A symbol no input dim carries alone or as a constant multiple cannot be
    passed (after :func:`atomize`): :class:`Unsupported`."""
    found = _bindable(region)
    order = [d for v in region.inputs if isinstance(v.type, TensorType)
             for d in v.type.shape]
    bound = {s: found[s] for d in order for s in symbols.symbols_of(d) if s in found}
    bound.update((s, b) for s, b in found.items() if s not in bound)  # from int inputs
    for v in [*region.inputs, *(v for n in region.nodes for v in n.outputs)]:
        t = v.type
        if not isinstance(t, TensorType):
            continue
        for d in (*t.shape, *(t.strides or ())):
            for s in symbols.symbols_of(d):
                if s not in bound:
                    raise Unsupported(f"size {d} of %{v.name} names {s}, which is no dim of "
                                      f"an input tensor: the kernel cannot be given its value")
    return bound


def size_function(meta: dict[str, Any]) -> Callable:
    """``sizes(*args) -> (symbol values, output shapes, output strides, input strides,
    numel, rows, rnumel)`` for a kernel with symbolic sizes (its ``meta["symbols"]``:
    ``[symbol, input, dim, c]`` in argument order: the symbol is that dim over c). Strides are None where contiguous; rows
    and rnumel are 0 for a pointwise kernel. Eager's error where a dim of
    ``meta["nonempty"]`` (rows a max, min, argmax or argmin reduces) is 0."""
    ns: dict[str, Any] = dict(symbols.guard_namespace())

    def src(d) -> str:
        if d is None:
            return "None"
        return symbols.python_source(d, lambda s: f"sym_{s}")

    def dims(ds) -> str:
        return "None" if ds is None else "(" + "".join(f"{src(d)}, " for d in ds) + ")"

    count = len(meta["inputs"])
    lines = [f"def sizes({', '.join(f'a{i}' for i in range(count))}):"]
    for name, i, k, c in meta["symbols"]:
        if not symbols.is_symbol(name):
            raise ValueError(f"{name!r} is not a size symbol")
        per = f" // {int(c)}" if int(c) != 1 else ""
        read = f"a{int(i)}" if int(k) < 0 else f"a{int(i)}.shape[{int(k)}]"  # an int input
        lines.append(f"    sym_{name} = {read}{per}")
    checks, checked = check_source(meta.get("nonempty", ()), src)
    ns.update(checks)  # eager's error for empty rows a max reduces
    lines += checked
    values = ", ".join(f"sym_{name}" for name, *_ in meta["symbols"])
    outs = [o for o in meta["outputs"]]
    ins = [d for d in meta["inputs"] if "scalar" not in d]
    lines.append(f"    return (({values},), [{', '.join(dims(o['shape']) for o in outs)}], "
                 f"[{', '.join(dims(o['strides']) for o in outs)}], "
                 f"[{', '.join(dims(d['strides']) for d in ins)}], "
                 f"{src(meta['numel'])}, {src(meta.get('rows', 0))}, "
                 f"{src(meta.get('rnumel', 0))})")
    exec(compile("\n".join(lines) + "\n", "<torchloom triton sizes>", "exec"), ns)
    return ns["sizes"]
