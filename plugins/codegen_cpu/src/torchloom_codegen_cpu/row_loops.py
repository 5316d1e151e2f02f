"""The cpu's SIMD row loops: how a loop over a row's elements (``r`` in ``[0, n)``, its body
the statements of a phase) is shaped for gcc 12 and AVX-512: whole 16-lane blocks and a
masked last block, one loop of 8-lane vectors, lanes combined as a tree (lanes.py), a
loop past the row's end (overrun.py), blocks of lanes with their own coordinates
(row_blocks.py), a trip count gcc cannot see. :func:`shaped` is a function of the loop's
statements and what it reads of the kernel being written (:class:`RowLoops`): it returns
the statements that run the loop, and the emitter puts them in the row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from torchloom.api import TensorType, expr, stmt

from torchloom_codegen_cpu import lanes, overrun, row_blocks
from torchloom_codegen_cpu.ops import ITEMSIZE
from torchloom_codegen_cpu.render import Simd, compare, costly, divides_integers, ternary

#: elements per block of a row loop: one AVX-512 vector of f32 (see :func:`shaped`)
TAIL = 16


#: a row remainder (elements after the whole blocks) this short runs scalar
SCALAR_REMAINDER = 4

#: rows of whole vectors up to this many values hide their length (:func:`_trip_count`)
HIDDEN_COUNT = 64

#: rows of 8k values up to this long that are not whole AVX-512 vectors (and rows of 16) run
#: as one loop of 8-lane vectors (:func:`shaped`, narrow_row), in kernels whose
#: tensors all hold 4-byte elements; :data:`NARROW_ROWS_MIXED` in the others
NARROW_ROWS = 136
NARROW_ROWS_MIXED = 40
#: the longest row of narrow_odd_row (8-lane blocks and a masked 8-lane last block)
NARROW_ODD_ROWS = 104


def narrow_row(n: int | str, limit: int = NARROW_ROWS) -> bool:
    """Whether a static row of ``n`` values runs as one loop of 8-lane vectors
    (``simdlen(8)``: AVX2-wide f32, a whole AVX-512 vector of f64) with its count hidden
    (:func:`_trip_count`): a row of 8 values more than whole 16-lane vectors ran
    those vectors and a masked 16-lane block, two lane combines per reduction where 8-lane
    vectors end exactly; rows of 16 combine 8 lanes, not 16. C harness, softmax over 2^20
    f32 values, one thread: rows of 24 1.88 -> 0.67 ms, 40 1.35 -> 0.62, 72 0.89 -> 0.56,
    136 0.61 -> 0.48, 16 1.01 -> 0.85; at 200 alike, at 264 (0.48 -> 0.53) and at 48 and
    64 (0.56 -> 0.59, 0.49 -> 0.55) slower, so those keep 16-lane blocks. Through
    torch.compile, f64 and bf16 rows gain up to 40 values (bf16 softmax rows of 16 0.78 ->
    1.24x eager, 24 1.24 -> 2.35x) and lose from 72 on (f64 layer_norm rows of 104 1.56 ->
    1.37x, bf16 softmax rows of 136 0.97 -> 0.80x): ``limit`` is the longest row. Rows of
    8 (one 8-lane vector) measured alike, and keep their known count."""
    return isinstance(n, int) and (n == 16 or n % 16 == 8 and 16 < n <= limit)


def narrow_odd_row(n: int | str, limit: int = NARROW_ROWS) -> bool:
    """Whether a static row of ``n`` values, ``16 < n <= limit`` and not a multiple of 8,
    runs as blocks of 8-lane vectors and a masked 8-lane last block (``simdlen(8)``) rather
    than 16-lane ones: half the wasted lanes and 8-lane combines. C harness, softmax over
    2^20 f32 values, one thread, ms: rows of 20 2.29 -> 1.29, 36 1.46 -> 1.05, 44 1.25 ->
    0.93, 50 1.10 -> 0.81, 77 0.81 -> 0.67, 100 0.70 -> 0.60; at 197 0.53 -> 0.55. Through
    torch.compile a layer_norm over rows of 130 was slower (0.53 -> 0.57 ms): rows stop at
    :data:`NARROW_ODD_ROWS` (and at ``limit``)."""
    return isinstance(n, int) and 16 < n <= min(limit, NARROW_ODD_ROWS) and n % 8 != 0


def whole_vectors(n: int) -> int:
    """``n`` rounded up to whole 8-lane vectors: the elements a loop past a row's end
    touches (overrun.py), and so the length of a row buffer it reads."""
    return -(-n // 8) * 8


def narrow_limit(region) -> int:
    """The longest row of :func:`narrow_row` (and :func:`narrow_odd_row`) in a kernel of
    ``region``: :data:`NARROW_ROWS` when all its tensors hold 4-byte elements, else
    :data:`NARROW_ROWS_MIXED`."""
    sizes = {ITEMSIZE[v.type.dtype] for v in (*region.inputs, *region.outputs)
             if isinstance(v.type, TensorType)}
    return NARROW_ROWS if sizes <= {4} else NARROW_ROWS_MIXED


def _cheap(annotation: Simd | None, body: list) -> bool:
    """Whether gcc vectorizes a loop's remainder: no costly call (:func:`render.costly`:
    transcendentals, the prelude's functions), no max/min reduction (whose remainder ran
    scalar too: softmax's max loop). A remainder of half a vector after the blocks is gcc's
    one ymm iteration when the loop is cheap (sum over rows of 24 0.75 -> 0.31 ms,
    layer_norm 1.38 -> 1.03), but a costly loop's remainder ran scalar (softmax over rows
    of 24 1.96 -> 3.34 ms): those keep the masked block (:func:`shaped`)."""
    return not any(map(costly, body)) and not (annotation is not None and annotation.min_max())


def _masks_a_tail(pragma: Simd | None, n: int, body: list) -> bool:
    """Whether a static row of 16-lane blocks (not 8-lane ones) ends in a masked last
    block: a remainder of at least :data:`SCALAR_REMAINDER`, but not half a vector in a
    loop gcc vectorizes to its end (:func:`_cheap`); shorter remainders stay gcc's."""
    return n > TAIL and n % TAIL >= SCALAR_REMAINDER and not (
        n % TAIL == TAIL // 2 and _cheap(pragma, body))


def _maskable(statement) -> bool:
    """Whether :func:`stmt.masked` takes ``statement``; a select whose value is not a name
    or an integer (a literal such as ``1.5f``) stays unmasked, as it always was here (the
    loop then runs unmasked: the same kernels as before the statement IR)."""
    if isinstance(statement, stmt.Select) and not _word(str(statement.value)):
        return False
    return stmt.masked(statement, "") is not None


def _masked(statement, mask: str):
    """``statement`` with its side effect taken only where ``mask`` holds (see
    :func:`stmt.masked`, rendered by render.py): accumulator updates as selects (``acc +=
    mask ? v : 0``: a branch in an OpenMP reduction became masked stores to gcc's lane
    array and 6x slower loops), stores as a blend with the element there (``a[i] = mask ?
    v : a[i]``: the lanes masked off write back what they read, in their own row; an
    AVX-512 masked store took 2.2x the whole kernel's time in some processes),
    declarations as they are. None for a statement of another form."""
    return stmt.masked(statement, mask) if _maskable(statement) else None


#: the row loop's index
_R = expr.Name("r")


def _int(n: int | expr.Code) -> expr.Code:
    """A row length or bound as a node: an int as its literal, a node as it is."""
    return expr.Literal(str(n), n) if isinstance(n, int) else expr.code(n)


def _product(symbol: str, a: expr.Code, b: expr.Code) -> expr.Code:
    """``a symbol b`` for ``*``, ``/``, ``%`` (left to right: ``a / b * c``)."""
    return expr.infix(symbol, expr.PRODUCT, a, b)


def _word(text: str) -> bool:
    return bool(text) and all(c.isascii() and (c.isalnum() or c == "_") for c in text)


@attrs.frozen
class RowLoops:
    """What shaping a row loop reads of the kernel being written (the emitter's):
    ``narrow_limit`` (the longest row of :func:`narrow_row`), ``overrun`` (pointer -> C
    offset of element ``(x, r)`` for tensors whose rows lie end to end; None: no loop may
    run past its row's end), ``row_blocks`` (the row's coordinates in blocks of lanes;
    None: none), ``declared`` (an accumulator's declaration among the row's statements,
    None where it is not there), ``bind`` (a row value of an i64 expression, bound to a
    name once per row: ``bind(code, hint)``) and ``fresh`` (a new name from a hint)."""

    narrow_limit: int
    overrun: Mapping[str, str] | None
    row_blocks: row_blocks.RowBlocks | None
    declared: Callable[[str], stmt.Var | None]
    bind: Callable[[expr.Code, str], expr.Code]
    fresh: Callable[[str], str]


@attrs.frozen
class Shaped:
    """A row loop shaped: its ``statements`` and whether it runs past the row's end in all
    rows but each thread's last (``overran``: the row loop must share rows out
    explicitly, overrun.chunked)."""

    statements: tuple
    overran: bool = False


def shaped(loops: RowLoops, pragma: Simd | None, n: int | expr.Code, header: list,
           body: list) -> Shaped:
    """A SIMD loop over a row, ``r`` in ``[0, n)`` (``n``: an int or a node; ``header``:
    the coordinates each iteration starts with; ``body``: its statements), shaped as gcc 12
    cannot: its loops end in a scalar remainder of up to 15 elements, which on short rows
    costs more than the vectors (a softmax row of 62 took 81 us a call). The row runs as
    whole blocks of :data:`TAIL` elements, then one more loop over the last ``TAIL``
    (overlapping the blocks) whose side effects are masked to the elements the blocks left
    (:func:`_masked`), so each element is stored and accumulated once. Lanes masked off
    compute from elements in the row (loads stay in bounds) and touch nothing. A
    remainder shorter than :data:`SCALAR_REMAINDER` stays gcc's scalar remainder of the
    first loop (a second loop and its lane combine cost more), as does a remainder of
    half a vector in a loop gcc vectorizes to its end (:func:`_cheap`), and a row shorter
    than ``TAIL`` runs the second loop alone, from 0. Rows of :func:`narrow_row` run as
    one loop of 8-lane vectors instead, rows of :func:`narrow_odd_row` as 8-lane blocks
    and a masked 8-lane block, or, up to :data:`overrun.OVERRUN_ROWS` values where every
    element the loop touches lies in a tensor whose rows are end to end, as one loop of
    whole 8-lane vectors past the row's end in all rows but each thread's last
    (overrun.py). A static row of whole 16-lane vectors, or an 8-lane row, whose loop only
    adds or takes a max or min runs as blocks into an array of lanes combined as a tree
    (lanes.py), and so do a symbolic row and a static row with a masked last 16-lane block
    whose statements can all be masked (the last block masked as above, into the same
    lanes). ``pragma``: the loop's SIMD pragma (None: a plain loop)."""
    limit = loops.narrow_limit
    masked = all(map(_maskable, body)) and (not isinstance(n, int) or (
        not narrow_row(n, limit) and not narrow_odd_row(n, limit)
        and _masks_a_tail(pragma, n, body)))
    width = TAIL if masked or isinstance(n, int) and n % TAIL == 0 else \
        8 if narrow_row(n, limit) else 0  # (8: rows of 8-lane vectors)
    tree = width and lanes.lane_loop(pragma, n, header, body, loops.declared, width, masked,
                                     _blocks_of(loops, header, n // width * width
                                                if isinstance(n, int) else n, width))
    if tree:  # its lanes combined as a tree (lanes.py)
        return Shaped(tuple(tree))
    if pragma is not None and narrow_row(n, limit):
        count, declared = _trip_count(loops, n, pragma, True)
        return Shaped((*declared, _loop(attrs.evolve(pragma, simdlen=8), "r", _int(0), count,
                                        header, body)))
    tail = TAIL
    if pragma is not None and narrow_odd_row(n, limit):
        tail, pragma = 8, attrs.evolve(pragma, simdlen=8)
        whole, declared = _past_the_end(loops, body, n, pragma)
        if whole is not None:  # all rows but each thread's last one (overrun.py)
            past = _loop(pragma, "r", _int(0), _int(whole_vectors(n)), header, whole)
            blocks = _blocks(loops, pragma, n, header, body, tail)
            return Shaped((*declared, stmt.If(overrun.GUARD, (past,), tuple(blocks))), True)
    return Shaped(tuple(_blocks(loops, pragma, n, header, body, tail)))


def _blocks_of(loops: RowLoops, header: list, n: int | expr.Code, width: int
               ) -> row_blocks.RowBlocks | None:
    """:attr:`RowLoops.row_blocks` for a row loop with ``header`` over ``n`` elements in
    blocks of ``width`` lanes, where they apply (a static row of whole blocks)."""
    blocks = loops.row_blocks
    if blocks is None or blocks.width != width or tuple(header) != blocks.header or \
            not isinstance(n, int) or n < width or n % width:
        return None
    return blocks


def _blocks(loops: RowLoops, pragma: Simd | None, n: int | expr.Code, header: list,
            body: list, tail: int) -> list:
    """The row loop as whole blocks of ``tail`` elements and a masked last block (see
    :func:`shaped`): its statements."""
    static = isinstance(n, int)
    if static and tail == TAIL and not _masks_a_tail(pragma, n, body) or \
            not all(map(_maskable, body)):
        blocked = _in_row_blocks(loops, pragma, n, header, body)
        if blocked is not None:
            return [blocked]
        count, declared = _trip_count(loops, n, pragma)
        return [*declared, _loop(pragma, "r", _int(0), count, header, body)]
    if static:
        blocks, start, end = _int(n // tail * tail), _int(n - tail), _int(n)
    else:  # row values: one pair per row length, shared by its loops
        end, whole = expr.paren(n), _int(TAIL)
        blocks = loops.bind(ternary(
            compare("<", _product("%", end, whole), _int(SCALAR_REMAINDER)), end,
            _product("*", _product("/", end, whole), whole)), "r_blocks")
        start = loops.bind(ternary(compare("==", blocks, end), end, ternary(
            compare("==", blocks, _int(0)), _int(0),
            expr.infix("-", expr.SUM, end, whole))), "r_tail")
    blocked = _in_row_blocks(loops, pragma, n // tail * tail, header, body) if static \
        else None
    first = blocked or _loop(pragma, "r", _int(0), blocks, header, body)
    masked = [_masked(s, compare(">=", _R, blocks)) for s in body]
    tail_loop = _loop(pragma, "r", start, end, header, masked)
    # (symbolic: no remainder, not even the lane setup of an empty loop)
    return [first, tail_loop if static else
            stmt.If(compare("<", start, end), (tail_loop,), flat=True)]


def _in_row_blocks(loops: RowLoops, pragma: Simd | None, n: int | expr.Code, header: list,
                   body: list) -> stmt.Loop | None:
    """The row loop over ``[0, n)`` in blocks of lanes (row_blocks.py) where its
    coordinates have them and ``pragma`` makes it a SIMD loop that reduces nothing (a
    reduction clause on the lanes' loop would combine its lanes once a block: sums take
    lanes.py's blocks, which combine them once a row); None elsewhere."""
    blocks = None if pragma is None or pragma.reductions else \
        _blocks_of(loops, header, n, TAIL)
    return None if blocks is None else row_blocks.loops(blocks, n // TAIL, body, pragma)


def _past_the_end(loops: RowLoops, body: list, n: int, pragma: Simd
                  ) -> tuple[list | None, list]:
    """``body`` for a loop of whole 8-lane vectors past the row's end (overrun.py):
    accumulator updates take the lanes ``r < n`` only; loads and stores stay whole. None
    unless every element it touches is a row buffer's or at ``(x, r)`` of a tensor whose
    rows lie end to end, and no integer division (which lanes past the end could make
    divide by zero); with the statements declaring the bound it reads."""
    if loops.overrun is None or n > overrun.OVERRUN_ROWS:
        return None, []
    for s in body:
        if s.facts.nested or divides_integers(s):
            return None, []
        if any(not e.pointer.startswith("buf_") and
               loops.overrun.get(e.pointer) != str(e.offset)
               for e in s.facts.elements):
            return None, []
        if not isinstance(s, (stmt.Declare, stmt.Store)) and not _maskable(s):
            return None, []
    if all(isinstance(s, (stmt.Declare, stmt.Store)) for s in body):
        return list(body), []
    # the loop qualifies: its bound declared now (none left unused); a row of 8k + 7:
    # only the last lane is off, and gcc 12 turned the select of a known bound into a
    # loop exit it could not vectorize (3.5x slower)
    keep, declared = _trip_count(loops, n, pragma, True) if n % 8 == 7 else (_int(n), [])
    return [s if isinstance(s, (stmt.Declare, stmt.Store)) else
            _masked(s, compare("<", _R, keep)) for s in body], declared


def _trip_count(loops: RowLoops, n: int | expr.Code, pragma: Simd | None,
                hide: bool = False) -> tuple[expr.Code, list]:
    """The trip count of a SIMD row loop: ``n``, or for rows of whole vectors up to
    :data:`HIDDEN_COUNT` values a copy of it gcc cannot see through (an empty asm that
    "changes" it), with the statements declaring it. Knowing that a loop runs 1-4 vectors, gcc 12
    unrolls it completely and combines the lanes of its reductions in a serial chain; with
    the count hidden it keeps the vector loop (C harness, one thread, rows of 16: softmax
    kernel 1.23 -> 1.04 ms, sum 0.43 -> 0.26, var_mean 1.16 -> 0.93; rows of 32-64: 4-15%;
    rows of 128 and more: alike, so left known). Rows shorter than a vector keep their
    count: hidden, they ran gcc's scalar remainder (rows of 8: ten times slower).
    ``hide``: hidden whatever the length (8-lane rows, :func:`narrow_row`: rows of 24 0.82
    -> 0.67 ms)."""
    if not (hide or pragma is not None and isinstance(n, int) and n % TAIL == 0
            and 0 < n <= HIDDEN_COUNT):
        return _int(n), []
    name = loops.fresh("r_n")
    return expr.Name(name), [stmt.Var("int64_t", name, _int(n)),
                             stmt.Raw(f'__asm__("" : "+r"({name}));')]


def _loop(annotation: Simd | None, var: str, start: expr.Code | str, end: expr.Code | str,
          head: list, body: list) -> stmt.Loop:
    return stmt.Loop(var, start, end, tuple(body), tuple(head), annotation)
