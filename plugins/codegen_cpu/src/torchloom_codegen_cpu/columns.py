"""The cpu's rendering of the column form the core plans (:mod:`torchloom.codegen.columns`:
which nests take it, which reductions each walk computes, where outputs are stored):
reductions whose kept dims are innermost (a bias gradient ``sum(g, dim=0)``, layer_norm's
weight gradient), or whose one kept dim is innermost in memory (a channels-last batch
norm's gradients, sums over N, H and W), where the row form would read every row with a
stride.

A block of kept elements (columns) is one parallel iteration; it walks the reduced dims in
order and, for each, runs a SIMD loop over its columns, accumulating into one array per
reduction and storing the group's outputs of the full shape on the way::

    for (r = 0; r < R; r++)          // reduced elements, in memory order
      #pragma omp simd
      for (x = c0; x < c1; x++)      // this block's columns: contiguous loads and stores
        acc[x - c0] += value(r, x);

then one SIMD loop over the block stores each reduction's result. The blocks are as wide as
they can be: one per thread (``nthreads`` at the call), split at whole ``UNIT``s of columns,
and at most ``CAP`` columns (the accumulators stay in the L1 cache). On one thread a
``[1024, 2048]`` f32 walk is then one sequential stream per tensor, where 256-column blocks
read 1 KB of every 8 KB row (GELU's backward fused with its bias gradient, one thread: 1.5
against 2.1 ms, and 0.8 against 1.7 ms once its erf is inline). Each column still sums its
rows in order, whatever the blocks (an f32 sum over more than ``F32_SUM_COUNT`` rows in
double: the core's ``reductions.accumulator``). A reduction computed from another's result
comes in a later walk (softmax over dim 0: the max, then the sum of exp(x - max)), each
column's result kept in its block's array for the next walks, and full-shape outputs that
read a result are stored by a last walk. Other groups use the row form.

**Split by rows.** A block of columns reads a slice of every row, whichever thread wrote
that row: on two threads each read half of each row of a tensor its producer (SDPA's
backward, a row kernel) had written half by half, from the other core's cache. So where
the columns are few enough (:data:`SPLIT_COLUMNS`) and the reductions are sums in double
(one walk, no result read in the group), the loop is over the threads' shares of rows
instead: each share walks its rows over all columns into its own partials (``parts``,
allocated before the loop), storing the full-shape outputs on the way, and after the
loop the shares' partials are added in share order (the same order at a given thread
count; on one thread the walk above). ViT's bias gradients of q, k and v (``[394, 256]``
summed over dim 0 right after SDPA's backward): 78 against 25 us a call in the training
step, ~0.8 ms of its 48 (RESULTS.md, session 54).
"""

from __future__ import annotations

from torchloom.api import columns as column_form
from torchloom.api import column_nest, expr, reductions, stmt

from torchloom_codegen_cpu.emitter import Expr
from torchloom_codegen_cpu.nest import ParallelLoop, ThreadBlocks, Writer
from torchloom_codegen_cpu.render import Simd, smaller
from torchloom_codegen_cpu.ops import COMPUTE, CTYPE, FLOATS, REDUCTIONS
from torchloom_codegen_cpu.reduction import accumulate, identity
from torchloom_codegen_cpu.rows_and_columns import partials
from torchloom_codegen_cpu.tensors import tensor_type

#: a column's element in its block's arrays (``x - c0``: ``c0`` the block's first column)
_IN_BLOCK = expr.Op("{0} - {1}", expr.SUM, (expr.Name("x"), expr.Name("c0")))

#: the split by rows: at most this many columns (each share's partials: a double per
#: column and sum) and at least this many reduced elements
SPLIT_COLUMNS = 8192
SPLIT_ROWS = 64
#: columns per unit: blocks are whole units (one AVX-512 vector of f32)
UNIT = 16
#: columns at most per block
CAP = 2048


def column_plan(w: Writer) -> column_form.Columns | None:
    """The group's column form (the core's plan, :func:`torchloom.codegen.columns.plan`;
    see the module docstring), or None where it keeps the row form."""
    return column_form.plan(w.reduction_nest, w.reductions, w.region.inputs, w.outputs,
                            tensor_type, w.output_place)


def column_body(w: Writer, plan: column_form.Columns) -> tuple[ParallelLoop, list]:
    """The loop over blocks of columns ``xb`` and the statements of one block, walking as
    ``plan`` says (the core's :func:`column_nest.walks`), or, split by rows, the loop over
    the threads' shares of rows (:func:`_split_body`)."""
    if split_by_rows(w, plan):
        return _split_body(w)
    em = w.em
    columns = w.rows
    if isinstance(columns, int):
        units = -(-columns // UNIT)
        block = min(CAP, units * UNIT)
    else:
        block, units = CAP, f"CeilDiv({columns}, {UNIT})"
    end, count = expr.paren(w.ix.size_code(columns)), expr.paren(w.ix.size_code(units))
    loop = ParallelLoop("xb", units, ThreadBlocks(units, count, CAP // UNIT))
    em.statement(stmt.Declare("int64_t", "c0", expr.times(
        expr.over(expr.times("xb", count), "n_xb"), UNIT)), False)
    em.statement(stmt.Declare("int64_t", "e1", expr.times(
        expr.over(expr.times(expr.plus("xb", 1), count), "n_xb"), UNIT)), False)
    em.statement(stmt.Declare("int64_t", "c1", smaller(expr.Name("e1"), end)), False)
    column_nest.walks(_Block(w, block), plan, w.reduction_nest,
                      list(zip(w.out_names, w.outputs)))
    return loop, em.lines


def split_by_rows(w: Writer, plan: column_form.Columns) -> bool:
    """Whether the column form is split by rows (module docstring): static sizes, at most
    :data:`SPLIT_COLUMNS` columns, the kept dims innermost (a row's columns contiguous), at
    least :data:`SPLIT_ROWS` reduced elements, one walk, and every reduction a sum
    accumulated in double whose result nothing in the group reads."""
    if not isinstance(w.rows, int) or not isinstance(w.rnumel, int) or \
            w.rows > SPLIT_COLUMNS or w.rnumel < SPLIT_ROWS or \
            w.kept != list(range(len(w.shape) - len(w.kept), len(w.shape))):
        return False
    if len(plan.walks) != 1 or plan.late:
        return False
    return all(REDUCTIONS[node.op].kind == "sum" and not node.outputs[0].uses and
               reductions.sum_dtype(COMPUTE[tensor_type(node.outputs[0]).dtype],
                                    w.rnumel, 1) == "f64" for node in w.reductions)


def _split_body(w: Writer) -> tuple[ParallelLoop, list]:
    """The loop over the threads' shares of rows ``xb``, each adding its rows into its own
    partials (``parts``, a row of ``width`` doubles per share, allocated before the loop)
    and storing the full-shape outputs; after it the shares' partials are added in share
    order and the results stored."""
    em = w.em
    columns, rows = w.rows, w.rnumel
    width = len(w.reductions) * columns
    for name, value in (("c0", "0"), ("c1", str(columns)),
                        ("r0", expr.over(expr.times("xb", rows), "n_xb")),
                        ("r1", expr.over(expr.times(expr.plus("xb", 1), rows), "n_xb"))):
        em.statement(stmt.Declare("int64_t", name, value), False)
    em.statement(stmt.Var("double* restrict", "part",
                          expr.plus("parts", expr.times("xb", width))), False)
    accs = []
    for k, node in enumerate(w.reductions):
        acc = em.fresh("acc_sum")
        em.statement(stmt.Var("double* restrict", acc, expr.plus("part", k * columns)),
                     False)
        accs.append(column_nest.Accumulator(node, "sum", "f64", acc))
    target, nest = _Block(w, columns), w.reduction_nest
    x_header, xs = target.inner_coords("x", nest.kept_shape)
    outputs = list(zip(w.out_names, w.outputs))
    column_nest.walk(target, nest, accs, column_nest.column_of(nest, xs), x_header,
                     column_nest.stored_per_element(target, set(w.reductions), outputs),
                     ("r0", "r1"))

    def combine() -> None:
        em.forget_values()
        x = expr.Name("x")
        later = expr.Load("parts", expr.plus(expr.times("t", width), x))
        em.statement(stmt.Loop("t", "1", "n_xb", (stmt.Loop("x", "0", str(width), (
            stmt.Update(stmt.Element("parts", x), "+=", later),), annotation=Simd()),)),
            False)
        em.statement(stmt.Declare("int64_t", "c0", "0"), False)
        em.statement(stmt.Declare("int64_t", "c1", str(columns)), False)
        for k, acc in enumerate(accs):
            em.statement(stmt.Var("double* restrict", acc.array,
                                  expr.plus("parts", k * columns)), False)
        column_nest.results(target, nest, accs, xs, x_header, outputs, set(w.reductions))

    after = (stmt.Block(tuple(em.capture(combine))), stmt.Raw("free(parts);"))
    loop = ParallelLoop("xb", rows, ThreadBlocks(rows, expr.as_node(rows), rows),
                        before=(partials("parts", "n_xb", width),), after=after)
    return loop, em.lines


class _Block:
    """The cpu's column walks (the core's :class:`column_nest.ColumnTarget`): a block's
    columns ``x`` in ``[c0, c1)`` under SIMD loops, each accumulator an array of the
    block's ``block`` columns (a column at ``x - c0``), a max/min's NaN flags beside it;
    what it writes goes to the writer ``w``'s emitter."""

    def __init__(self, w: Writer, block):
        self.w, self.em, self.block = w, w.em, block
        self.ix, self.known = w.ix, w.known
        self.output_place, self.element_coords = w.output_place, w.element_coords
        self.store, self.set_result = w.store, w.set_result

    def inner_coords(self, index: str, shape) -> tuple[list, list]:
        return self.w.inner_coords(index, shape)

    def reduced_coords(self, index: str, shape) -> list:
        return self.w.reduced_coords(index, shape)

    def accumulators(self, nodes) -> list[column_nest.Accumulator]:
        em, accs = self.em, []
        for node in nodes:
            kind = REDUCTIONS[node.op].kind
            # a long f32 sum in double, as the core's lowering (reductions.accumulator)
            dtype = reductions.accumulator(kind, COMPUTE[tensor_type(node.outputs[0]).dtype],
                                           self.w.rnumel)
            acc = em.fresh(f"acc_{kind}")
            em.statement(stmt.Array(CTYPE[dtype], acc, str(self.block)), False)
            em.statement(_fill(acc, identity(kind, dtype)), False)
            nan = None
            if kind in ("max", "min") and dtype in FLOATS:
                nan = em.fresh("nan")
                em.statement(stmt.Array("int", nan, str(self.block)), False)
                em.statement(_fill(nan, "0"), False)
            accs.append(column_nest.Accumulator(node, kind, dtype, acc, nan))
        return accs

    def over_reduced(self, write, rows: tuple[str, str] | None) -> None:
        walk = self.w.walk(write)
        first, end = rows or ("0", str(self.ix.size(self.w.rnumel)))
        self.em.statement(stmt.Loop("r", first, end, tuple(walk)), False)

    def begin_columns(self) -> None:
        self.em.begin_phase()

    def end_columns(self, header: list) -> None:
        self.em.end_phase(Simd(), "x", "c0", "c1", header)

    def fold(self, acc: column_nest.Accumulator, full) -> None:
        v = self.em.convert(self.w.value_at(acc.node.inputs[0], full), acc.dtype).code
        accumulate(self.em, acc.kind, stmt.Element(acc.array, _IN_BLOCK),
                   acc.nan and stmt.Element(acc.nan, _IN_BLOCK), v)

    def result(self, acc: column_nest.Accumulator) -> Expr:
        em, dtype = self.em, acc.dtype
        (value,) = acc.node.outputs
        ir_dtype = tensor_type(value).dtype
        text: expr.Code = expr.Load(acc.array, _IN_BLOCK)
        if acc.nan is not None:
            text = expr.Op(f"({{0}} ? ({CTYPE[dtype]})NAN : {{1}})", expr.ATOM,
                           (expr.Load(acc.nan, _IN_BLOCK), text))
        template = REDUCTIONS[acc.node.op].outputs[0]
        code = expr.fill(template, {"acc": text, "n": self.w.count(self.w.rnumel, dtype)})
        e = em.convert(em.emit(code, dtype, acc.kind, inner=True), COMPUTE[ir_dtype])
        if ir_dtype in ("f16", "bf16"):
            e = em.cast(e, ir_dtype)
        if value.uses:  # read by a later walk: the block's array (its accumulator)
            em.statement(stmt.Store(stmt.Element(acc.array, _IN_BLOCK), e.code), True)
            element = expr.Load(acc.array, _IN_BLOCK)
            e = Expr(element if e.dtype == dtype else
                     expr.Op(f"({CTYPE[e.dtype]}){{0}}", expr.LOWEST, (element,)), e.dtype, True)
        return Expr(e.code, e.dtype, True)


def _fill(array: str, value: str) -> stmt.Loop:
    """The loop setting a block's ``c1 - c0`` accumulators to ``value``."""
    x = expr.Name("x")
    return stmt.Loop("x", "0", "c1 - c0", (stmt.Store(stmt.Element(array, x), value),))
