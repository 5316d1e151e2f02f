"""Which inputs of a C kernel its outputs may be written over (the kernel's ``inplace``
pairs, which the plan's buffer reuse reads: :mod:`torchloom.codegen.buffers`)."""

from __future__ import annotations

from torchloom.api import GATHER_OPS, Graph, TensorType, Value, stmt

from torchloom_codegen_cpu.kernel import KernelWriter, output_names
from torchloom_codegen_cpu.ops import VIEWS


def inplace_pairs(region: Graph, nests: list[KernelWriter], body: list
                  ) -> list[tuple[int, int]]:
    """(input, output) pairs the kernel may be given one buffer for (the plan writes an
    output into an input that dies at the group, or into a graph input in place of a
    ``copy_``: :mod:`torchloom.codegen.buffers`): the input read at the walk's coordinates
    only (no view of it, or of a value computed from it, but a reshape or one that only
    adds or drops dims of size 1: :func:`_read_in_place`), with the output's dtype and
    its elements at the same places (:func:`_same_places`), and its last read before the
    output is first stored (in program order: :func:`_touched`). Every nest is pointwise,
    or a reduction over rows (``x``) with no column sums carried: a row is one iteration's, its
    passes read the input before the last one writes the output at the element it read (a
    cross entropy's ``f32[1, N, C]`` gradient written over the saved ``f32[N, C]``
    log-probabilities). Nests run one after the other (each its own parallel loop, which
    ends when all its threads do), so an input read by an earlier nest only is read
    whole before a later nest writes over it (an optimizer step's ``f32[]`` step count,
    its own nest after the parameter's). Never where a row loop runs past its row's end
    (overrun.py: it writes the next row before that row is read). Such pointers lose
    ``restrict``, so the C compiler keeps that order."""
    for nest in nests:
        rows = nest.kind == "reduction" and nest.loop.var == "x" and not nest.columns
        if not (nest.kind == "pointwise" or rows) or nest.em.overran:
            return []
    touched = _touched(body)
    pairs = []
    for j, (name, out) in enumerate(zip(output_names(region), region.outputs)):
        stored = touched.get(name, (-1, -1))[0]
        for i, v in enumerate(region.inputs):
            if _same_places(v, out) and stored >= 0 and \
                    touched.get(f"in_{v.name}", (-1, -1))[1] < stored and \
                    _read_in_place(region, v):
                pairs.append((i, j))
    return pairs


def _touched(body: list) -> dict[str, tuple[int, int]]:
    """Pointer -> the first and last place the statements ``body`` touch an element of
    it, places counted in program order (nested statements after the loop or branch
    holding them; in a statement, its target first, then what its value reads)."""
    places: dict[str, tuple[int, int]] = {}
    elements = (e for s in stmt.walk(body) if hasattr(s, "facts") for e in s.facts.elements)
    for k, e in enumerate(elements):
        places[e.pointer] = (places.get(e.pointer, (k, k))[0], k)
    return places


def _read_in_place(region: Graph, v: Value) -> bool:
    """Whether every view in ``region`` of ``v`` or of a value computed from it keeps each
    element's row-major index (a reshape, :data:`VIEWS`' rule ``reshape``, always; any
    other view where :func:`_same_elements`), and no gather reads one as its table
    (its rows are read at indices: a row written over before another row reads it)."""
    reached = {v}
    for node in region.nodes:
        if any(u in reached for u in node.inputs):
            if node.op in VIEWS and VIEWS[node.op] != "reshape" and \
                    not _same_elements(node.inputs[0], node.outputs[0]):
                return False
            if node.op in GATHER_OPS and node.inputs[0] in reached:
                return False
            reached.update(node.outputs)
    return True


def _same_elements(a: Value, b: Value) -> bool:
    """Whether ``a`` and ``b`` are dense tensors of one dtype and static shapes equal but
    for dims of size 1: element ``k`` of each, row-major, sits at the same coordinates."""
    ta, tb = a.type, b.type
    return ta == tb and isinstance(ta, TensorType) or _dense_pair(ta, tb) and \
        ta.squeezed_shape() == tb.squeezed_shape()


def _same_places(a: Value, b: Value) -> bool:
    """Whether element ``k`` of ``a`` and of ``b``, row-major, sit at the same place in
    their buffers: one type, or dense tensors of one dtype and static element count (a
    kernel's input and output, between which only reshapes keep each element's row-major
    index: GELU's ``f32[394, 1024]`` matmul output read as ``f32[2, 197, 1024]``)."""
    ta, tb = a.type, b.type
    return ta == tb and isinstance(ta, TensorType) or _dense_pair(ta, tb) and \
        ta.numel() == tb.numel()


def _dense_pair(ta, tb) -> bool:
    """Whether types ``ta`` and ``tb`` are static dense tensors of one dtype and device."""
    return isinstance(ta, TensorType) and isinstance(tb, TensorType) and \
        ta.dtype == tb.dtype and ta.device == tb.device and ta.is_static and \
        tb.is_static and ta.is_dense and tb.is_dense
