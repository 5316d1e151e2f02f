"""Split (two-stage) reductions: enough programs for a reduction with a small output.

A reduction whose rows are few (``x.sum()`` has one; a column sum over 3,072 columns has
48 blocks of 64) would launch a handful of programs and leave most SMs idle. The split
form cuts the reduced index into ``splits`` chunks of ``chunk`` elements (a multiple of
every candidate ``RBLOCK``) so that ``row blocks x splits`` reaches ``TARGET_PROGRAMS``
(two per SM of an H100): program ``(row block, split)`` reduces its chunk in the looped
form and stores one partial per row and reduction to a scratch buffer ``[splits, rows]``;
the finishing kernel ``_finish`` combines the partials of each row, applies the
reduction's output template (``mean``: the sum over ``n``) and computes the group's
epilogue from there (``x.norm()``: the square root of the sum), with a second writer over
the same region whose reduction results are the combined partials.

With symbolic sizes (variants.py) the chunk length and count are arguments (``kchunk``,
``ksplits``) that the launcher computes per call with :func:`split_shape`.

Where it applies: a looped reduction (sums, maxima or minima; no reduction reading
another's result) whose outputs all live in the row space (one element per row: the
reduction results and pointwise math on them), with fewer row blocks than
``TARGET_PROGRAMS``.
"""

from __future__ import annotations

from typing import Any

from torchloom.api import expr, row_forms, stmt

from torchloom_codegen_triton import lanes
from torchloom_codegen_triton.indexing import Unsupported
from torchloom_codegen_triton.ops import (COMPUTE, IDENTITY, REDUCE_HELPERS, REDUCTIONS,
                                          combined, reduced_block)
from torchloom_codegen_triton.protocol import Writer
from torchloom_codegen_triton.reduction import block_reduce, reduction_outputs, row_count
from torchloom_codegen_triton.render import function
from torchloom_codegen_triton.rows_and_columns import FINISH_BLOCK, FINISH_PARTIALS
from torchloom_codegen_triton.tensors import same_shape, tensor_type


#: programs a split reduction aims for: two per SM of an H100 (132 SMs)
TARGET_PROGRAMS = 264
_KINDS = ("sum", "max", "min")


def plan_split(w: Writer, configs: list[dict[str, int]]) -> "SplitReduction | None":
    """The split plan of ``w``'s reduction, or None where the ordinary form is used: the
    core's conditions and shape (``torchloom.codegen.row_forms``), this renderer's
    reductions (sums, maxima, minima combined in f32) and epilogue."""
    if not w.looped or w.col is not None or (w.symbolic and w.form != "split"):
        return None
    for n in w.reductions:
        if REDUCTIONS[n.op].kind not in _KINDS or \
                COMPUTE[tensor_type(n.outputs[0]).dtype] not in ("f32",):
            return None
    if not row_forms.splittable(w.reductions, w.region.outputs, w.rows, tensor_type):
        return None
    produced = {v: n for n in w.reductions for v in n.outputs}
    if w.symbolic:  # chunks and their count are arguments the launcher computes
        return _checked(SplitReduction(w, produced, "kchunk", "ksplits"))
    shape = split_shape(w.rows, w.rnumel, configs[0]["XBLOCK"],
                        max(c["RBLOCK"] for c in configs))
    if shape is None:
        return None
    chunk, splits = shape
    return _checked(SplitReduction(w, produced, chunk, splits))


def split_shape(rows: int, rnumel: int, xblock: int, rblock: int) -> tuple[int, int] | None:
    """(chunk, splits) of a reduction of ``rows`` rows of ``rnumel`` in blocks of
    ``xblock`` rows, chunks a multiple of ``rblock``, for :data:`TARGET_PROGRAMS`; None
    where it is not split (``row_forms.Split.shape``)."""
    split = row_forms.Split.shape(rows, rnumel, xblock, rblock, TARGET_PROGRAMS)
    return None if split is None else (split.chunk, split.splits)


def _checked(plan: "SplitReduction") -> "SplitReduction | None":
    try:  # the epilogue must be computable from the row results alone
        plan.finish_source([f"out{i}" for i in range(len(plan.w.region.outputs))])
    except Unsupported:
        return None
    return plan


class SplitReduction:
    """The main kernel's partials and the finishing kernel (see the module docstring)."""

    def __init__(self, w: Writer, produced: dict, chunk: int, splits: int):
        self.w, self.chunk, self.splits = w, chunk, splits
        self.produced = produced

    def body(self) -> None:
        """Reduce this program's chunk; store each reduction's partial per row."""
        w, em = self.w, self.w.em
        for k, n in enumerate(w.reductions):
            kind = REDUCTIONS[n.op].kind
            src = n.inputs[0]
            dtype = COMPUTE[tensor_type(n.outputs[0]).dtype]
            acc = block_reduce(w, kind, lambda src=src: w.value_at(src, w.full), dtype)
            acc = em.convert(acc, "f32")
            target = stmt.Element(f"scratch{k}", lanes.plus(
                lanes.times(lanes.program(1), w.ix.size_code(w.rows)), "xindex"))
            em.statement(stmt.Store(target, acc.text, "xmask"), False)

    @property
    def scratch(self) -> list[dict]:
        """Per reduction: ``[splits, rows]`` partials (numel None: sized at launch)."""
        numel = None if self.w.symbolic else self.splits * self.w.rows
        return [{"dtype": "f32", "numel": numel} for _ in self.w.reductions]

    def finish_source(self, out_names: list[str]) -> tuple[str, list[int], set[str]]:
        """``_finish(inputs..., outputs..., scratch..., FBLOCK)``: combine each row's
        partials, then compute and store every output (the epilogue) at that row. Returns
        its source, the outputs it stores and the module helpers it calls."""
        w = self.w
        fin = type(w)(w.group, w.registry, w.max_persistent, finish=True,
                      out_names=out_names)
        em = fin.em
        fin.finish_rows()
        rows = w.ix.size_code(w.rows)
        for k, n in enumerate(w.reductions):
            kind = REDUCTIONS[n.op].kind
            identity = IDENTITY[kind]
            acc = f"acc{k}"
            em.use(*REDUCE_HELPERS[kind])
            em.statement(stmt.Assign(acc, lanes.full(["FBLOCK", 1], lanes.constant(identity),
                                                     "tl.float32")), False)
            combine = stmt.Assign(acc, combined(kind, acc, reduced_block(kind, "part", 1)))
            em.statement(stmt.Loop("p0", "0", str(self.splits), (
                stmt.Assign("pindex", lanes.plus("p0", lanes.row(lanes.arange(FINISH_PARTIALS)))),
                stmt.Assign("part", lanes.masked_load(
                    lanes.plus(lanes.plus(f"scratch{k}", lanes.times("pindex", rows)), "xindex"),
                    lanes.both(lanes.less("pindex", self.splits), "xmask"),
                    lanes.constant(identity))),
                combine), step=str(FINISH_PARTIALS)), False)
            fin.record(reduction_outputs(fin, n, {"acc": expr.Name(acc), "n": row_count(fin)}))
        for i, v in enumerate(w.region.outputs):
            fin.store(i, v, _row_coords(fin, v))
        params = [f"in_{v.name}" for v in w.region.inputs] + list(out_names)
        params += [f"ks{k}" for k in range(len(w.symbols))] + (
            ["kchunk", "ksplits"] if w.symbolic else [])  # as the main kernel's
        params += [f"scratch{k}" for k in range(len(w.reductions))] + ["FBLOCK: tl.constexpr"]
        source = "\n\n" + function("_finish", params, em.lines) + "\n"
        return source, list(range(len(w.region.outputs))), em.helpers

    def metadata(self) -> dict[str, Any]:
        return {"splits": self.splits, "chunk": self.chunk, "scratch": self.scratch,
                "form": "split reduction",
                "finish": {"kernel": "_finish", "outputs": list(range(len(
                    self.w.region.outputs))), "grid": None if self.w.symbolic else
                    -(-self.w.rows // FINISH_BLOCK),
                    "config": {"FBLOCK": FINISH_BLOCK}, "inputs": True}}

    def traffic(self) -> int:
        """Bytes of the scratch: written by the main kernel, read by _finish."""
        return sum(s["numel"] * 4 for s in self.scratch)


def _row_coords(fin, v) -> tuple[str, ...]:
    """The coordinates of output ``v`` (one element per row) at the finisher's rows."""
    shape = tuple(tensor_type(v).shape)
    w_shape = tuple(fin.kept_shape)
    if same_shape(shape, w_shape):
        return fin.row
    if same_shape(shape, [1 if d in fin.rdims else s for d, s in enumerate(fin.shape)]):
        return fin.row_keepdim
    return fin.ix.reshape(fin.row, w_shape, shape, fin.known)
