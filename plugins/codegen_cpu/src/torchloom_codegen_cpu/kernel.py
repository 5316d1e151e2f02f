"""Fusion group -> one C function.

Two kernel kinds share one writer, both a parallel loop over *rows* whose body holds SIMD
loops (*phases*, see emitter.py):

- *pointwise*: the first output is walked in its memory order; a row is every dim but the
  innermost, and the innermost dim (split into chunks when long, so a single long row
  still spreads over threads) is the SIMD loop ``j``. Every value is computed at the
  coordinates of the walk: inputs broadcast, views are index math, nothing is copied.
- *reduction*: all reductions of the group reduce the same dims of the same shape P. A row
  is one combination of the kept dims; each reduction is a SIMD loop ``r`` over the reduced
  dims with an OpenMP reduction clause, values computed per row (mean, rstd) are row
  statements, and outputs of shape P are stored by a last loop (the epilogue).

Low-precision (f16/bf16) values are computed in f32 and rounded wherever eager rounds (an
op's f16/bf16 result, an explicit cast); reductions accumulate in f32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from torchloom.api import (Node, TensorType, Value, expr, indexing, nest_writer, row_form,
                           schedule, stmt, writer)

from torchloom_codegen_cpu import (row_blocks, row_buffers, row_loops, row_nest,
                                  rows_and_columns, staging)
from torchloom_codegen_cpu.columns import column_body, column_plan
from torchloom_codegen_cpu.emitter import Emitter, Expr
from torchloom_codegen_cpu.nest import ParallelLoop
from torchloom_codegen_cpu.ops import CTYPE, POINTWISE, REDUCTIONS, literal
from torchloom_codegen_cpu.overrun import (PARALLEL_FOR, PARALLEL_MIN, chunked, row_offsets,
                                          work)
from torchloom_codegen_cpu.reduction import (across_rows, check_row_stride, lower_reduction,
                                             prefetch_next_row)
from torchloom_codegen_cpu.render import (Pragma, Simd, compare, every, in_block, par, pure,
                                         smaller)
from torchloom_codegen_cpu.spelling import C as C_SPELLING
from torchloom_codegen_cpu.tensors import Unsupported, tensor_type

Coords = indexing.Coords
ZERO, is_zero = indexing.ZERO, indexing.is_zero

SCALAR_DTYPES = writer.SCALAR_DTYPES
#: the innermost dim of a pointwise walk is split into chunks of this many elements
CHUNK = 4096
#: a walk over every element at once (``tensors.walked_flat``) runs in chunks of this many:
#: rows enough for threads, each a long SIMD loop
FLAT_CHUNK = 1024
#: rows up to this many elements may keep expensive values in a buffer on the stack
ROW_BUFFER = 16384


class KernelWriter(nest_writer.NestWriter, row_form.RowForm):
    """Writes one group's C function. ``generate()`` -> (source, metadata)."""

    POINTWISE, REDUCTIONS, GATHERS = POINTWISE, REDUCTIONS, True
    spelling = C_SPELLING
    tensor_type = staticmethod(tensor_type)

    def __init__(self, group: Node, registry: Any, outputs: list[tuple[str, Value]] | None = None,
                 reductions: list[Node] | None = None, names: dict[str, str] | None = None,
                 read_back: dict[Value, str] | None = None,
                 columns: list[tuple[str, Node]] | None = None,
                 staged: dict[str, staging.Staged] | None = None):
        """``outputs`` (C name, value) and ``reductions``: the part of the group this nest
        writes (default: all of it; see function.py for groups written as several nests);
        ``names``: each size symbol's C argument (symbolic sizes are runtime arguments);
        ``read_back``: outputs earlier nests of the function wrote (value -> its C name),
        read back from there; ``columns``: column sums this row nest carries (C name of the
        output, sum node: rows_and_columns.py); ``staged``: C pointer -> the tensor a reduction
        nest reads or writes through block buffers (staging.py; :meth:`restaged`)."""
        self._args = (group, registry, outputs, reductions, names, read_back, columns)
        self.staged = staged or {}
        #: C pointer -> what the row form found of it for staging (staging.entry)
        self.stage_found: dict[str, staging.Staged] = {}
        self.group = group
        self.columns = columns or []
        if reductions is None:
            reductions = [n for n in group.region.nodes if n.op in REDUCTIONS]
        super().__init__(group, registry, Emitter(row_loops.narrow_limit(group.region)),
                         indexing.IndexMath(indexing.C, names), reductions, read_back or {})
        self._as_dims = indexing.IndexMath(indexing.SYMBOLS, names)
        self._check_region()
        if outputs is None:
            outputs = list(zip(output_names(self.region), self.region.outputs))
        self.out_names = [name for name, _ in outputs]
        self.outputs = [v for _, v in outputs]
        self.kind = "reduction" if self.reductions else "pointwise"
        #: value -> the element of its row buffer at ``r`` (row_buffers.py)
        self.buffers: dict[Value, stmt.Element] = {}
        # planned by body(): the rows of the nest (a pointwise walk's rows and chunks, a
        # reduction's kept elements), its elements, and its parallel loop (over the rows,
        # or tiles.py's tiles, or columns.py's blocks)
        self.rows: Any = None
        self.numel: Any = None
        self.loop = ParallelLoop("x", None)
        # a reduction nest (``reduction_nest``, planned by body(), read through
        # schedule.PlannedNest): a row's length as C text when symbolic (``rbound``) and
        # the declarations of its coordinates from ``r`` (``r_header``)
        self.rbound: Any = None
        self.r_header: list[stmt.Declare] = []
        #: the row's coordinate name per kept dim ("0" for a dim of one)
        self.row_names: Coords = ()
        self.parallel = False  # whether the nest runs on threads (decided by nest())
        #: (the declarations before the loop, a row's statements, the arrays it touches):
        #: what team.py writes the nest from where a function's nests share one region
        self.planned: tuple[list, list, int] = ([], [], 0)  # (by nest())

    # ---- analysis --------------------------------------------------------------------------
    def _check_region(self) -> None:
        devices = self.region_devices(self.region)
        if devices != {"cpu"}:
            raise Unsupported(f"values on {', '.join(sorted(devices))}: the cpu codegen "
                              f"compiles CPU groups only")

    # ---- values ----------------------------------------------------------------------------
    def checked_index(self, ids: Value, index: Expr, rows: int) -> expr.Code:
        """``index`` as it is: the function checks every index of the region's gathers
        before its nests run (gathers.py)."""
        return index.code

    def row_buffer(self, v: Value, coords: Coords) -> stmt.Element | None:
        """``v``'s element in its row buffer (row_buffers.py), at the row's elements."""
        return self.buffers.get(v) if coords == self.full else None

    def element(self, pointer: str, coords: Coords, t: TensorType, output: bool
                ) -> tuple[str, expr.Code]:
        """(pointer, offset) of the element at ``coords`` of the tensor at ``pointer``: in
        its block buffer where the nest stages it (staging.py)."""
        if self.kind == "reduction" and self.full is not None:
            found = None if self.staged else staging.entry(  # (a staged nest stages no more)
                self.stage_found.get(pointer), pointer, coords, t, output, self.row_names,
                self.kept_shape)
            if found is not None:
                self.stage_found[pointer] = found
            staged = self.staged.get(pointer)
            if staged is not None and staged.coords == tuple(coords):
                return staged.buffer, staging.offset(self.rnumel)
        return super().element(pointer, coords, t, output)

    def _check_view(self, node: Node, v: Value, t: TensorType, src: Value) -> None:
        if self.kind == "reduction" and (0 in t.shape or 0 in tensor_type(src).shape):
            # its coordinates would all be 0: reads hoisted out of the empty loop
            raise Unsupported(f"{node.op} of an empty tensor (%{v.name}) in a reduction")

    def walk(self, write: Callable[[], None]) -> list:
        """The statements ``write()`` emits, in a scope of their own taken out of the row (a
        loop over reduced elements: columns.py): the values it computed at them are out
        of scope after it (a later loop computes them again)."""
        self.em.open()
        write()
        return self.em.close()

    def aside(self, write: Callable[[], None]) -> None:
        """``write()`` with no row buffers, the values its phases compute not counted as
        computed by an earlier loop of the row after it (a loop that reads the row's first
        element: a later loop may be the row's first, which fills the row buffers the
        loops after it read)."""
        earlier, buffers = self.earlier, self.buffers
        self.earlier, self.buffers = dict(earlier), {}
        try:
            write()
        finally:
            self.earlier, self.buffers = earlier, buffers

    # ---- writing ---------------------------------------------------------------------------
    def body(self) -> list:
        """The statements of one row (``x``), and the loop header around it."""
        return self._pointwise_body() if self.kind == "pointwise" else self._reduction_body()

    def _pointwise_body(self) -> list:
        self.numel = schedule.elementwise_numel([tensor_type(v).shape for v in self.outputs])
        walked = self.walk_outputs(list(zip(self.out_names, self.outputs)))
        self.rows = walked.rows
        self.loop = ParallelLoop(walked.var, walked.trips)
        return walked.body

    # what WalkNest asks of a writer (walk_nest.py): its minimum, long rows in chunks (a
    # flat walk's too: the row length no longer bounds the SIMD loop), a row's SIMD loop
    smaller = staticmethod(smaller)
    CHUNK, FLAT_CHUNK, ROW_LOOP = CHUNK, FLAT_CHUNK, Simd()

    def _reduction_body(self) -> list:
        nest = self.reduction_nest = schedule.ReductionNest.of(self.reductions, tensor_type)
        self.rows, self.numel = nest.rows, nest.numel
        plan = column_plan(self)
        if plan is not None:
            self.loop, lines = column_body(self, plan)
            return lines
        self.loop = ParallelLoop("x", self.rows)
        check_row_stride(self)
        looped = self.row_form(nest, zip(self.out_names, self.outputs))
        lines = self.em.lines if looped else across_rows(self, self.em.lines)
        if self.staged:  # blocks of rows, their staged tensors copied in and out
            self.loop, lines = staging.blocked(
                lines, self.rows, self.rnumel, list(self.staged.values()), self._block_base)
        return lines

    # what RowForm asks of a writer (row_form.py): SIMD loops over the row, row buffers
    def begin_reductions(self, xs: list, header: list, rs: list) -> None:
        """The row's names, its reduced dims read as runs and blocks of lanes, its bound,
        the tensors a row loop may run past the row's end over, its row buffers."""
        em = self.em
        self.row_names = tuple(xs)
        self.r_header = list(header)
        runs = row_blocks.runs("r", self.red_shape)  # trailing dims read as one index
        for run in runs:
            em.inner(run.name)
            self.ix.remember(self.known, [rs[k] for k in run.dims], run.sizes, run.name)
        self.r_header += row_blocks.run_declarations("r", runs)
        em.use_row_blocks(row_blocks.blocked("r", self.red_shape, self.r_header, runs))
        #: the row length: an int, or C text (symbolic)
        self.rbound = self.rnumel if isinstance(self.rnumel, int) else self.ix.size_code(
            self.rnumel)
        em.allow_overrun(row_offsets(self))
        kept, arrays = row_buffers.plan(self, isinstance(self.rnumel, int) and
                                        self.rnumel <= ROW_BUFFER)
        self.buffers.update(kept)
        for array in arrays:
            em.statement(array, False)

    def reduce_row(self) -> None:
        for node in self.reductions:
            self.reduced.update(lower_reduction(self, node))

    def carries_columns(self) -> bool:
        return bool(self.columns)

    def begin_row_loop(self) -> None:
        prefetch_next_row(self)
        self.em.begin_phase()

    def carry(self) -> None:
        rows_and_columns.accumulate(self)

    def end_row_loop(self) -> None:
        self.em.end_row_phase(Simd(), self.rbound, self.r_header)

    def _block_base(self, s: staging.Staged) -> expr.Code:
        """The C offset of staged tensor ``s``'s element at row ``xlo`` and ``r`` = 0."""
        at = dict(zip(self.row_names, self.ix.delinear("xlo", self.kept_shape)))
        coords = tuple(ZERO if is_zero(c) or c == expr.Name("r") else at[c]
                       for c in s.coords)
        return self.ix.address(coords, s.strides, s.shape, {})

    def restaged(self) -> "KernelWriter | None":
        """This nest written again over staged blocks of rows (staging.py), after its
        ``nest()`` found tensors lying across its rows; None where it stages none."""
        found = staging.usable(self.stage_found)
        if self.staged or self.kind != "reduction" or self.loop.var != "x" or \
                self.em.overran or \
                not staging.worth_it(self.rows, self.rnumel, found):
            return None
        return KernelWriter(*self._args, staged={s.pointer: s for s in found})

    def nest(self) -> list:
        """This nest's parallel loop over rows, its body inside; the body's declarations
        that no row changes (an optimizer step's bias corrections from its step count)
        computed once before it, in a block of their own (``stmt.invariant``)."""
        body = stmt.drop_unused(self.body())
        before: list = []
        if not (self.columns or self.em.overran):  # (those loops are rows_and_columns'/overrun's)
            before, body = stmt.invariant(body, self.loop.var, pure)
        arrays = {e.pointer for s in stmt.walk(body) if hasattr(s, "facts")
                  for e in s.facts.elements}
        self.planned = (before, body, len(arrays))
        loop = self._loop(body, -(-2 * PARALLEL_MIN // work(1, len(arrays))))
        return in_block(before, loop)

    def _loop(self, body: list, least: int) -> list:
        """The parallel loop over rows around ``body``, a row's statements, on threads
        from ``least`` elements."""
        trips, var = self.loop.trips, self.loop.var
        rows = expr.paren(self.ix.size_code(trips))
        numel = expr.paren(self.ix.size_code(self.numel))
        # threads when there are rows to share and work to pay for them: decided here for
        # static sizes, at run time for symbolic ones
        conditions = [compare(">", rows, expr.as_node(1))] if not isinstance(trips, int) else []
        if not isinstance(self.numel, int):
            conditions.append(compare(">=", numel, expr.as_node(least)))
        self.parallel = (not isinstance(trips, int) or trips > 1) and (
            not isinstance(self.numel, int) or self.numel >= least)
        head, bound = [], rows
        if self.loop.blocks is not None:  # counted once, before the loop
            bound = f"n_{var}"
            threads = "nthreads" if self.parallel else "1"
            head = [stmt.Declare("int64_t", bound, self.loop.blocks.count(threads))]
        if self.columns:  # each thread's partial column sums (rows_and_columns.py)
            return rows_and_columns.nest(self, head, body, bound)
        if self.em.overran:  # each thread's last row known (overrun.py)
            shared, one = (chunked(bound, body, p) for p in (True, False))
        else:
            one = [stmt.Loop(var, "0", bound, tuple(body))]
            shared = [attrs.evolve(one[0], annotation=Pragma(PARALLEL_FOR))]
            one, shared = row_nest.loops(self, body) or (one, shared)
        head += self.loop.before
        if not conditions:
            return [*head, *(shared if self.parallel else one), *self.loop.after]
        # a branch, not an OpenMP if clause: entering a parallel region that the clause
        # then runs on one thread costs ~0.5 us per call, much of a small kernel's time
        return [*head, stmt.If(every(conditions), tuple(shared), tuple(one)),
                *self.loop.after]

    def dims(self, dim):
        """``dim`` written over the size arguments (``S_0*16``), for the launcher."""
        return dim if isinstance(dim, int) else self._as_dims.size(dim)

    def count(self, dim, dtype: str) -> expr.Literal:
        """A size as a C constant of compute dtype ``dtype`` (row lengths in means)."""
        if isinstance(dim, int):
            return literal(dim, dtype)  # an int: integer sums (prod, sum) also ask for it
        return expr.Literal(f"(({CTYPE[dtype]}){par(self.ix.size_code(dim))})")


#: the C parameter name of each region output (function.py's nests name them alike)
output_names = writer.output_names
