"""Row and column reductions of the same data in one kernel, finished by a second one.

The layer-norm (and RMSNorm) backward reduces one ``[R, C]`` product both ways: per row
(the statistics the input gradient needs) and per column (the weight and bias gradients).
One kernel does both from one read: a fixed number of programs (``PROGRAMS``, two per SM
of an H100) each walks its rows in blocks (``for it in range(...)``: block ``pid + it *
PROGRAMS``), computes the row reductions and the row outputs as the persistent form does,
and adds each block's column sums into a ``[1, C]`` register accumulator; at the end it
writes its partial column sums to a scratch buffer ``[PROGRAMS, C]``. A small finishing
kernel (``_finish``) combines the partials of each column and stores the column outputs.

Where it applies: the group's reductions are the core's row + column plan
(``schedule.RowsAndColumns``: two nests of one shape P, one reducing P's last dim, the
rows, held whole: no longer than the persistent limit, the other the rest, dim 0 among
them, the columns); the column reductions are sums, maxima or minima whose
results are outputs of the group (read by nothing else in it), stored contiguously. With
symbolic sizes the row length must be static; a symbolic row count makes the number of
programs an argument (``kprog``, at most ``PROGRAMS``) that the launcher computes per call.
"""

from __future__ import annotations


from torchloom.api import Node, Value, expr, stmt

from torchloom_codegen_triton import lanes
from torchloom_codegen_triton.indexing import Unsupported
from torchloom_codegen_triton.ops import (COMPUTE, IDENTITY, REDUCE_HELPERS, REDUCTIONS,
                                          STORAGE, combined, literal, reduced_block)
from torchloom_codegen_triton.protocol import Writer
from torchloom_codegen_triton.render import function
from torchloom_codegen_triton.tensors import tensor_type


#: programs of a row + column kernel: two per SM of an H100 (132 SMs)
PROGRAMS = 264
#: columns per program of the finishing kernel, and partials combined per step
FINISH_BLOCK, FINISH_PARTIALS = 128, 32
_COLUMN_KINDS = ("sum", "max", "min")


class ColumnPartials:
    """The column reductions of a row + column kernel (see the module docstring)."""

    def __init__(self, writer: Writer, columns: list[Node]):
        self.w = writer
        self.columns = columns
        #: programs of the main kernel (no more than there are rows): with symbolic rows,
        #: the argument ``kprog`` the launcher computes so
        self.programs = min(PROGRAMS, max(writer.rows, 1)) if isinstance(
            writer.rows, int) else "kprog"
        self.outputs: dict[int, tuple[Node, str]] = {}  # region output index -> (node, kind)
        consumers = {v: [n for n in writer.region.nodes if v in n.inputs]
                     for n in columns for v in n.outputs}
        region_outputs = list(writer.region.outputs)
        for n in columns:
            kind = REDUCTIONS[n.op].kind
            if kind not in _COLUMN_KINDS or len(n.outputs) != 1:
                raise Unsupported(f"a column reduction {n.op} beside row reductions (only "
                                  f"sums, maxima and minima)")
            v = n.outputs[0]
            if consumers[v] or v not in region_outputs:
                raise Unsupported(f"the column reduction %{v.name} is read inside the group")
            t = tensor_type(v)
            strides = t.actual_strides()  # None: contiguous (symbolic sizes)
            if t.dtype not in IDENTITY_DTYPES or (strides is not None and (
                    not t.is_static or list(strides) != _contiguous(t.shape))):
                raise Unsupported(f"column reduction output %{v.name} ({t.dtype}, strided)")
            for i, out in enumerate(region_outputs):
                if out is v:
                    self.outputs[i] = (n, kind)

    def is_column_output(self, v: Value) -> bool:
        return any(n.outputs[0] is v for n in self.columns)

    def accumulate(self) -> tuple[list[stmt.Statement], list[stmt.Statement],
                                  list[stmt.Statement]]:
        """(statements before the row loop, at the end of its body, after it)."""
        w, em = self.w, self.w.em
        init, update, store = [], [], []
        for k, n in enumerate(self.columns):
            kind = REDUCTIONS[n.op].kind
            identity = IDENTITY[kind]
            em.use(*REDUCE_HELPERS[kind])
            value = em.convert(w.value_at(n.inputs[0], w.full), "f32")
            masked = em.emit(lanes.where(lanes.both("xmask", "rmask"), value.code,
                                         lanes.constant(identity)), "f32", "cm", rdep=True)
            block = em.emit(reduced_block(kind, masked.code, 0),
                            "f32", "cblk", rdep=True)
            acc = f"cacc{k}"
            init.append(stmt.Assign(acc, lanes.full([1, "RBLOCK"], lanes.constant(identity),
                                                    "tl.float32")))
            update.append(stmt.Assign(acc, combined(kind, acc, block.code)))
            offset = lanes.plus(lanes.times(lanes.program(0), w.ix.size_code(w.rnumel)),
                                "colidx")
            store.append(stmt.Store(stmt.Element(f"scratch{k}", offset),
                                    acc, lanes.less("colidx", w.ix.size_code(w.rnumel))))
        # names bound inside the loop are not defined after it (Triton's loop scoping)
        colidx = stmt.Assign("colidx", lanes.row(lanes.arange("RBLOCK")))
        return init, update, [colidx, *store]

    @property
    def scratch(self) -> list[dict]:
        """Per column reduction: ``[programs, C]`` partials (numel None: at launch)."""
        numel = self.programs * self.w.rnumel if isinstance(self.programs, int) else None
        return [{"dtype": "f32", "numel": numel} for _ in self.columns]

    def finish_source(self, out_names: list[str]) -> tuple[str, list[int], set[str]]:
        """The finishing kernel, the region output indices it stores, in order, and the
        module helpers it calls."""
        order = sorted(self.outputs)
        entries = []
        for i in order:
            n, kind = self.outputs[i]
            entries.append((self.columns.index(n), out_names[i], kind,
                            REDUCTIONS[n.op].outputs[0], tensor_type(n.outputs[0]).dtype))
        w = self.w
        sizes = [f"ks{k}" for k in range(len(w.symbols))] + ["kprog"] if w.symbolic else []
        reduced = literal(float(w.rows)) if isinstance(w.rows, int) else \
            lanes.cast(w.ix.size_code(w.rows), "tl.float32")
        helpers = {h for _, _, kind, _, _ in entries for h in REDUCE_HELPERS[kind]}
        helpers |= {"_round_to_bf16" for *_, dtype in entries if dtype == "bf16"}
        return finish_source(entries, len(self.columns), w.rnumel, self.programs, reduced,
                             sizes), order, helpers

    def traffic(self) -> tuple[int, int]:
        """(bytes, bytes) the scratch adds: written by the main kernel, read by _finish."""
        size = sum(s["numel"] * 4 for s in self.scratch)
        return size, size


#: column outputs the finishing kernel can store (floating point, as it accumulates in f32)
IDENTITY_DTYPES = tuple(d for d, c in COMPUTE.items() if c in ("f32", "f64") and d != "f64")


def _contiguous(shape) -> list[int]:
    strides, acc = [], 1
    for d in reversed(list(shape)):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def finish_source(entries: list[tuple[int, str, str, str, str]], scratches: int,
                  elements: int, partials: int | str, reduced: expr.Code,
                  sizes: list[str] = ()) -> str:
    """``_finish(scratch..., outs..., sizes..., FBLOCK)``: for each ``(scratch index,
    output name, kind, output template, dtype)``, combine the ``partials`` rows of the
    scratch buffer ``[partials, elements]`` element by element, apply the reduction's
    output template (``{n}``: ``reduced``, the f32 count of elements behind each result)
    and store the output. ``sizes``: size arguments the texts name (symbolic rows)."""
    params = [f"scratch{k}" for k in range(scratches)]
    params += [name for _, name, _, _, _ in entries] + list(sizes) + ["FBLOCK: tl.constexpr"]
    body: list[stmt.Statement] = [
        stmt.Assign("cindex", lanes.plus(lanes.times(lanes.program(0), "FBLOCK"),
                                         lanes.row(lanes.arange("FBLOCK")))),
        stmt.Assign("cmask", lanes.less("cindex", elements))]
    for k, name, kind, template, dtype in entries:
        identity = IDENTITY[kind]
        block = reduced_block(kind, "part", 0)
        body += [stmt.Assign(f"acc{k}", lanes.full([1, "FBLOCK"], lanes.constant(identity),
                                                   "tl.float32")),
                 stmt.Loop("p0", "0", str(partials), (
                     stmt.Assign("pindex", lanes.plus("p0", lanes.column(
                         lanes.arange(FINISH_PARTIALS)))),
                     stmt.Assign("part", lanes.masked_load(
                         lanes.plus(lanes.plus(f"scratch{k}", lanes.times("pindex", elements)),
                                    "cindex"),
                         lanes.both(lanes.less("pindex", partials), "cmask"),
                         lanes.constant(identity))),
                     stmt.Assign(f"acc{k}", combined(kind, f"acc{k}", block))),
                     step=str(FINISH_PARTIALS))]
        value = expr.fill(template, {"acc": expr.Name(f"acc{k}"), "n": reduced})
        if dtype == "bf16":
            value = lanes.call("_round_to_bf16", value)
        stored = expr.Op(f"({{0}}).to({STORAGE[dtype]})", expr.POSTFIX, (value,))
        body.append(stmt.Store(stmt.Element(name, "cindex"), stored, "cmask"))
    return "\n\n" + function("_finish", params, body) + "\n"
