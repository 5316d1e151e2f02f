"""A row's sums, maxes and mins with their lanes combined as a tree
(``row_loops.shaped``).

gcc 12 compiles ``#pragma omp simd reduction(+:acc)`` as a private copy of ``acc`` per
lane (an "omp simd array") and, after the loop, adds the lanes to ``acc`` one after the
other: without ``-fassociative-math`` (which the kernels do not take: it would reorder
every sum) that combine is a serial chain of 16 dependent adds, about 64 cycles a row for
each accumulator; ``reduction(max:)`` and ``reduction(min:)`` the same with selects. On a
short row it is most of the row's time: the row's later statements (a layer norm's mean,
its rsqrt, the normalized row) wait for it, and the next rows' loads cannot hide it.

A static row of whole vectors whose SIMD loop only adds (``+``, and ``|`` for flags) or
takes a max or min runs here as blocks of ``lanes`` elements into an explicit array of
lanes, then combines the lanes in halves (8 + 8, 4 + 4, 2 + 2, 1 + 1: four vector ops),
then lane 0 into the accumulator. Each lane still takes the same elements as gcc's lane
copies did, in the same order; only the combine's order differs (a tree instead of a chain,
as eager's ``vec_reduce_all`` and Inductor's combine). A max's NaN flag is its own ``|``
accumulator, as before. C harness, one thread: layer norm over rows of 256 (1024 rows)
66.9 -> 54.8 us, over rows of 32 (6272 rows) 104.7 -> 78.5 us (the sums); softmax over
rows of 64 (4096 rows) 125.5 -> 119 us, over rows of 512 (1024 rows) 212.5 -> 207 us
(its max, beside its sum already a tree).

A symbolic row (a dynamic shape's length) runs the same way: its whole blocks, then, when
its length is not whole blocks, one block over its last 16 elements masked to those the
blocks left (a row shorter than 16: the row itself), into the same lanes, combined once.
Its loops had ended in gcc's serial combine twice per accumulator (the blocks' loop and the
masked tail's): C harness, one thread, the attention softmax of the dynamic transformer
stack (``[8, S, S]``, rows of S): S = 22 8.8 -> 5.5 us, 36 17.2 -> 11.3, 50 33.9 -> 18.4,
66 47.7 -> 27.7; S = 6 (a row shorter than a block) 4.9 -> 4.1. A static row that ends
in a masked 16-lane block (``row_loops._blocks``: a remainder of 4 or more, not 8-lane
rows) does the same; through torch.compile, 2 threads, best of 15: softmax over rows of
197 (4096 rows) 278 -> 207 us, of 500 323 -> 289, a sum over rows of 150 113 -> 90;
log_softmax over rows of 30522 and amax over rows of 1000 alike (within the noise).

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

import attrs

from torchloom.api import expr, stmt

from torchloom_codegen_cpu import row_blocks
from torchloom_codegen_cpu.render import Simd, compare, ternary

#: reduction operators of a SIMD pragma this form takes -> their update (max and min: a
#: select, ``acc = v > acc ? v : acc``, which their lanes keep)
UPDATES = {"+": "+=", "|": "|=", "max": ">", "min": "<"}
#: statements a row loop's body may hold here (no nested loop or branch)
_FLAT = (stmt.Declare, stmt.Store, stmt.Update, stmt.Select)


def lane_loop(pragma: Simd | None, n: int | expr.Code, header: list, body: list,
              declared: Callable[[str], stmt.Var | None], lanes: int,
              masked: bool = False, blocks: row_blocks.RowBlocks | None = None
              ) -> list | None:
    """The statements of a row loop over ``r`` in ``[0, n)`` (``header``: the coordinates
    each iteration starts with, ``body``: its statements) with its lanes combined as a tree,
    or None where this form does not apply: a static row that is not whole blocks of
    ``lanes``, a pragma that reduces with another operator than ``+``, ``|``, ``max`` or
    ``min`` (or none), a body with nested statements, updating a name its pragma does not
    reduce, masked, or a max/min whose condition reads its accumulator in opaque text, an
    accumulator whose declaration (``declared``) is not in the row's statements.

    A symbolic row (``n`` a node) runs its whole blocks, then, when ``n`` is not whole
    blocks, one block over its last ``lanes`` elements (from 0 on a row shorter than a
    block: ``min(n, lanes)`` of them) whose side effects are masked to the elements the
    blocks left (:func:`_masked_tail`): loads stay in the row, and each element is stored
    and accumulated once. So does a static row longer than a block that is not whole blocks
    where its caller says ``masked``. The caller checks that every statement of ``body``
    can be masked.

    A sum's lanes start at 0 (its accumulator's own start is added once, at the end); a
    max's or min's at its accumulator's start (its identity: -INFINITY, INT_MIN...), and
    the lanes combine with the same select (NaN has its own flag: ``reduction.accumulate``).
    """
    static = isinstance(n, int)
    if pragma is None or not pragma.reductions or static and (
            n < lanes or n % lanes and not masked):
        return None
    op_of = {name: op for op, names in pragma.reductions for name in names}
    if any(op not in UPDATES for op in op_of.values()):
        return None
    if not all(isinstance(s, _FLAT) for s in body) or (not static or masked) and any(
            getattr(s, "mask", None) is not None for s in body):
        return None
    updates = [s for s in body if isinstance(s, (stmt.Update, stmt.Select))]
    if any(not isinstance(s.target, str) or s.target not in op_of or s.mask is not None
           or isinstance(s, stmt.Select) != (op_of[s.target] in ("max", "min"))
           or isinstance(s, stmt.Update) and s.op != UPDATES[op_of[s.target]]
           for s in updates):
        return None
    vars_ = {name: declared(name) for name in op_of}
    if None in vars_.values():
        return None
    arrays = {name: f"{name}_lanes" for name in op_of}
    inner = _into_lanes(body, arrays)
    if inner is None:
        return None
    lines: list = []
    for name, array in arrays.items():
        start = "0" if op_of[name] in ("+", "|") else vars_[name].expr
        lines.append(stmt.Array(vars_[name].ctype, array, expr.Literal(str(lanes), lanes)))
        lines.append(stmt.Loop("rl", "0", str(lanes),
                               (stmt.Update(stmt.Element(array, _RL), "=", start),)))
    r = stmt.Declare("int64_t", "r", expr.plus(expr.times("rb", lanes), _RL))
    count = str(n // lanes) if static else expr.over(expr.paren(n), lanes)
    if blocks is not None and static and blocks.width == lanes:
        lines.append(row_blocks.loops(blocks, n // lanes, inner, Simd()))
    else:
        lines.append(stmt.Loop("rb", "0", count, (
            stmt.Loop("rl", "0", str(lanes), tuple(inner), (r, *header), Simd()),)))
    ctypes = {arrays[name]: var.ctype for name, var in vars_.items()}
    if not static:
        lines.append(_masked_tail(expr.paren(n), lanes, header, inner, ctypes))
    elif n % lanes:  # the last block: its first n % lanes lanes overlap the blocks
        lines.append(_last_block(expr.as_node(n - lanes), expr.as_node(n // lanes * lanes),
                                 lanes, header, inner, ctypes))
    half = lanes // 2
    while half:
        lines += [stmt.Loop("rl", "0", str(half), (
            _combine(op_of[name], stmt.Element(array, _RL), expr.Load(array, _RL),
                     expr.Load(array, expr.plus(_RL, half))),), annotation=Simd())
            for name, array in arrays.items()]
        half //= 2
    lines += [_combine(op_of[name], name, expr.Name(name),
                       expr.Load(array, expr.as_node(0)))
              for name, array in arrays.items()]
    return lines


#: a lane's index in its block
_RL = expr.Name("rl")


def _into_lanes(body: list, arrays: dict[str, str]) -> list | None:
    """``body`` with its accumulators' updates into their lane (``arrays``: accumulator ->
    its array of lanes); None where a select reads its accumulator in opaque text or its
    value reads it."""
    inner = []
    for s in body:
        if isinstance(s, stmt.Update):
            s = stmt.Update(stmt.Element(arrays[s.target], _RL), s.op, s.value)
        elif isinstance(s, stmt.Select):
            lane = expr.Load(arrays[s.target], _RL)
            cond = expr.substitute(s.cond, {s.target: lane})
            if s.target in expr.names(cond) or s.target in expr.names(s.value):
                return None  # (read in opaque text, or the value reads it)
            s = stmt.Select(stmt.Element(arrays[s.target], _RL), cond, s.value)
        inner.append(s)
    return inner


def _masked_tail(n: expr.Code, lanes: int, header: list, inner: list,
                 ctypes: dict[str, str]) -> stmt.If:
    """A symbolic row's last block, when ``n`` is not whole blocks: on a row of at least
    ``lanes`` elements, ``lanes`` lanes over its last elements (a known count: gcc peeled
    a variable one for alignment and ran it scalar), each statement's side effect taken
    only on the elements after the whole blocks (:func:`_masked`); on a shorter row, its
    ``n`` elements, none masked. ``ctypes``: each array of lanes' element type."""
    edge = expr.Name("r_edge")  # the first element after the whole blocks
    short = stmt.Declare("int64_t", "r", _RL)
    return stmt.If(compare("!=", expr.modulo(n, lanes), expr.as_node(0)), (
        stmt.Declare("int64_t", edge.text, expr.times(expr.over(n, lanes), lanes)),
        stmt.If(compare(">=", n, expr.as_node(lanes)), (
            _last_block(expr.minus(n, lanes), edge, lanes, header, inner, ctypes),), (
            stmt.Loop("rl", "0", n, tuple(inner), (short, *header), Simd()),))),
        flat=True)


def _last_block(first: expr.Code, edge: expr.Code, lanes: int, header: list, inner: list,
                ctypes: dict[str, str]) -> stmt.Loop:
    """``lanes`` lanes over the row's elements from ``first`` on, each statement's side
    effect taken only on the elements from ``edge`` on (:func:`_masked`)."""
    masked = _masked(inner, compare(">=", expr.Name("r"), edge), ctypes)
    r = stmt.Declare("int64_t", "r", expr.plus(first, _RL))
    return stmt.Loop("rl", "0", str(lanes), tuple(masked), (r, *header), Simd())


def _masked(inner: list, mask: expr.Code, ctypes: dict[str, str]) -> list:
    """``inner`` with each side effect taken only where ``mask`` holds: a store writes
    back what it read elsewhere, an update adds its value or nothing, bound first
    (``acc[rl] += m ? v : 0`` beside a masked store was not vectorized by gcc 12)."""
    masked: list = []
    for s in inner:
        if isinstance(s, stmt.Update):
            held = f"{s.target.pointer}_in"
            masked += [stmt.Declare(ctypes[s.target.pointer], held,
                                    ternary(mask, s.value, expr.as_node(0))),
                       stmt.Update(s.target, s.op, expr.Name(held))]
        elif isinstance(s, stmt.Declare):
            masked.append(s)
        else:
            masked.append(attrs.evolve(s, mask=mask))
    return masked


def _combine(op: str, target, held: expr.Code, other: expr.Code):
    """``target`` (holding ``held``) combined with ``other``: ``+=``/``|=``, or for max
    and min the select ``other > held ? other : held``."""
    if op in ("max", "min"):
        return stmt.Select(target, expr.compare(UPDATES[op], other, held), other)
    return stmt.Update(target, UPDATES[op], other)
