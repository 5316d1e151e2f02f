"""The looped form's passes: reductions of one dependency level share one loop.

A looped kernel reads its row in chunks once per *pass* (``for roff in range(...)``).
Reductions that do not read each other's results accumulate in the same pass, so a row is
read once for all of them and the math before them is computed once per element per pass:

- sums, maxima and minima keep ``[XBLOCK, RBLOCK]`` accumulators, combined across lanes
  after the loop;
- ``var`` (and ``std``, ``var_mean``) is Welford's: per-lane running mean, sum of squared
  deviations and count, merged across lanes with Chan's formula (``_welford_combine``),
  instead of a pass for the mean and another for the deviations;
- the softmax pattern ``m = amax(a); s = sum(exp(a - m))`` is online: the sum is rescaled
  whenever the running maximum grows, so both come from one pass instead of two.

A softmax or a layer norm thus reads its input twice (statistics, then the output pass);
argmax/argmin keep a pass of their own.
"""

from __future__ import annotations


from torchloom.api import Node, expr, row_forms, stmt

from torchloom_codegen_triton import lanes
from torchloom_codegen_triton.emitter import Expr
from torchloom_codegen_triton.ops import (COMPUTE, REDUCE_HELPERS, REDUCTIONS, STORAGE,
                                          combined, reduced_block)
from torchloom_codegen_triton.protocol import Writer
from torchloom_codegen_triton.reduction import (identity_of, lower_reduction,
                                                reduction_outputs, row_count, var_dof)
from torchloom_codegen_triton.tensors import tensor_type


_NEG_INF = 'float("-inf")'


def lower_looped(w: Writer, reductions: list[Node]) -> None:
    """Lower ``reductions`` (looped form) pass by pass, as the core plans them
    (``row_forms.passes``; softmax's sum online beside its maximum where both are f32)."""
    for p in row_forms.passes(reductions, lambda n: REDUCTIONS[n.op].kind, _f32_pair):
        _one_pass(w, list(p.reductions), dict(p.online))


def _f32_pair(m: Node, s: Node) -> bool:
    """Whether the online pair (max ``m``, sum ``s``) computes in f32 (its helpers' type)."""
    return all(tensor_type(v).dtype == "f32" for v in (m.inputs[0], m.outputs[0], s.outputs[0]))


def _one_pass(w: Writer, nodes: list[Node], online: dict[Node, Node]) -> None:
    """One loop over the row accumulating every reduction of ``nodes`` and ``online``."""
    em = w.em
    plain = [n for n in nodes if REDUCTIONS[n.op].kind in ("sum", "max", "min", "var")
             and n not in online]
    for n in nodes:  # argmax/argmin: a pass of their own
        if n not in plain and n not in online:
            lower_reduction(w, n)
    if not plain and not online:
        return
    em.begin_phase(w.ix.size(w.rnumel), w.r_header)
    finals = []
    for n in plain:
        kind = REDUCTIONS[n.op].kind
        dtype = COMPUTE[tensor_type(n.outputs[0]).dtype]
        value = em.convert(w.value_at(n.inputs[0], w.full), dtype)
        if kind == "var":
            finals.append((n, _welford(w, value, dtype)))
        else:
            finals.append((n, _accumulate(w, kind, value, dtype)))
    for m, s in online.items():
        finals.append((m, _online(w, em.convert(w.value_at(m.inputs[0], w.full), "f32"), s)))
    em.end_phase()
    for n, finish in finals:
        finish(n)


def _accumulate(w: Writer, kind: str, value: Expr, dtype: str):
    em = w.em
    em.use(*REDUCE_HELPERS[kind])
    identity = identity_of(kind, dtype)
    acc = em.fresh(f"acc_{kind}")
    em.statement(stmt.Assign(acc, lanes.full(["XBLOCK", "RBLOCK"], lanes.constant(identity),
                                             STORAGE[dtype])), False)
    masked = em.emit(lanes.where("rmask", value.code, lanes.constant(identity)), dtype, "m",
                     rdep=True)
    em.statement(stmt.Assign(acc, combined(kind, acc, masked.code)), True)

    def finish(n: Node) -> None:
        total = em.emit(reduced_block(kind, acc, 1), dtype, kind, rdep=False)
        w.record(reduction_outputs(w, n, {"acc": total.code, "n": row_count(w)}))
    return finish


def _welford(w: Writer, value: Expr, dtype: str):
    em = w.em
    em.use("_welford_combine")
    mean, m2, count = em.fresh("wmean"), em.fresh("wm2"), em.fresh("wn")
    st = STORAGE[dtype]
    for acc in (mean, m2, count):
        em.statement(stmt.Assign(acc, lanes.full(["XBLOCK", "RBLOCK"], lanes.constant("0.0"),
                                                 st)), False)
    x, one = expr.paren(value.code), lanes.constant("1.0")
    em.statement(stmt.Assign(count, lanes.plus(count, lanes.where("rmask", one,
                                                                  lanes.constant("0.0")))),
                 True)
    delta = em.emit(lanes.minus(x, mean), dtype, "wd", rdep=True)
    step = lanes.over(delta.code, lanes.where("rmask", count, one))
    em.statement(stmt.Assign(mean, lanes.where("rmask", lanes.plus(mean, step), mean)), True)
    spread = lanes.times(delta.code, lanes.minus(x, mean))
    em.statement(stmt.Assign(m2, lanes.where("rmask", lanes.plus(m2, spread), m2)), True)

    def finish(n: Node) -> None:
        mean_r, m2_r, n_r = em.fresh("mean"), em.fresh("m2"), em.fresh("cnt")
        em.statement(stmt.Unpack((mean_r, m2_r, n_r), lanes.reduce_tuple(
            (mean, m2, count), 1, "_welford_combine")), False)
        w.record(reduction_outputs(w, n, {"acc": expr.Name(m2_r), "mean": expr.Name(mean_r),
                                          "dof": var_dof(w, n), "n": row_count(w)}))
    return finish


def _online(w: Writer, value: Expr, s: Node):
    """Running max and rescaled sum of exp(a - max) (see the module docstring)."""
    em = w.em
    em.use("_maximum", *REDUCE_HELPERS["sum"])  # the running max, the sum across lanes
    m_acc, s_acc = em.fresh("omax"), em.fresh("osum")
    neg_inf = lanes.constant(_NEG_INF)
    em.statement(stmt.Assign(m_acc, lanes.full(["XBLOCK", "RBLOCK"], neg_inf, "tl.float32")),
                 False)
    em.statement(stmt.Assign(s_acc, lanes.full(["XBLOCK", "RBLOCK"], lanes.constant("0.0"),
                                               "tl.float32")), False)
    a = em.emit(lanes.where("rmask", value.code, neg_inf), "f32", "oa", rdep=True)
    new = em.emit(lanes.call("_maximum", m_acc, a.code), "f32", "onew", rdep=True)
    # a lane whose max does not move keeps its sum; -inf - -inf would be NaN
    kept = lanes.where(lanes.equal(m_acc, new.code), lanes.constant("1.0"),
                       lanes.call("tl.exp", lanes.minus(m_acc, new.code)))
    added = lanes.where(lanes.equal(a.code, neg_inf), lanes.constant("0.0"),
                        lanes.call("tl.exp", lanes.minus(a.code, new.code)))
    em.statement(stmt.Assign(s_acc, lanes.plus(lanes.times(s_acc, kept), added)), True)
    em.statement(stmt.Assign(m_acc, new.code), True)

    def finish(m: Node) -> None:
        big = em.emit(reduced_block("max", m_acc, 1), "f32", "max",
                      rdep=False)
        rescaled = lanes.times(s_acc, lanes.call("tl.exp", lanes.minus(m_acc, big.code)))
        scaled = em.emit(lanes.where(lanes.equal(m_acc, big.code), s_acc, rescaled), "f32",
                         "oscaled", rdep=False)
        total = em.emit(reduced_block("sum", scaled.code, 1), "f32", "sum",
                        rdep=False)
        # eager: a row of -inf sums exp(-inf - -inf) = NaN
        total = em.emit(lanes.where(lanes.equal(big.code, neg_inf),
                                    lanes.constant('float("nan")'), total.code),
                        "f32", "sum", rdep=False)
        n = row_count(w)
        w.record(reduction_outputs(w, m, {"acc": big.code, "n": n}))
        w.record(reduction_outputs(w, s, {"acc": total.code, "n": n}))
    return finish
