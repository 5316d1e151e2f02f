"""The statement emitter: SSA-style C declarations with value numbering by source text.

A kernel is a parallel loop over rows; a row's body holds *row* statements (independent of
the inner index, computed once per row) and *phases*: SIMD loops over the inner index
(``j`` over the innermost dim of a pointwise walk, ``r`` over a reduced row). A statement
that reads an inner-index name is an inner statement of the current phase; a row
statement met while writing a phase goes before that phase's loop (loop-invariant
hoisting by construction).
"""

from __future__ import annotations

import attrs

from torchloom.api import TensorType, expr, stmt, writer

from torchloom_codegen_cpu import lanes, overrun, row_blocks
from torchloom_codegen_cpu.ops import COMPUTE, CTYPE, ITEMSIZE, STORAGE
from torchloom_codegen_cpu.render import Simd, compare, costly, divides_integers, ternary

Expr = writer.Expr

#: elements per block of a row loop: one AVX-512 vector of f32 (see Emitter.end_row_phase)
TAIL = 16


#: a row remainder (elements after the whole blocks) this short runs scalar
SCALAR_REMAINDER = 4

#: rows of whole vectors up to this many values hide their length (Emitter._trip_count)
HIDDEN_COUNT = 64

#: rows of 8k values up to this long that are not whole AVX-512 vectors (and rows of 16) run
#: as one loop of 8-lane vectors (Emitter.end_row_phase, narrow_row), in kernels whose
#: tensors all hold 4-byte elements; :data:`NARROW_ROWS_MIXED` in the others
NARROW_ROWS = 136
NARROW_ROWS_MIXED = 40
#: the longest row of narrow_odd_row (8-lane blocks and a masked 8-lane last block)
NARROW_ODD_ROWS = 104


def narrow_row(n: int | str, limit: int = NARROW_ROWS) -> bool:
    """Whether a static row of ``n`` values runs as one loop of 8-lane vectors
    (``simdlen(8)``: AVX2-wide f32, a whole AVX-512 vector of f64) with its count hidden
    (:meth:`Emitter._trip_count`): a row of 8 values more than whole 16-lane vectors ran
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
    of 24 1.96 -> 3.34 ms): those keep the masked block (Emitter.end_row_phase)."""
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


class Emitter(writer.Statements):
    """Collects a row body; knows which names depend on the inner index."""

    def __init__(self, narrow: int = NARROW_ROWS):
        """``narrow``: the longest row of :func:`narrow_row` (see :func:`narrow_limit`)."""
        super().__init__()
        self.inner_names: set[str] = set()
        #: name of a value rounded to bf16/f16 (kept in f32) -> the f32 value it rounds;
        #: a store converts that directly (rounding once instead of twice)
        self.unrounded: dict[str, expr.Code] = {}
        #: C text (a table read, or the name bound to one) -> the 16-bit float dtype whose
        #: values it holds exactly: rounding it to that dtype is the value itself
        self.exact: dict[str, str] = {}
        self.narrow_limit = narrow
        #: names of floats converted to ints (see convert)
        self.truncated: set[str] = set()
        #: pointer -> C offset of element (x, r), for the tensors whose rows lie end to end
        #: (overrun.row_offsets; None: no row loop may run past its row's end)
        self.overrun: dict[str, str] | None = None
        #: whether a row loop ran past its row's end (the row loop then shares rows out
        #: explicitly: overrun.chunked)
        self.overran = False
        #: the row's coordinates in blocks of lanes (row_blocks.py; None: declared from r)
        self.row_blocks: row_blocks.RowBlocks | None = None

    def inner(self, name: str) -> None:
        """``name`` depends on the inner index (a loop variable, a coordinate of it)."""
        self.inner_names.add(name)

    def holds_exactly(self, text: str, dtype: str) -> None:
        """C text ``text`` holds values of 16-bit float dtype ``dtype`` exactly (a table
        read: rounding it to ``dtype`` is the value itself)."""
        self.exact[text] = dtype

    def use_row_blocks(self, blocks: row_blocks.RowBlocks | None) -> None:
        """Row loops whose header is ``blocks.header`` run in blocks of lanes with the
        coordinates of ``blocks`` (row_blocks.py) where their rows are whole blocks."""
        self.row_blocks = blocks

    def _blocks_of(self, header: list, n: int | expr.Code, width: int
                   ) -> row_blocks.RowBlocks | None:
        """:attr:`row_blocks` for a row loop with ``header`` over ``n`` elements in blocks
        of ``width`` lanes, where they apply (a static row of whole blocks)."""
        blocks = self.row_blocks
        if blocks is None or blocks.width != width or tuple(header) != blocks.header or \
                not isinstance(n, int) or n < width or n % width:
            return None
        return blocks

    def allow_overrun(self, offsets: dict[str, str] | None) -> None:
        """Row loops may run past the row's end over the tensors ``offsets`` names (see
        :attr:`overrun`; None: none may)."""
        self.overrun = offsets

    # ---- statements --------------------------------------------------------------------
    def is_inner(self, e: expr.Code | str) -> bool:
        """Whether expression ``e`` reads a name that depends on the inner index."""
        return not expr.names(e).isdisjoint(self.inner_names)

    def reads_inner(self, statement) -> bool:
        """Whether ``statement`` mentions a name that depends on the inner index."""
        return not statement.names.isdisjoint(self.inner_names)

    def emit(self, text: expr.Code | str, dtype: str, hint: str = "t",
             inner: bool | None = None) -> Expr:
        """Bind ``text`` to a const name (reusing an identical statement in scope); a name
        or a literal is used as it is."""
        code = expr.code(text)
        text = code.text
        inner = self.is_inner(code) if inner is None else inner
        if code.trivial:
            return Expr(code, dtype, inner)
        inner = inner and self.in_phase
        name, new = self.bind(text, hint, inner,
                              lambda name: stmt.Declare(CTYPE[dtype], name, code))
        if new and inner:
            self.inner_names.add(name)
        if text in self.exact:
            self.exact[name] = self.exact[text]
        return Expr(expr.Name(name), dtype, inner)

    # ---- phases --------------------------------------------------------------------------
    def begin_phase(self) -> None:
        """Start an inner loop; statements that read inner names go into it."""
        self.open_phase()

    def end_phase(self, annotation: Simd | None, var: str, start: str, end: str,
                  head: list) -> stmt.Loop:
        """Close the loop: ``var`` over ``[start, end)``, ``annotation`` its pragma (None:
        none) and ``head`` (inner coordinates) before the inner statements; the loop."""
        body = self.close_phase()
        assert body is not None
        return self._loop(annotation, var, start, end, head, body)

    def end_row_phase(self, pragma: Simd | None, n: int | str, header: list) -> None:
        """Close a SIMD loop over a row, ``r`` in ``[0, n)`` (``n``: an int or a node), as
        gcc 12 cannot: its loops end in a scalar remainder of up to 15 elements, which on
        short rows costs more than the vectors (a softmax row of 62 took 81 us a call).
        The row runs as whole blocks of :data:`TAIL` elements, then one more loop over the
        last ``TAIL`` (overlapping the blocks) whose side effects are masked to the elements
        the blocks left (:func:`_masked`), so each element is stored and accumulated once.
        Lanes masked off compute from elements in the row (loads stay in bounds) and touch
        nothing. A remainder shorter than :data:`SCALAR_REMAINDER` stays gcc's scalar
        remainder of the first loop (a second loop and its lane combine cost more), as does
        a remainder of half a vector in a loop gcc vectorizes to its end (:func:`_cheap`),
        and a row shorter than ``TAIL`` runs the second loop alone, from 0. Rows of
        :func:`narrow_row` run as one loop of 8-lane vectors instead, rows of
        :func:`narrow_odd_row` as 8-lane blocks and a masked 8-lane block, or, up to
        :data:`overrun.OVERRUN_ROWS` values where every element the loop touches lies in
        a tensor whose rows are end to end, as one loop of whole 8-lane vectors past the
        row's end in all rows but each thread's last (overrun.py). A static row of whole
        16-lane vectors, or an 8-lane row, whose loop only adds or takes a max or min
        runs as blocks into an array of lanes combined as a tree (lanes.py), and so do a
        symbolic row and a static row with a masked last 16-lane block whose statements
        can all be masked (the last block masked as above, into the same lanes).
        ``pragma``: the loop's SIMD pragma
        (None: a plain loop)."""
        body = self.close_phase()
        assert body is not None
        masked = all(map(_maskable, body)) and (not isinstance(n, int) or (
            not narrow_row(n, self.narrow_limit) and not narrow_odd_row(n, self.narrow_limit)
            and _masks_a_tail(pragma, n, body)))
        width = TAIL if masked or isinstance(n, int) and n % TAIL == 0 else \
            8 if narrow_row(n, self.narrow_limit) else 0  # (8: rows of 8-lane vectors)
        tree = width and lanes.lane_loop(pragma, n, header, body, self._accumulator,
                                         width, masked,
                                         self._blocks_of(header, n // width * width
                                                         if isinstance(n, int) else n,
                                                         width))
        if tree:  # its lanes combined as a tree (lanes.py)
            self.lines.extend(tree)
            return
        if pragma is not None and narrow_row(n, self.narrow_limit):
            self._loop(attrs.evolve(pragma, simdlen=8), "r", _int(0),
                       self._trip_count(n, pragma, True), header, body)
            return
        tail = TAIL
        if pragma is not None and narrow_odd_row(n, self.narrow_limit):
            tail, pragma = 8, attrs.evolve(pragma, simdlen=8)
            whole = self._past_the_end(body, n, pragma)
            if whole is not None:  # all rows but each thread's last one (overrun.py)
                self.overran = True
                past = self.capture(lambda: self._loop(pragma, "r", _int(0),
                                                       _int(whole_vectors(n)), header, whole))
                blocks = self.capture(lambda: self._blocks(pragma, n, header, body, tail))
                self.lines.append(stmt.If(overrun.GUARD, tuple(past), tuple(blocks)))
                return
        self._blocks(pragma, n, header, body, tail)

    def _accumulator(self, name: str) -> stmt.Var | None:
        """The declaration of accumulator ``name`` among the row's statements so far (None:
        not declared there)."""
        return next((s for s in self.lines if isinstance(s, stmt.Var) and s.name == name),
                    None)

    def _blocks(self, pragma: Simd | None, n: int | str, header: list, body: list,
                tail: int) -> None:
        """The row loop as whole blocks of ``tail`` elements and a masked last block (see
        :meth:`end_row_phase`)."""
        static = isinstance(n, int)
        if static and tail == TAIL and not _masks_a_tail(pragma, n, body) or \
                not all(map(_maskable, body)):
            if not self._in_row_blocks(pragma, n, header, body):
                self._loop(pragma, "r", _int(0), self._trip_count(n, pragma), header, body)
            return
        if static:
            blocks, start, end = _int(n // tail * tail), _int(n - tail), _int(n)
        else:  # row statements: one pair per row length, shared by its loops
            end, whole = expr.paren(n), _int(TAIL)
            blocks = self.emit(ternary(
                compare("<", _product("%", end, whole), _int(SCALAR_REMAINDER)), end,
                _product("*", _product("/", end, whole), whole)),
                "i64", "r_blocks", inner=False).code
            start = self.emit(ternary(compare("==", blocks, end), end, ternary(
                compare("==", blocks, _int(0)), _int(0),
                expr.infix("-", expr.SUM, end, whole))), "i64", "r_tail", inner=False).code
        if not (static and self._in_row_blocks(pragma, n // tail * tail, header, body)):
            self._loop(pragma, "r", _int(0), blocks, header, body)
        masked = [_masked(s, compare(">=", _R, blocks)) for s in body]
        if static:
            self._loop(pragma, "r", start, end, header, masked)
        else:  # no remainder: not even the lane setup of an empty loop
            tail_loop = self.capture(lambda: self._loop(pragma, "r", start, end, header, masked))
            self.lines.append(stmt.If(compare("<", start, end), tuple(tail_loop), flat=True))

    def _in_row_blocks(self, pragma: Simd | None, n: int | expr.Code, header: list,
                       body: list) -> bool:
        """The row loop over ``[0, n)`` in blocks of lanes (row_blocks.py), where its
        coordinates have them and ``pragma`` makes it a SIMD loop that reduces nothing (a
        reduction clause on the lanes' loop would combine its lanes once a block: sums
        take lanes.py's blocks, which combine them once a row); whether it was."""
        blocks = None if pragma is None or pragma.reductions else \
            self._blocks_of(header, n, TAIL)
        if blocks is None:
            return False
        self.lines.append(row_blocks.loops(blocks, n // TAIL, body, pragma))
        return True

    def _past_the_end(self, body: list, n: int, pragma: Simd) -> list | None:
        """``body`` for a loop of whole 8-lane vectors past the row's end (overrun.py):
        accumulator updates take the lanes ``r < n`` only; loads and stores stay whole.
        None unless every element it touches is a row buffer's or at ``(x, r)`` of a tensor
        whose rows lie end to end, and no integer division (which lanes past the end
        could make divide by zero)."""
        if self.overrun is None or n > overrun.OVERRUN_ROWS:
            return None
        for s in body:
            if s.facts.nested or divides_integers(s):
                return None
            if any(not e.pointer.startswith("buf_") and
                   self.overrun.get(e.pointer) != str(e.offset)
                   for e in s.facts.elements):
                return None
            if not isinstance(s, (stmt.Declare, stmt.Store)) and not _maskable(s):
                return None
        if all(isinstance(s, (stmt.Declare, stmt.Store)) for s in body):
            return list(body)
        # the loop qualifies: its bound declared now (none left unused); a row of 8k + 7:
        # only the last lane is off, and gcc 12 turned the select of a known bound into a
        # loop exit it could not vectorize (3.5x slower)
        keep = self._trip_count(n, pragma, True) if n % 8 == 7 else _int(n)
        return [s if isinstance(s, (stmt.Declare, stmt.Store)) else
                _masked(s, compare("<", _R, keep)) for s in body]

    def _trip_count(self, n: int | expr.Code, pragma: Simd | None, hide: bool = False
                    ) -> expr.Code:
        """The trip count of a SIMD row loop: ``n``, or for rows of whole vectors up to
        :data:`HIDDEN_COUNT` values a copy of it gcc cannot see through (an empty asm that
        "changes" it). Knowing that a loop runs 1-4 vectors, gcc 12 unrolls it completely and
        combines the lanes of its reductions in a serial chain; with the count hidden it
        keeps the vector loop (C harness, one thread, rows of 16: softmax kernel 1.23 ->
        1.04 ms, sum 0.43 -> 0.26, var_mean 1.16 -> 0.93; rows of 32-64: 4-15%; rows of 128
        and more: alike, so left known). Rows shorter than a vector keep their count: hidden,
        they ran gcc's scalar remainder (rows of 8: ten times slower). ``hide``: hidden
        whatever the length (8-lane rows, :func:`narrow_row`: rows of 24 0.82 -> 0.67 ms)."""
        if not (hide or pragma is not None and isinstance(n, int) and n % TAIL == 0
                and 0 < n <= HIDDEN_COUNT):
            return _int(n)
        name = self.fresh("r_n")
        self.lines.extend([stmt.Var("int64_t", name, _int(n)),
                           stmt.Raw(f'__asm__("" : "+r"({name}));')])
        return expr.Name(name)

    def _loop(self, annotation: Simd | None, var: str, start: expr.Code | str,
              end: expr.Code | str, head: list, body: list) -> stmt.Loop:
        loop = stmt.Loop(var, start, end, tuple(body), tuple(head), annotation)
        self.lines.append(loop)
        return loop

    # ---- conversions ---------------------------------------------------------------------
    def convert(self, e: Expr, dtype: str) -> Expr:
        """``e`` as compute dtype ``dtype`` (C conversion, no rounding beyond the target)."""
        if e.dtype == dtype:
            return e
        operand = (expr.paren(e.code),)
        if dtype == "b8":
            return self.emit(expr.Op("{0} != 0", expr.LOWEST, operand), "b8", "b")
        converted = self.emit(expr.Op(f"({CTYPE[dtype]}){{0}}", expr.LOWEST, operand), dtype,
                              "cvt")
        if e.text in self.truncated and dtype in ("f32", "f64"):
            # gcc folds (float)(int)x into trunc(x), which keeps -0.5's sign: -0.0 where
            # the int was 0 (a select of a literal zero it keeps)
            return self.emit(expr.Op(f"{{0}} == 0 ? ({CTYPE[dtype]})0 : {{0}}", expr.LOWEST,
                                     (converted.code,)), dtype, "cvt")
        return converted

    def cast(self, e: Expr, ir_dtype: str) -> Expr:
        """An explicit cast in the program: rounds to ``ir_dtype`` exactly as eager does
        (f64 -> bf16 goes through f32, as c10::BFloat16 does)."""
        target = COMPUTE[ir_dtype]
        if ir_dtype in ("bf16", "f16"):  # c10::Half also converts a double through float
            source = self.convert(e, "f32")
            if self.exact.get(source.text) == ir_dtype:
                return source
            rounded = self.emit(expr.Op(f"tl_round_{ir_dtype}({{0}})", expr.POSTFIX,
                                        (source.code,)), "f32", "rnd")
            self.unrounded[rounded.text] = source.code
            return rounded
        if e.dtype in ("f32", "f64") and target not in ("f32", "f64", "b8"):
            # float -> int truncates; NaN, inf and out-of-range values as eager on x86
            # (the prelude's tl_f2i32...: undefined in C)
            source = "f" if e.dtype == "f32" else "d"
            wide = "64" if target in ("i64", "u8") else "32"  # uint8 wraps from int64
            code = expr.Op(f"tl_{source}2i{wide}({{0}})", expr.POSTFIX, (e.code,))
            if target not in ("i64", "i32"):  # narrower ints wrap from int32 (uint8: 64)
                code = expr.Op(f"({CTYPE[target]}){{0}}", expr.LOWEST, (code,))
            truncated = self.emit(code, target, "cvt")
            self.truncated.add(truncated.text)
            return truncated
        return self.convert(e, target)


def load_element(pointer: str, offset: expr.Code | str, ir_dtype: str) -> expr.Code:
    """C reading one element of storage dtype ``ir_dtype`` as its compute dtype: the
    element's :class:`~torchloom.codegen.expr.Load`, converted where the storage is not
    the compute dtype."""
    element = expr.Load(pointer, offset)
    if ir_dtype in ("bf16", "f16"):
        return expr.Op(f"tl_{ir_dtype}_to_f32({{0}})", expr.POSTFIX, (element,))
    if ir_dtype == "b8":
        return expr.Op("({0} != 0)", expr.ATOM, (element,))
    return element


def store_statement(pointer: str, offset: str, e: Expr, ir_dtype: str,
                    unrounded: expr.Code | None = None, exact: str | None = None
                    ) -> stmt.Store:
    """C writing ``e`` to one element of storage dtype ``ir_dtype`` (rounding as eager);
    ``unrounded``: the f32 value ``e`` is the bf16/f16 rounding of, converted directly;
    ``exact``: the 16-bit dtype whose values ``e`` holds exactly (a bf16 one is stored as
    its bits, nothing to round)."""
    if unrounded is not None and ir_dtype in ("bf16", "f16"):
        e = Expr(unrounded, "f32", e.inner)
    value: expr.Code
    if ir_dtype == "bf16" and exact == "bf16" and e.dtype == "f32":
        value = expr.Op("(uint16_t)tl_bits_bf16({0})", expr.LOWEST, (e.code,))
    elif ir_dtype in ("bf16", "f16"):  # from double through float, as c10 converts
        single = e.code if e.dtype == "f32" else _cast("float", e.code)
        value = expr.Op(f"tl_f32_to_{ir_dtype}({{0}})", expr.POSTFIX, (single,))
    elif ir_dtype == "b8":
        value = expr.Op("(uint8_t)({0} != 0)", expr.LOWEST, (e.code,)) if e.dtype != "b8" \
            else _cast("uint8_t", e.code)
    else:
        value = e.code if STORAGE[ir_dtype] == CTYPE.get(e.dtype) else \
            _cast(STORAGE[ir_dtype], e.code)
    return stmt.Store(stmt.Element(pointer, offset), value)


def _cast(ctype: str, e: expr.Code) -> expr.Code:
    """``(ctype)e``, ``e`` in parentheses unless a name or a literal."""
    return expr.Op(f"({ctype}){{0}}", expr.LOWEST, (expr.paren(e),))
