"""A row's sums with their lanes combined as a tree (``Emitter.end_row_phase``).

gcc 12 compiles ``#pragma omp simd reduction(+:acc)`` as a private copy of ``acc`` per
lane (an "omp simd array") and, after the loop, adds the lanes to ``acc`` one after the
other: without ``-fassociative-math`` (which the kernels do not take: it would reorder
every sum) that combine is a serial chain of 16 dependent adds, about 64 cycles a row for
each accumulator. On a short row it is most of the row's time: the row's later statements
(a layer norm's mean, its rsqrt, the normalized row) wait for it, and the next rows' loads
cannot hide it.

A static row of whole vectors whose SIMD loop only adds (``+``, and ``|`` for flags) runs
here as blocks of ``lanes`` elements into an explicit array of lanes, then combines the
lanes in halves (8 + 8, 4 + 4, 2 + 2, 1 + 1: four vector adds), then adds lane 0 to the
accumulator. Each lane still adds the same elements as gcc's lane copies did, in the same
order; only the combine's order differs (a tree instead of a chain, as eager's
``vec_reduce_all`` and Inductor's combine). C harness, one thread, layer norm over rows
of 256 (1024 rows): 66.9 -> 56.8 us; over rows of 32 (6272 rows): 104 -> 92 us.

::

    double acc_sum5_lanes[16];
    for (int64_t rl = 0; rl < 16; rl++) acc_sum5_lanes[rl] = 0;
    for (int64_t rb = 0; rb < 16; rb++) {
      #pragma omp simd
      for (int64_t rl = 0; rl < 16; rl++) {
        const int64_t r = rb * 16 + rl;
        ...
        acc_sum5_lanes[rl] += dev9;
      }
    }
    for (int64_t rl = 0; rl < 8; rl++) acc_sum5_lanes[rl] += acc_sum5_lanes[rl + 8];
    ...
    acc_sum5 += acc_sum5_lanes[0];
"""

from __future__ import annotations

from collections.abc import Callable

from torchloom.api import expr, stmt

from torchloom_codegen_cpu.render import Simd

#: reduction operators of a SIMD pragma this form takes -> their update
UPDATES = {"+": "+=", "|": "|="}
#: statements a row loop's body may hold here (no nested loop or branch)
_FLAT = (stmt.Declare, stmt.Store, stmt.Update, stmt.Select)


def lane_loop(pragma: Simd | None, n: int | str, header: list, body: list,
              ctype_of: Callable[[str], str | None], lanes: int) -> list | None:
    """The statements of a row loop over ``r`` in ``[0, n)`` (``header``: the coordinates
    each iteration starts with, ``body``: its statements) with its lanes combined as a tree,
    or None where this form does not apply: a symbolic row, a row that is not whole blocks
    of ``lanes``, a pragma that reduces with another operator than ``+`` or ``|`` (or
    none), a body with nested statements or updating a name its pragma does not reduce,
    an accumulator whose declaration ``ctype_of`` does not know."""
    if pragma is None or not pragma.reductions or not isinstance(n, int) \
            or n < lanes or n % lanes:
        return None
    op_of = {name: op for op, names in pragma.reductions for name in names}
    if any(op not in UPDATES for op in op_of.values()):
        return None
    if not all(isinstance(s, _FLAT) for s in body):
        return None
    updated = {s.target for s in body if isinstance(s, (stmt.Update, stmt.Select))}
    if any(not isinstance(t, str) or t not in op_of for t in updated):
        return None
    if any(s.op != UPDATES[op_of[s.target]] or s.mask is not None
           for s in body if isinstance(s, stmt.Update)):
        return None
    if any(isinstance(s, stmt.Select) for s in body):
        return None
    ctypes = {name: ctype_of(name) for name in op_of}
    if None in ctypes.values():
        return None
    arrays = {name: f"{name}_lanes" for name in op_of}
    rl = expr.Name("rl")
    lines: list = []
    for name, array in arrays.items():
        lines.append(stmt.Array(ctypes[name], array, expr.Literal(str(lanes), lanes)))
        lines.append(stmt.Loop("rl", "0", str(lanes),
                               (stmt.Update(stmt.Element(array, rl), "=", "0"),)))
    inner = [stmt.Update(stmt.Element(arrays[s.target], rl), s.op, s.value)
             if isinstance(s, stmt.Update) else s for s in body]
    r = stmt.Declare("int64_t", "r", expr.plus(expr.times("rb", lanes), rl))
    lines.append(stmt.Loop("rb", "0", str(n // lanes), (
        stmt.Loop("rl", "0", str(lanes), tuple(inner), (r, *header), Simd()),)))
    half = lanes // 2
    while half:
        lines += [stmt.Loop("rl", "0", str(half), (stmt.Update(
            stmt.Element(array, rl), UPDATES[op_of[name]],
            expr.Load(array, expr.plus(rl, half))),), annotation=Simd())
            for name, array in arrays.items()]
        half //= 2
    lines += [stmt.Update(name, UPDATES[op_of[name]], expr.Load(array, expr.as_node(0)))
              for name, array in arrays.items()]
    return lines
