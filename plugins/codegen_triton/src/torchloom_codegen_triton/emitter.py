"""The statement emitter: SSA-style Triton statements (``torchloom.api.stmt``) with value
numbering by their expression's text.

A statement is either "outer" (independent of the reduction index, computed once per row
block) or "inner" (depends on ``rindex``). In the looped form, each reduction is a *phase*:
a :class:`stmt.Loop` ``for roff in range(0, R, RBLOCK)`` whose body holds the inner
statements; outer statements met while writing a phase go before its loop. In the
persistent form there are no loops and every statement is written once. render.py prints
the statements.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchloom.api import expr, stmt, writer

from torchloom_codegen_triton.ops import COMPUTE, STORAGE

Expr = writer.Expr
#: an expression's text, in parentheses unless it is a name or a literal
par = expr.par


class Emitter(writer.Statements):
    """Collects the kernel body; knows which names depend on the reduction index."""

    def __init__(self, looped: bool, hardware_bf16: bool = False,
                 loop_bounds: tuple[expr.Code, expr.Code] | None = None):
        """``loop_bounds``: the (start, stop) of every loop over the row (a split
        reduction's loops cover one chunk), None: the whole row."""
        super().__init__()
        self.looped = looped
        #: round to bf16 with the GPU's conversion (round to nearest even, as eager); the
        #: interpreter's conversion truncates, so CPU kernels round in software
        self.hardware_bf16 = hardware_bf16
        #: names holding values already rounded to bf16 -> the f32 value they rounded (a
        #: store converts that value once instead of rounding twice)
        self.bf16_exact: dict[str, expr.Code] = {}
        self.rnames: set[str] = set()
        self.xnames: set[str] = {"xindex"}
        self.loop_bounds = loop_bounds
        #: the open phase's loop: (start, stop, the statements each iteration starts with)
        self._loop: tuple[str, str, tuple[stmt.Statement, ...]] | None = None
        #: the module helpers (``ops.HELPERS``) the statements call: the module defines
        #: these and no others
        self.helpers: set[str] = set()

    def use(self, *helpers: str) -> None:
        """Ask for module helpers that a statement of this kernel calls."""
        self.helpers.update(helpers)

    def mark_x(self, *names: str) -> None:
        """``names`` vary along the rows (coordinates of a program's elements)."""
        self.xnames.update(names)

    def mark_r(self, *names: str) -> None:
        """``names`` depend on the reduction index."""
        self.rnames.update(names)

    # ---- statements --------------------------------------------------------------------
    def depends_on_r(self, e: expr.Code | str) -> bool:
        """Whether expression ``e`` reads a name that depends on the reduction index."""
        return not expr.names(e).isdisjoint(self.rnames)

    def depends_on_x(self, e: expr.Code | str) -> bool:
        """Whether expression ``e`` reads a name that varies along the rows."""
        return not expr.names(e).isdisjoint(self.xnames)

    def emit(self, text: expr.Code | str, dtype: str, hint: str = "t",
             rdep: bool | None = None) -> Expr:
        """Bind ``text`` to a name (reusing an earlier identical statement in scope); a
        name or a literal is used as it is."""
        code = expr.code(text)
        rdep = self.depends_on_r(code) if rdep is None else rdep
        if code.trivial:
            return Expr(code, dtype, rdep)
        name, new = self.bind(code.text, hint, rdep and self.looped,
                              lambda name: stmt.Assign(name, code))
        if new and rdep:
            self.rnames.add(name)
        return Expr(expr.Name(name), dtype, rdep)

    # ---- phases (looped form) ------------------------------------------------------------
    def begin_phase(self, rnumel: str, header: Sequence[stmt.Statement]) -> None:
        """Start a loop over the reduction index; ``header`` defines rindex/rmask/r coords."""
        if not self.looped:
            return
        self.open_phase()
        start, stop = self.loop_bounds or ("0", str(rnumel))
        self._loop = (start, stop, tuple(header))

    def end_phase(self) -> None:
        if not self.looped:
            return
        body = self.close_phase()
        if body is not None and self._loop is not None:
            start, stop, header = self._loop
            self.lines.append(stmt.Loop("roff", start, stop, tuple(body), header,
                                        step="RBLOCK"))
            self._loop = None

    # ---- conversions ---------------------------------------------------------------------
    def convert(self, e: Expr, dtype: str) -> Expr:
        """``e`` as compute dtype ``dtype`` (no rounding beyond the target type)."""
        literal = expr.is_literal(e.code)  # a number takes the type it is used at
        if e.dtype == dtype or (literal and dtype != "b8"):
            return Expr(e.code, dtype, e.inner) if literal else e
        operand = (expr.paren(e.code),)
        if dtype == "b8":
            return self.emit(expr.Op("{0} != 0", expr.LOWEST, operand), "b8", "b")
        return self.emit(expr.Op(f"{{0}}.to({STORAGE[dtype]})", expr.POSTFIX, operand), dtype,
                         "cvt")

    def cast(self, e: Expr, ir_dtype: str) -> Expr:
        """An explicit cast in the program: rounds to ``ir_dtype`` exactly as eager does."""
        target = COMPUTE[ir_dtype]
        if ir_dtype == "bf16":
            x = self.convert(e, "f32").code
            if not self.hardware_bf16:
                self.use("_round_to_bf16")
            rounded = self.emit(
                expr.Op("{0}.to(tl.bfloat16).to(tl.float32)", expr.POSTFIX, (expr.paren(x),))
                if self.hardware_bf16 else expr.Op("_round_to_bf16({0})", expr.POSTFIX, (x,)),
                "f32", "rnd")
            self.bf16_exact[rounded.text] = x
            return rounded
        if ir_dtype != target:  # f16: round, keep computing in f32
            rounded = self.emit(expr.Op(f"{{0}}.to({STORAGE[ir_dtype]})", expr.POSTFIX,
                                        (expr.paren(e.code),)), ir_dtype, "rnd")
            return self.emit(expr.Op(f"{{0}}.to({STORAGE[target]})", expr.POSTFIX,
                                     (rounded.code,)), target, "cvt")
        return self.convert(e, target)
