"""Row buffers: values of a reduction's row that several of its loops read.

Expensive values (exp, tanh, ...) of a row that several loops read (softmax's exp feeds
the sum and the epilogue) are kept in a row buffer by the first loop and read back by the
later ones, instead of being recomputed. The buffer is the row of the output the last loop
stores, where there is one such output of the value's C type (an f32 softmax: exp is
written where its quotient goes, as eager does; the output is a fresh buffer, never an
input's), else an array on the thread's stack. A row longer than ``kernel.ROW_BUFFER`` or
of symbolic length (it may not fit the stack) has only the output's row.

A float value computed from a libm call that varies along the row (``LIBM_VECTOR``) and
read by several loops is kept too, even where the call is cheap to repeat: a SIMD loop's
libmvec lanes and a plain loop's scalar call (a short row's max,
:func:`reduction.short_odd_row`) can round it differently, and amax's gradient,
``x == max(x)``, then found no maximum in its row (a count of 0, NaN).
"""

from __future__ import annotations

from typing import Any

from torchloom.api import Node, Value, expr, stmt

from torchloom_codegen_cpu.row_loops import whole_vectors
from torchloom_codegen_cpu.ops import COMPUTE, CTYPE, EXPENSIVE, FLOATS, LIBM_VECTOR
from torchloom_codegen_cpu.tensors import tensor_type

Host = tuple[str, stmt.Element]


def plan(w: Any, stack: bool) -> tuple[dict[Value, stmt.Element], list[stmt.Array]]:
    """For the reduction writer ``w`` (its row planned: ``full``, ``reduction_nest``):
    each value kept in a row buffer -> its element at ``r``, and the stack arrays to
    declare (``stack``: whether the row fits the stack)."""
    kept: dict[Value, stmt.Element] = {}
    arrays: list[stmt.Array] = []
    host = _host(w)
    if not stack and host is None:
        return kept, arrays
    varies: set[Value] = set()  # computed from such a call, not read from a buffer
    for node in w.region.nodes:
        derived = node.op in LIBM_VECTOR and _along_row(w, node) or any(
            i in varies for i in node.inputs)
        if not derived and node.op not in EXPENSIVE:
            continue
        v = node.outputs[0] if len(node.outputs) == 1 else None
        if v is not None and _several_row_reads(w, v, derived and node.op not in EXPENSIVE):
            ctype = CTYPE[COMPUTE[tensor_type(v).dtype]]
            if host is not None and host[0] == ctype and v not in w.outputs:
                kept[v], host = host[1], None
                continue
            if stack:
                name = f"buf_{v.name}"
                arrays.append(stmt.Array(ctype, name, str(whole_vectors(w.rnumel))))
                kept[v] = stmt.Element(name, expr.Name("r"))
                continue
        varies.update(v for v in node.outputs if derived)
    return kept, arrays


def _along_row(w: Any, node: Node) -> bool:
    """Whether ``node``'s result may change along the row (a result broadcast along
    every reduced dim is computed once before the row's loops)."""
    shape = tuple(tensor_type(node.outputs[0]).shape) if node.outputs else ()
    return len(shape) != len(w.shape) or any(
        shape[d] != 1 for d in w.reduction_nest.rdims)


def _several_row_reads(w: Any, v: Value, floats_only: bool) -> bool:
    """Whether ``v`` has the row's shape and several readers (a float, if
    ``floats_only``)."""
    t = tensor_type(v)
    return tuple(t.shape) == w.shape and len(v.users()) + (v in w.outputs) >= 2 and \
        not (floats_only and t.dtype not in FLOATS)


def _host(w: Any) -> Host | None:
    """(C type, element at ``r``) of the one output the last loop of a row stores,
    if it has the reduced shape, no zero stride and a type C computes in."""
    full = [(name, v) for name, v in zip(w.out_names, w.outputs)
            if tuple(tensor_type(v).shape) == w.shape]
    if len(full) != 1 or sum(w.place_output(v)[0] for v in w.outputs) != 1:
        return None
    ((name, v),) = full
    if name in w.staged:  # (its row is in a block buffer)
        return None
    t = tensor_type(v)
    strides = t.actual_strides()
    if t.dtype not in ("f32", "f64") or strides is not None and any(
            s == 0 and d != 1 for s, d in zip(strides, t.shape)):
        return None
    return CTYPE[COMPUTE[t.dtype]], stmt.Element(name, w.ix.address(w.full, strides, t.shape,
                                                                     w.known))
