"""The statement emitter: SSA-style C declarations with value numbering by source text.

A kernel is a parallel loop over rows; a row's body holds *row* statements (independent of
the inner index, computed once per row) and *phases*: SIMD loops over the inner index
(``j`` over the innermost dim of a pointwise walk, ``r`` over a reduced row). A statement
that reads an inner-index name is an inner statement of the current phase; a row
statement met while writing a phase goes before that phase's loop (loop-invariant
hoisting by construction).
"""

from __future__ import annotations

from torchloom.api import expr, stmt, writer

from torchloom_codegen_cpu import row_blocks, row_loops
from torchloom_codegen_cpu.ops import COMPUTE, CTYPE, STORAGE
from torchloom_codegen_cpu.render import Simd

Expr = writer.Expr


class Emitter(writer.Statements):
    """Collects a row body; knows which names depend on the inner index."""

    def __init__(self, narrow: int = row_loops.NARROW_ROWS):
        """``narrow``: the longest row of :func:`row_loops.narrow_row` (see
        :func:`row_loops.narrow_limit`)."""
        super().__init__()
        #: name of a value rounded to bf16/f16 (kept in f32) -> the f32 value it rounds;
        #: a store converts that directly (rounding once instead of twice)
        self.unrounded: dict[str, expr.Code] = {}
        #: C text (a table read, or the name bound to one) -> the 16-bit float dtype whose
        #: values it holds exactly: rounding it to that dtype is the value itself
        self.exact: dict[str, str] = {}
        self.narrow_limit = narrow
        #: the result tables the kernel's ops read: function name -> its C definition
        self.tables: dict[str, str] = {}
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

    def use_table(self, function: str, definition: str) -> None:
        """The kernel's module defines result table ``function`` (``definition``: its C)."""
        self.tables[function] = definition

    def holds_exactly(self, text: str, dtype: str) -> None:
        """C text ``text`` holds values of 16-bit float dtype ``dtype`` exactly (a table
        read: rounding it to ``dtype`` is the value itself)."""
        self.exact[text] = dtype

    def use_row_blocks(self, blocks: row_blocks.RowBlocks | None) -> None:
        """Row loops whose header is ``blocks.header`` run in blocks of lanes with the
        coordinates of ``blocks`` (row_blocks.py) where their rows are whole blocks."""
        self.row_blocks = blocks

    def allow_overrun(self, offsets: dict[str, str] | None) -> None:
        """Row loops may run past the row's end over the tensors ``offsets`` names (see
        :attr:`overrun`; None: none may)."""
        self.overrun = offsets

    # ---- statements --------------------------------------------------------------------
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
        loop = stmt.Loop(var, start, end, tuple(body), tuple(head), annotation)
        self.lines.append(loop)
        return loop

    def end_row_phase(self, pragma: Simd | None, n: int | str, header: list) -> None:
        """Close a SIMD loop over a row, ``r`` in ``[0, n)`` (``n``: an int or a node),
        shaped for this CPU (:func:`row_loops.shaped`; ``pragma``: the loop's SIMD
        pragma, None: a plain loop)."""
        body = self.close_phase()
        assert body is not None
        loops = row_loops.RowLoops(
            self.narrow_limit, self.overrun, self.row_blocks, self._accumulator,
            lambda code, hint: self.emit(code, "i64", hint, inner=False).code, self.fresh)
        shaped = row_loops.shaped(loops, pragma, n, header, body)
        self.lines.extend(shaped.statements)
        self.overran = self.overran or shaped.overran

    def _accumulator(self, name: str) -> stmt.Var | None:
        """The declaration of accumulator ``name`` among the row's statements so far (None:
        not declared there)."""
        return next((s for s in self.lines if isinstance(s, stmt.Var) and s.name == name),
                    None)
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
