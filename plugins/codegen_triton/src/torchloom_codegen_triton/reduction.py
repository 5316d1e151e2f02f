"""Lowering of reduction ops (see ``ops.REDUCTIONS``) onto the kernel writer.

Persistent form: the row is in registers; masked lanes take the reduction's identity and
``tl.sum`` / ``tl.reduce`` combine the block. Looped form: an accumulator of
``[XBLOCK, RBLOCK]`` lanes is combined across chunks inside a phase loop, then reduced
across lanes after it. ``var`` is two passes (mean, then the sum of squared deviations),
never the cancellation-prone sum of squares; argmax/argmin carry (value, index) pairs and
break ties towards the lowest index, NaN counting as the largest value (as eager does).
"""

from __future__ import annotations

from collections.abc import Callable

from torchloom.api import Node, Value, expr, reductions, stmt, writer

from torchloom_codegen_triton import lanes
from torchloom_codegen_triton.emitter import Expr
from torchloom_codegen_triton.ops import (COMPUTE, FLOATS, IDENTITY, INT_LIMITS,
                                          REDUCE_HELPERS, REDUCTIONS, REDUCTIONS_F64, STORAGE,
                                          combined, literal, reduced_block)
from torchloom_codegen_triton.protocol import Writer
from torchloom_codegen_triton.tensors import tensor_type



reduced_dims = writer.reduced_dims


def identity_of(kind: str, dtype: str) -> str:
    """The identity of a ``kind`` reduction over values of compute dtype ``dtype``."""
    if dtype in FLOATS:
        return IDENTITY[kind]
    if kind == "sum":
        return "0"
    smallest, largest = INT_LIMITS.get(dtype, INT_LIMITS["i64"])
    return {"max": smallest, "min": largest}[kind]


def block_reduce(w: Writer, kind: str, value: Callable[[], Expr], dtype: str) -> Expr:
    """Reduce ``value()`` (computed at the full coordinates) over the row with ``kind``."""
    em = w.em
    em.use(*REDUCE_HELPERS[kind])
    identity = identity_of(kind, dtype)
    if not w.looped:
        v = em.convert(value(), dtype)
        masked = em.emit(lanes.where("rmask", v.code, lanes.constant(identity)), dtype, "m",
                         rdep=True)
        total = em.emit(reduced_block(kind, masked.code, 1), dtype, kind, rdep=False)
        if kind == "sum" and dtype in FLOATS:
            # eager's sum starts from +0.0, so a row of -0.0 sums to +0.0 (the looped form's
            # accumulator does the same); a block without padding lanes would keep -0.0
            total = em.emit(lanes.plus(total.code, lanes.constant("0.0")), dtype, kind,
                            rdep=False)
        return total
    acc = em.fresh(f"acc_{kind}")
    em.begin_phase(w.ix.size(w.rnumel), w.r_header)
    em.statement(stmt.Assign(acc, lanes.full(["XBLOCK", "RBLOCK"], lanes.constant(identity),
                                             STORAGE[dtype])), False)
    v = em.convert(value(), dtype)
    masked = em.emit(lanes.where("rmask", v.code, lanes.constant(identity)), dtype, "m",
                     rdep=True)
    em.statement(stmt.Assign(acc, combined(kind, acc, masked.code)), True)
    em.end_phase()
    return em.emit(reduced_block(kind, acc, 1), dtype, kind, rdep=False)


def arg_reduce(w: Writer, kind: str, value: Callable[[], Expr],
               dtype: str) -> tuple[Expr, Expr]:
    """The max (``argmax``) or min (``argmin``) along the row and its index (int32)."""
    em = w.em
    identity = identity_of("max" if kind == "argmax" else "min", dtype)
    combine = f"_{kind}_combine"
    em.use(combine)
    val, ind = em.fresh(f"{kind}_v"), em.fresh(f"{kind}_i")
    if w.looped:
        acc_v, acc_i = em.fresh("acc_v"), em.fresh("acc_i")
        em.begin_phase(w.ix.size(w.rnumel), w.r_header)
        em.statement(stmt.Assign(acc_v, lanes.full(["XBLOCK", "RBLOCK"],
                                                   lanes.constant(identity), STORAGE[dtype])),
                     False)
        em.statement(stmt.Assign(acc_i, lanes.full(["XBLOCK", "RBLOCK"], 2147483647,
                                                   "tl.int32")), False)
    v = em.convert(value(), dtype)
    masked = em.emit(lanes.where("rmask", v.code, lanes.constant(identity)), dtype, "m",
                     rdep=True)
    index_code = lanes.plus("rindex", lanes.full(["XBLOCK", "RBLOCK"], 0, "tl.int32"))
    if not isinstance(w.rnumel, int):  # (rindex is int64 over a symbolic row: the index
        # the looped accumulator carries must stay int32, as it starts)
        index_code = expr.Op("({0}).to(tl.int32)", expr.POSTFIX, (index_code,))
    index = em.emit(index_code, "i32", "idx", rdep=True)
    if w.looped:
        em.statement(stmt.Unpack((acc_v, acc_i), lanes.call(combine, acc_v, acc_i, masked.code,
                                                            index.code)), True)
        em.end_phase()
        pair = (acc_v, acc_i)
    else:
        pair = (masked.code, index.code)
    em.statement(stmt.Unpack((val, ind), lanes.reduce_tuple(pair, 1, combine)), False)
    return Expr(expr.Name(val), dtype), Expr(expr.Name(ind), "i32")


def lower_reduction(w: Writer, node: Node) -> None:
    """Compute ``node``'s outputs once per row; the writer records them (``w.record``)."""
    spec = REDUCTIONS[node.op]
    em = w.em
    src, full = node.inputs[0], w.row_input(node)
    out_dtype = COMPUTE[tensor_type(node.outputs[0]).dtype]

    fields: dict[str, expr.Code | str] = {"n": row_count(w)}
    if spec.kind in ("sum", "max", "min"):
        fields["acc"] = block_reduce(w, spec.kind, full, out_dtype).code
    elif spec.kind == "var":
        total = block_reduce(w, "sum", full, out_dtype)
        mean = em.emit(lanes.over(total.code, fields["n"]), out_dtype, "mean", rdep=False)

        def squared_deviation() -> Expr:
            x = expr.paren(em.convert(full(), out_dtype).code)
            d = em.emit(lanes.minus(x, mean.code), out_dtype, "dev")
            return em.emit(lanes.times(d.code, d.code), out_dtype, "sq")

        fields["acc"] = block_reduce(w, "sum", squared_deviation, out_dtype).code
        fields["mean"] = mean.code
        fields["dof"] = var_dof(w, node)
    else:
        src_dtype = COMPUTE[tensor_type(src).dtype]
        value, index = arg_reduce(w, spec.kind, full, src_dtype)
        fields["acc"] = em.convert(index, "i64").code
        fields["value"] = value.code
    w.record(reduction_outputs(w, node, fields))


def row_count(w: Writer) -> expr.Code:
    """The row length as an f32 value: a literal, or computed from the size arguments."""
    if isinstance(w.rnumel, int):
        return literal(float(w.rnumel))
    return w.em.emit(lanes.cast(w.ix.size_code(w.rnumel), "tl.float32"), "f32", "rn",
                     rdep=False).code


def var_dof(w: Writer, node: Node) -> expr.Code:
    """``n - correction`` of a var/std reduction (never below 0)."""
    correction = writer.var_correction(node)
    if not isinstance(w.rnumel, int):
        less = lanes.minus(row_count(w), literal(float(correction)))
        return w.em.emit(lanes.call("tl.maximum", less, lanes.constant("0.0")), "f32", "dof",
                         rdep=False).code
    return literal(float(max(0, w.rnumel - correction)))


def reduction_outputs(w: Writer, node: Node, fields: dict[str, expr.Code | str]
                      ) -> dict[Value, tuple[tuple[str, ...], Expr]]:
    """``node``'s outputs from its template over ``fields`` (names and literals as nodes):
    output -> (the coordinates of its row, its value), for the writer to record."""
    em = w.em

    def result(value: Value, code: expr.Code) -> Expr:
        e = em.emit(code, COMPUTE[tensor_type(value).dtype], node.op.split(".")[1], rdep=False)
        if tensor_type(value).dtype in ("f16", "bf16"):
            e = em.cast(e, tensor_type(value).dtype)
        return e

    def spell(value: Value, template: str) -> str:  # (f64: its own square root)
        if COMPUTE[tensor_type(value).dtype] != "f64":
            return template
        return REDUCTIONS_F64[node.op].outputs[node.outputs.index(value)]

    return reductions.results(node, REDUCTIONS[node.op], fields, w.row_of(node), result,
                              spell)
