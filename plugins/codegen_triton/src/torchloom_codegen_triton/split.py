"""Split (two-stage) reductions: enough programs for a reduction with a small output.

A reduction whose rows are few (``x.sum()`` has one; a column sum over 3,072 columns has
48 blocks of 64) would launch a handful of programs and leave most SMs idle. The split
form cuts the reduced index into ``splits`` chunks of ``chunk`` elements (a multiple of
every candidate ``RBLOCK``) so that ``row blocks x splits`` reaches ``TARGET_PROGRAMS``
(two per SM of an H100): program ``(row block, split)`` reduces its chunk in the looped
form and stores one partial per row and reduction to a scratch buffer ``[splits, rows]``;
the finishing kernel (``rowcol.finish_source``) combines the partials of each row and
applies the reduction's output template (``mean``: the sum over ``n``).

Where it applies: a looped reduction whose results are the group's outputs (stored
contiguously, floating point, nothing else in the group reads them), all sums, maxima
or minima, with fewer row blocks than ``TARGET_PROGRAMS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchloom_codegen_triton.ops import COMPUTE, REDUCTIONS
from torchloom_codegen_triton.reduction import block_reduce
from torchloom_codegen_triton.rowcol import FINISH_BLOCK, IDENTITY_DTYPES, finish_source

if TYPE_CHECKING:
    from torchloom_codegen_triton.kernel import KernelWriter

#: programs a split reduction aims for: two per SM of an H100 (132 SMs)
TARGET_PROGRAMS = 264
_KINDS = ("sum", "max", "min")


def plan_split(w: "KernelWriter", configs: list[dict[str, int]]) -> "SplitReduction | None":
    """The split plan of ``w``'s reduction, or None where the ordinary form is used."""
    from torchloom_codegen_triton.kernel import tensor_type
    if not w.looped or w.col is not None:
        return None
    row_blocks = -(-w.rows // configs[0]["XBLOCK"])
    if row_blocks >= TARGET_PROGRAMS:
        return None
    produced = {v: n for n in w.reductions for v in n.outputs}
    outputs = list(w.region.outputs)
    for n in w.region.nodes:  # nothing but the outputs reads a reduction result
        if any(v in produced for v in n.inputs):
            return None
    for v in outputs:
        t = tensor_type(v)
        if v not in produced or t.dtype not in IDENTITY_DTYPES or \
                list(t.actual_strides()) != _contiguous(t.shape):
            return None
    for n in w.reductions:
        if REDUCTIONS[n.op].kind not in _KINDS:
            return None
    rblock = max(c["RBLOCK"] for c in configs)
    wanted = -(-TARGET_PROGRAMS // row_blocks)
    chunk = max(rblock, (w.rnumel // wanted) // rblock * rblock)
    splits = -(-w.rnumel // chunk)
    if splits < 2:
        return None
    return SplitReduction(w, produced, chunk, splits)


class SplitReduction:
    """The main kernel's partials and the finishing kernel (see the module docstring)."""

    def __init__(self, w: "KernelWriter", produced: dict, chunk: int, splits: int):
        self.w, self.chunk, self.splits = w, chunk, splits
        self.produced = produced

    def body(self) -> None:
        """Reduce this program's chunk; store each reduction's partial per row."""
        from torchloom_codegen_triton.kernel import tensor_type
        w, em = self.w, self.w.em
        for k, n in enumerate(w.reductions):
            kind = REDUCTIONS[n.op].kind
            src = n.inputs[0]
            dtype = COMPUTE[tensor_type(n.outputs[0]).dtype]
            acc = block_reduce(w, kind, lambda src=src: w.value_at(src, w.full), dtype)
            acc = em.convert(acc, "f32")
            em.statement(f"tl.store(scratch{k} + tl.program_id(1) * {w.rows} + xindex, "
                         f"{acc.text}, xmask)", False)

    @property
    def scratch(self) -> list[dict]:
        return [{"dtype": "f32", "numel": self.splits * self.w.rows} for _ in self.w.reductions]

    def finish_source(self, out_names: list[str]) -> tuple[str, list[int]]:
        from torchloom_codegen_triton.kernel import tensor_type
        w = self.w
        order, entries = [], []
        for i, v in enumerate(w.region.outputs):
            n = self.produced[v]
            template = REDUCTIONS[n.op].outputs[list(n.outputs).index(v)]
            order.append(i)
            entries.append((w.reductions.index(n), out_names[i], REDUCTIONS[n.op].kind,
                            template, tensor_type(v).dtype))
        return finish_source(entries, len(w.reductions), w.rows, self.splits,
                             w.rnumel), order

    def metadata(self) -> dict[str, Any]:
        return {"splits": self.splits, "chunk": self.chunk, "scratch": self.scratch,
                "form": "split reduction",
                "finish": {"kernel": "_finish", "outputs": list(range(len(
                    self.w.region.outputs))), "grid": -(-self.w.rows // FINISH_BLOCK),
                    "config": {"FBLOCK": FINISH_BLOCK}}}

    def traffic(self) -> int:
        """Bytes of the scratch: written by the main kernel, read by _finish."""
        return sum(s["numel"] * 4 for s in self.scratch)


def _contiguous(shape) -> list[int]:
    strides, acc = [], 1
    for d in reversed(list(shape)):
        strides.append(acc)
        acc *= d
    return strides[::-1]
