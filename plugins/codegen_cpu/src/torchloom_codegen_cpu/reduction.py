"""Lowering of reduction ops (see ``ops.REDUCTIONS``) onto the kernel writer.

Each reduction is one SIMD loop over the row with an OpenMP reduction clause
(``#pragma omp simd reduction(+:acc)``): lanes accumulate separately and are combined after
the loop, as eager's vectorized reductions do; an f32 sum whose lanes would each add more
than ``F32_SUM_COUNT`` values (a long or symbolic row) accumulates in double instead, as
accurate as eager's cascade sum (the core's ``reductions.sum_dtype``). max/min carry a
NaN flag beside the value (a NaN anywhere in the row is the result, as in eager). ``var``
accumulates in double: in one pass over a row of f32 (or narrower) values of at most
:data:`ONE_PASS_ROW` elements (sums of the deviations from the row's first value, see
:func:`shifted_moments`), else in two (mean, then the sum of squared deviations);
argmax/argmin walk the row in order (ties to the lowest index, NaN counting as the
largest value, as eager does).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from torchloom.api import Node, Value, columns, expr, indexing, reductions, stmt, writer

from torchloom_codegen_cpu.emitter import Expr
from torchloom_codegen_cpu.nest import Coords, Writer
from torchloom_codegen_cpu.render import Simd, compare, ternary
from torchloom_codegen_cpu.ops import (COMPUTE, CTYPE, FLOATS, IDENTITY, INT_LIMITS, ITEMSIZE,
                                       OMP_OP, REDUCTIONS, literal)
from torchloom_codegen_cpu.tensors import Unsupported, tensor_type


reduced_dims = writer.reduced_dims


def identity(kind: str, dtype: str) -> str:
    as_float, as_int = IDENTITY[kind]
    if dtype in FLOATS:
        return as_float
    low, high = INT_LIMITS[dtype]
    return as_int.format(min=low, max=high)


def accumulate(em, kind: str, acc: str | stmt.Element, nan: str | stmt.Element | None,
               v: expr.Code) -> None:
    """The inner statements adding ``v`` to accumulator ``acc`` (a name or an element) with
    ``kind``, and setting the NaN flag ``nan`` (the same, or None) when ``v`` is NaN."""
    if kind in ("sum", "prod"):
        em.statement(stmt.Update(acc, "+=" if kind == "sum" else "*=", v), True)
    else:
        a = expr.Name(acc) if isinstance(acc, str) else expr.Load(acc.pointer, acc.offset)
        em.statement(stmt.Select(acc, expr.Op(f"{{0}} {'>' if kind == 'max' else '<'} {{1}}",
                                              expr.LOWEST, (v, a)), v), True)
    if nan is not None:
        em.statement(stmt.Update(nan, "|=", expr.Op("{0} != {0}", expr.LOWEST, (v,))), True)


def short_odd_row(n: int | str) -> bool:
    """Whether a max/min/prod row of ``n`` values runs as a plain loop, not a SIMD one: gcc
    12 keeps the lanes of a ``reduction(max:)`` (with its NaN flag), ``reduction(*:)`` or an
    integer ``reduction(min:)`` in a stack array when a row is shorter than a vector and
    not 8 values long, and reloads it through a failed store forward every row (amax over
    rows of 4-7 values: 0.43-0.49x eager, logsumexp over rows of 4 to 15 0.29-0.50x, prod
    over rows of 5-7 0.20-0.22x, an int32 amin over rows of 5-15 0.27-0.61x); unrolled by
    gcc as a plain loop it is a few instructions (1.4-4x eager). Sums keep their SIMD loop:
    theirs was not slow."""
    return isinstance(n, int) and n < ROW_LANES and n % 8 != 0


#: rows of at most this many values reduce across rows when a kernel has no full-row output
ACROSS_ROWS = 4


def across_rows(w: Writer, lines: list[str]) -> list[str]:
    """The row body of a kernel whose outputs are all one value per row, over rows of at most
    :data:`ACROSS_ROWS` values: its row loops lose their SIMD pragmas, so that gcc unrolls
    them and vectorizes the loop over the rows instead (per-row statements, a logsumexp's
    ``logf`` among them, then run on whole vectors of rows: logsumexp over rows of 2-4
    0.75-0.95x -> 4.5-6.3x eager). Over rows of 5-15 gcc did not vectorize the rows and
    the plain loops were slower (logsumexp rows of 5-7 0.92 -> 0.67x, 8-14 alike or worse)."""
    if not (isinstance(w.rnumel, int) and w.rnumel <= ACROSS_ROWS):
        return lines
    return stmt.map_loops(lines, lambda loop: attrs.evolve(loop, annotation=None)
                          if isinstance(loop.annotation, Simd) else loop)


def block_reduce(w: Writer, kind: str, value: Callable[[], Expr], dtype: str,
                 inf_flag: str | None = None) -> Expr:
    """Reduce ``value()`` (computed at the full coordinates) over the row with ``kind``;
    ``inf_flag`` names an int set when an infinite value comes before the row's last."""
    em = w.em
    acc = em.fresh(f"acc_{kind}")
    em.statement(stmt.Var(CTYPE[dtype], acc, identity(kind, dtype)), False)
    clauses = [(OMP_OP[kind], (acc,))]
    nan = None
    if kind in ("max", "min") and dtype in FLOATS:
        nan = em.fresh("nan")
        em.statement(stmt.Var("int", nan, "0"), False)
        clauses.append(("|", (nan,)))
    if inf_flag is not None:
        em.statement(stmt.Var("int", inf_flag, "0"), False)
        clauses.append(("|", (inf_flag,)))
    em.begin_phase()
    v = em.convert(value(), dtype).code
    if inf_flag is not None:
        last = w.rnumel - 1 if isinstance(w.rnumel, int) else \
            expr.minus(expr.paren(w.ix.size_code(w.rnumel)), 1)
        em.statement(stmt.Update(inf_flag, "|=", _infinite_before(v, last)), True)
    accumulate(em, kind, acc, nan, v)
    simd = Simd(tuple(clauses))
    em.end_row_phase(None if kind != "sum" and short_odd_row(w.rbound) else simd, w.rbound,
                     w.r_header)
    if nan is not None:
        return em.emit(ternary(expr.Name(nan), expr.Literal(f"({CTYPE[dtype]})NAN"),
                               expr.Name(acc)), dtype, kind, inner=False)
    return Expr(expr.Name(acc), dtype)


#: longest row whose var takes one pass (see shifted_moments for the error bound)
ONE_PASS_ROW = 8192
#: SIMD lanes of a row's f32 sum (AVX-512)
ROW_LANES = 16


def shifted_moments(w: Writer, value: Callable[[], Expr],
                    inf_flag: str | None) -> tuple[Expr, Expr]:
    """(mean, sum of squared deviations from it) of ``value()`` over the row, in double, in
    one pass: with ``d = x - x0`` (``x0`` the row's first value), ``sum d`` and
    ``sum d*d``, then ``mean = x0 + sum d / n`` and ``sum d*d - (sum d)^2 / n``.

    The shift makes the subtraction safe: x0 is one of the values, so ``(mean - x0)^2 <=
    n var``, and the relative error of the result is at most about ``3 (n / 8) (n + 1)
    2^-53`` (eight partial sums per SIMD lane set): below 2^-28 for rows up to
    :data:`ONE_PASS_ROW`, under half an f32 ulp (f64 values keep the two passes, whose
    error is ``n 2^-53``). A result below 0 (rounding, on a row of near-equal values) is
    0. Eager's mean turns NaN once an infinite value comes before the row's last
    (``inf_flag``); sum d is then not finite, and only such rows (or rows holding a NaN)
    are walked again to set the flag: the common row pays no check."""
    em = w.em
    shift = first_value(w, value, "shift")
    total, squares = em.fresh("acc_sum"), em.fresh("acc_sq")
    em.statement(stmt.Var("double", total, "0"), False)
    em.statement(stmt.Var("double", squares, "0"), False)
    em.begin_phase()
    d = em.emit(expr.minus(expr.paren(em.convert(value(), "f64").code), shift), "f64", "dev")
    em.statement(stmt.Update(total, "+=", d.code), True)
    em.statement(stmt.Update(squares, "+=", expr.times(d.code, d.code)), True)
    em.end_row_phase(Simd((("+", (total, squares)),)), w.rbound, w.r_header)
    if inf_flag is not None:
        em.statement(stmt.Var("int", inf_flag, "0"), False)
        em.begin_phase()
        v = em.convert(value(), "f64").code
        em.statement(stmt.Update(inf_flag, "|=", _infinite_before(v, w.rnumel - 1)), True)
        em.end_phase(None, "r", "0", _unless_finite(total, w.rbound), w.r_header)
    n = w.count(w.rnumel, "f64")
    mean = em.emit(expr.plus(shift, expr.over(total, n)), "f64", "mean", inner=False)
    acc = em.emit(expr.minus(squares, expr.times(total, expr.over(total, n))), "f64", "m2",
                  inner=False)
    return mean, em.emit(ternary(compare("<", acc.code, expr.as_node(0)), expr.Literal("0.0"),
                                 acc.code), "f64", "m2", inner=False)


def _isfinite(v: expr.Code | str) -> expr.Code:
    return expr.Op("isfinite({0})", expr.POSTFIX, (expr.as_node(v),))


def _unless_finite(total: expr.Code | str, n) -> expr.Code:
    """``(isfinite(total) ? 0 : n)``: a loop's bound that walks a row (of ``n`` values)
    again only where its sum is not finite."""
    return expr.wrapped(ternary(_isfinite(total), expr.as_node(0), expr.as_node(n)))


def _infinite_before(v: expr.Code, last) -> expr.Code:
    """``(fabs(v) == INFINITY) & (r < last)``: an infinite value before the row's last
    (which turns eager's Welford mean NaN)."""
    return expr.Op("(fabs({0}) == INFINITY) & ({1})", expr.LOWEST,
                   (v, compare("<", expr.Name("r"), expr.as_node(last))))


#: a compiler barrier: gcc may not carry what it loaded or computed across it
MEMORY_BARRIER = '__asm__ volatile("" ::: "memory");'


def first_value(w: Writer, value: Callable[[], Expr], hint: str) -> str:
    """The C name of a double holding the row's first value of ``value()``: the row's
    statements at r = 0, forgotten after (a later loop may be the row's first, which fills
    the row buffers of values later loops read again). A compiler barrier follows: gcc 12
    otherwise carried the first element's value into the row's SIMD loop and, where
    ``value()`` branches (GELU's ``x == INFINITY ? NAN : y``), threaded the loop on it,
    which then ran scalar (BERT's head, GELU then layer_norm over rows of 256: 387 us a
    call against 75 for eager's two ops; with the barrier it vectorizes)."""
    em = w.em
    name = em.fresh(hint)
    em.statement(stmt.Var("double", name, "0"), False)

    def write() -> None:
        em.begin_phase()
        em.statement(stmt.Update(name, "=", em.convert(value(), "f64").code), True)
        em.end_phase(None, "r", "0", "1", w.r_header)
        em.statement(stmt.Raw(MEMORY_BARRIER), False)
    w.aside(write)
    return name


def _past_overflow(w: Writer, value: Callable[[], Expr], total: Expr,
                   mean: Expr) -> tuple[Expr, expr.Code, expr.Code]:
    """(mean, base, center) of a row of f64 values, for rows whose sum overflows
    where their mean does not (a row of 1e308: eager's Welford gives a mean of 1e308 and a
    variance of 0): such a row, and only such (its sum not finite), is walked again as
    differences from its first value x0, each divided by n: ``dbar = sum(x / n - x0 / n)``
    (divided first: ``x - x0`` itself overflows on ``[1e308, -1e308, ...]``, and a -inf
    ``dbar`` made the mean -inf and the variance NaN), mean ``x0 + dbar``, and the squared
    deviations are ``((x - x0) - dbar)^2`` (exactly 0 on a row of equal values; inf where
    ``x - x0`` overflows, so the variance is inf, as eager's). Other rows keep ``(x - 0.0) - sum / n``, the same values as
    ``x - mean``. A row holding inf or NaN gives the same inf or NaN either way."""
    em = w.em
    x0 = first_value(w, value, "first")
    scaled = em.fresh("acc_scaled")
    em.statement(stmt.Var("double", scaled, "0"), False)
    em.begin_phase()
    n = w.count(w.rnumel, "f64")
    em.statement(stmt.Update(scaled, "+=", expr.minus(expr.over(expr.paren(value().code), n),
                                                      expr.over(x0, n))), True)
    em.end_phase(Simd((("+", (scaled,)),)), "r", "0", _unless_finite(total.code, w.rbound),
                 w.r_header)
    finite = _isfinite(total.code)
    base = em.emit(ternary(finite, expr.Literal("0.0"), expr.Name(x0)), "f64", "base",
                   inner=False)
    center = em.emit(ternary(finite, mean.code, expr.Name(scaled)), "f64", "center",
                     inner=False)
    # (x0 itself infinite: its row's mean is sum / n, x0 on a row of one value, as
    # eager's; on longer rows the infinite value before the last turns it NaN)
    mean = em.emit(ternary(finite, mean.code, ternary(_isfinite(x0), expr.plus(x0, scaled),
                                                      mean.code)), "f64", "mean", inner=False)
    return mean, base.code, center.code


def arg_reduce(w: Writer, kind: str, value: Callable[[], Expr],
               dtype: str) -> tuple[Expr, Expr]:
    """The max (``argmax``) or min (``argmin``) along the row and its index (int64)."""
    em = w.em
    best, index = em.fresh(f"{kind}_v"), em.fresh(f"{kind}_i")
    start = identity("max" if kind == "argmax" else "min", dtype)
    em.statement(stmt.Var(CTYPE[dtype], best, start), False)
    em.statement(stmt.Var("int64_t", index, "0"), False)
    em.begin_phase()
    v, held = em.convert(value(), dtype).code, expr.Name(best)
    better = compare(">" if kind == "argmax" else "<", v, held)
    if dtype in FLOATS:  # the first NaN wins and stays
        better = expr.Op("{0} == {0} && ({1} || {2} != {2})", expr.LOWEST, (held, better, v))
    em.statement(stmt.If(better, (stmt.Update(best, "=", v), stmt.Update(index, "=", "r"))),
                 True)
    # in order, no SIMD: ties go to the lowest index
    em.end_phase(None, "r", "0", str(w.rbound), w.r_header)
    return Expr(expr.Name(best), dtype), Expr(expr.Name(index), "i64")


def lower_reduction(w: Writer, node: Node) -> dict[Value, tuple[Coords, Expr]]:
    """Compute ``node``'s outputs once per row: each output -> (the coordinates of its
    row, its value), for the writer to record."""
    spec = REDUCTIONS[node.op]
    em = w.em
    src, full = node.inputs[0], w.row_input(node)
    out_dtype = COMPUTE[tensor_type(node.outputs[0]).dtype]
    acc_dtype = out_dtype if out_dtype in ("f32", "f64") else "f64"

    wide = spec.kind == "sum" and reductions.accumulator(
        "sum", out_dtype, w.rnumel, ROW_LANES) != out_dtype
    if wide:  # (a mean divides the double sum by a double count)
        acc_dtype = "f64"
    fields: dict[str, expr.Code | str] = {"n": w.count(w.rnumel, acc_dtype)}
    if spec.kind in ("sum", "prod", "max", "min"):
        fields["acc"] = block_reduce(w, spec.kind, full, acc_dtype if wide else out_dtype).code
    elif spec.kind in ("any", "all"):  # max / min of the elements as bools (x != 0)
        kind = "max" if spec.kind == "any" else "min"
        fields["acc"] = block_reduce(w, kind, lambda: em.convert(full(), "b8"), "b8").code
    elif spec.kind == "var":  # in double, as eager's var/std (WelfordOps<.., double>)
        fields["n"] = w.count(w.rnumel, "f64")
        inf_flag = em.fresh("inf") if len(node.outputs) > 1 else None
        if (COMPUTE[tensor_type(src).dtype] == "f32" and isinstance(w.rnumel, int)
                and 2 <= w.rnumel <= ONE_PASS_ROW):
            mean, m2 = shifted_moments(w, full, inf_flag)
            fields["acc"] = m2.code
        else:
            total = block_reduce(w, "sum", full, "f64", inf_flag)
            mean = em.emit(expr.over(total.code, fields["n"]), "f64", "mean", inner=False)
            base, center = None, mean.code
            if COMPUTE[tensor_type(src).dtype] == "f64":
                mean, base, center = _past_overflow(w, full, total, mean)

            def squared_deviation() -> Expr:
                d = expr.paren(em.convert(full(), "f64").code)
                d = em.emit(expr.minus(d if base is None else expr.minus(d, base), center),
                            "f64", "dev")
                return em.emit(expr.times(d.code, d.code), "f64", "sq")

            fields["acc"] = block_reduce(w, "sum", squared_deviation, "f64").code
        fields["mean"] = mean.code if inf_flag is None else em.emit(ternary(
            expr.Name(inf_flag), expr.Literal("(double)NAN"), mean.code), "f64", "mean",
            inner=False).code
        correction = writer.var_correction(node)
        if isinstance(w.rnumel, int):
            fields["dof"] = literal(float(max(0, w.rnumel - correction)), "f64")
        else:
            n = expr.paren(w.ix.size_code(w.rnumel))
            fields["dof"] = expr.Op("((double)({0}))", expr.ATOM, (ternary(
                compare(">", n, expr.as_node(correction)), expr.minus(n, correction),
                expr.as_node(0)),))
    else:
        src_dtype = COMPUTE[tensor_type(src).dtype]
        value, index = arg_reduce(w, spec.kind, full, src_dtype)
        fields["acc"] = index.code
        fields["value"] = value.code

    def computed(value: Value) -> str:
        return "f64" if spec.kind == "var" or wide else COMPUTE[tensor_type(value).dtype]

    def spell(value: Value, template: str) -> str:  # libm's suffix: sqrtf, sqrt
        return template.replace("$f", "f" if computed(value) == "f32" else "")

    def result(value: Value, code: expr.Code) -> Expr:
        ir_dtype = tensor_type(value).dtype
        e = em.convert(em.emit(code, computed(value), node.op.split(".")[1], inner=False),
                       COMPUTE[ir_dtype])
        return em.cast(e, ir_dtype) if ir_dtype in ("f16", "bf16") else e

    return reductions.results(node, spec, fields, w.row_of(node), result, spell)


#: rows of at least this many bytes get their successor's first page prefetched
PREFETCH_ROW_BYTES = 4096


def prefetch_next_row(w: Writer) -> None:
    """Before a row's last loop (its earlier loops brought the row into the L1 cache, so
    the last one computes from there), ask for the first 4 KB of the next row of the
    nest's first input into L2 (``prefetcht1``): a row of 4 KB or more starts on another
    page, where the hardware prefetcher stops, so the next row's first loop otherwise
    waits for memory. Softmax rows of 1024 f32: kernel 0.79 -> 0.72-0.76 ms; the
    layer_norm row (two inputs): 1.28 -> 1.19 ms. Prefetching both of that row's inputs
    made it slower (1.34-1.50 ms: RESULTS.md, session 15), so one input only. Static row
    shapes whose reduced dims are the innermost, the input dense in row order."""
    shape, rdims = w.shape, w.rdims
    if not (isinstance(w.rows, int) and w.rows > 1 and isinstance(w.rnumel, int)
            and rdims == tuple(range(len(shape) - len(rdims), len(shape)))):
        return
    for v in w.region.inputs:
        t = tensor_type(v)
        if v not in w.loaded or tuple(t.shape) != shape:
            continue
        size = ITEMSIZE[t.dtype]
        if not t.is_dense or w.rnumel * size < PREFETCH_ROW_BYTES:
            return
        step, count = 64 // size, PREFETCH_ROW_BYTES // size
        w.em.statement(stmt.Raw(
            f"if (x + 1 < {w.rows}) for (int64_t p = 0; p < {count}; p += {step}) "
            f"__builtin_prefetch(&in_{v.name}[(x + 1) * {w.rnumel} + p], 0, 2);"), False)
        return


#: a row-form reduction whose rows step over at least this many elements, over rows at
#: least this long, is declined (see check_row_stride)
STRIDED_ROW = 16
#: ... in a kernel of at least this many elements
STRIDED_NUMEL = 16384


def rows_lie_in_memory_order(w: Writer) -> bool:
    """Whether the group's tensors in the reduction's shape (inputs, and outputs stored
    per element) lie with a reduced dim innermost in memory
    (:func:`torchloom.codegen.columns.rows_lie_in_memory_order`): BERT's ``sum(a.t(), 0)``
    of ``[512, 256]`` strides ``[1, 512]``, where the column form read one element per
    cache line (0.62 ms a call against ~0.02 in the row form)."""
    return columns.rows_lie_in_memory_order(w.reduction_nest, [*w.region.inputs, *w.outputs],
                                            tensor_type)


def check_row_stride(w: Writer) -> None:
    """Decline a row-form kernel whose rows are columns: reduced dims before a kept
    innermost dim of at least ``STRIDED_ROW`` elements, over a long row, in a kernel of
    at least ``STRIDED_NUMEL`` elements. Each row then reads one element per cache line,
    with a scalar loop, and the walks of neighbouring rows read those lines again
    (softmax over dim 0 of 1024 x 1024 f32 took 20 ms against eager's 1.5; over dim 1
    of 32 x 64 x 64, 0.63 against 0.11). The column form (columns.py) walks such rows
    in memory order, and takes dependent reductions (a softmax's max, then its sum)
    only where the kept dims are innermost; eager runs the other such groups."""
    if not w.rdims or not isinstance(w.numel, int) or w.numel < STRIDED_NUMEL or \
            rows_lie_in_memory_order(w):
        return  # (small: every walk is in the L1 cache; or the rows are contiguous)
    inner = indexing.prod(w.shape[max(w.rdims) + 1:])
    if (isinstance(inner, int) and inner >= STRIDED_ROW and isinstance(w.rnumel, int)
            and w.rnumel >= STRIDED_ROW):
        raise Unsupported(
            f"reductions over dims {list(w.rdims)} of {list(w.shape)} read each row "
            f"with a stride of {inner} elements and feed other ops of the group (the "
            f"column form takes them only with the kept dims innermost): eager's kernels "
            f"are faster")
