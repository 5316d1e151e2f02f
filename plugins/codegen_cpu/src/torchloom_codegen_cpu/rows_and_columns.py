"""Column sums carried by the row nest (layer_norm's backward: the weight and bias gradients).

A group whose reductions are row reductions (the innermost dims of P) and sums over the
other dims of the same P (columns) is otherwise two nests: the rows (the input gradient),
then the columns, which read the same tensors from memory again. Eager's layer_norm
backward reads them once, each thread adding its rows into a buffer of column partials;
the column nest made the backward 0.71x eager's (2048 x 1024 f32, one thread: 1.69 against
1.19 ms; RESULTS.md, session 19). Here the row nest does the same: each thread adds the
column sums' operands of its rows into its own row of ``colparts`` (double, as the column
form accumulates), in the loop that stores the row's outputs, and after the parallel loop
the threads' partials are added in thread order (the same order at a given thread count;
on one thread exactly the column form's order, so the same values).

Taken where: two reduction classes over one static P, the rows' reduced dims innermost and
the columns' the others; the column reductions are plain f32/f64 sums whose results are
outputs read by nothing else in the group, and nothing the rows compute reads them; rows
of a whole number of 16-lane vectors, :data:`MIN_ROW` to :data:`MAX_ROW` values (each
thread's partials: ``MAX_ROW`` doubles per sum).
"""

from __future__ import annotations

from typing import Any

from torchloom.api import Node, Value, expr, nests, schedule, stmt

from torchloom_codegen_cpu.nest import Writer
from torchloom_codegen_cpu.ops import CTYPE, COMPUTE
from torchloom_codegen_cpu.overrun import chunked
from torchloom_codegen_cpu.render import Simd
from torchloom_codegen_cpu.tensors import tensor_type

#: the shortest row that carries column sums (shorter rows keep the column nest)
MIN_ROW = 256
#: the longest: a thread's partials are MAX_ROW doubles per column sum
MAX_ROW = 8192


def foldable(classes: list[list[Node]], parts: list[list[tuple[str, Value]]],
             depends: Any) -> tuple[int, int] | None:
    """(row class, column class) when the column class can ride in the row nest (see the
    module docstring; the core's :func:`nests.carried_columns` with the cpu's conditions),
    else None. ``depends(v)``: the classes value ``v`` depends on."""
    return nests.carried_columns(classes, parts, depends, lambda v: tensor_type(v).shape,
                                 _accepts, _fits)


def _accepts(plan: schedule.RowsAndColumns) -> bool:
    """Static rows innermost of a whole number of 16-lane vectors, MIN_ROW to MAX_ROW."""
    if not plan.trailing or not all(isinstance(d, int) for d in plan.shape):
        return False
    n = plan.row_nest.rnumel
    return not n % 16 and MIN_ROW <= n <= MAX_ROW


def _fits(node: Node) -> bool:
    """A dense f32/f64 sum of its input's dtype (added in double partials)."""
    (v,) = node.outputs
    return tensor_type(v).is_dense and \
        tensor_type(node.inputs[0]).dtype in ("f32", "f64") and \
        tensor_type(v).dtype == tensor_type(node.inputs[0]).dtype


def accumulate(w: Writer) -> None:
    """In the row's epilogue loop (an open phase at ``r``): add each column sum's operand at
    ``(x, r)`` into this thread's partials."""
    n = w.rnumel
    for k, (_, node) in enumerate(w.columns):
        e = w.value_at(node.inputs[0], w.full)
        w.em.statement(stmt.Update(stmt.Element("colpart", expr.plus(k * n, "r")), "+=",
                                   _double(e.code)), True)


def _double(e: expr.Code) -> expr.Code:
    """``(double)e``: a column sum's operand, added in double."""
    return expr.Op("(double){0}", expr.LOWEST, (expr.paren(e, expr.POSTFIX),))


def partials(name: str, shares: str, width: int) -> stmt.Var:
    """``double* restrict name``: ``shares`` rows of ``width`` zeroed doubles (each thread's
    partial column sums; the column form split by rows takes it too), freed by the caller
    after the loop."""
    return stmt.Var("double* restrict", name, expr.Op(
        "(double*)calloc((size_t){0} * {1}, sizeof(double))", expr.LOWEST,
        (expr.as_node(shares), expr.as_node(width))))


def nest(w: Writer, head: list, body: list, rows: str) -> list:
    """The row loop (or the loop over staged blocks of rows) with each thread's share
    explicit (overrun.chunked) and its column partials, then the partials' sums stored to
    the column outputs."""
    n, count = w.rnumel, len(w.columns)
    width = count * n
    threads = "nthreads" if w.parallel else "1"
    statements = [*head, partials("colparts", threads, width)]
    # (tl_thread() is 0 outside a parallel region: one thread's partials are the first)
    own = stmt.Var("double* restrict", "colpart", expr.plus("colparts", expr.times(
        expr.Op("tl_thread()", expr.POSTFIX), width)))
    statements += chunked(rows, body, w.parallel, (own,),
                          w.loop.var)  # (rows, or staged blocks of rows: staging.py)
    for k, (name, node) in enumerate(w.columns):
        ctype = CTYPE[COMPUTE[tensor_type(node.outputs[0]).dtype]]
        partial = expr.Load("colparts", expr.plus(expr.plus(expr.times("t", width), k * n),
                                                  "c"))
        statements.append(stmt.Loop("c", "0", str(n), (
            stmt.Var("double", "s", "0"),
            stmt.Loop("t", "0", threads, (stmt.Update("s", "+=", partial),)),
            stmt.Store(stmt.Element(name, expr.Name("c")),
                       expr.Op(f"({ctype}){{0}}", expr.LOWEST, (expr.Name("s"),)))),
            annotation=Simd()))
    return [*statements, stmt.Raw("free(colparts);")]
