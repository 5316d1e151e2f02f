"""The lowering's emitter (:class:`Scopes`): what the core's value walk asks of an emitter
(``emit``, ``convert``, ``cast``) over the statements in nested scopes every writer builds
on (:class:`torchloom.codegen.statements.Statements`: values numbered by their text in
scope, a statement that reads no inner name put before the loop it was met in)."""

from __future__ import annotations

from torchloom.codegen import expr, stmt
from torchloom.codegen.contract import Renderer
from torchloom.codegen.expr import Code, Name
from torchloom.codegen.statements import Statements
from torchloom.codegen.writer import COMPUTE, Expr

#: low-precision float dtypes: computed in f32, rounded as eager rounds them
LOW = ("bf16", "f16")


class Scopes(Statements):
    """The lowering's emitter: statements in nested scopes (:class:`Statements`, a loop's
    body is one, a loop over an inner index a phase), a value computed in a scope visible
    in the scopes inside it."""

    def __init__(self, renderer: Renderer):
        super().__init__()
        self.renderer = renderer
        #: what the kernel's source needs besides its function, as the renderer's spelling
        #: named it (:meth:`use`; ``Lowered.needs``), in order
        self.needs: dict[str, None] = {}

    def use(self, *names: str) -> None:
        """The kernel's source needs ``names`` (a helper of the renderer's module, say:
        its ``render`` reads them from ``Lowered.needs``)."""
        self.needs.update(dict.fromkeys(names))

    # ---- what ValueWalk asks of an emitter ---------------------------------------------
    def emit(self, text: Code | str, dtype: str, hint: str = "v", inner: bool | None = None
             ) -> Expr:
        """``text`` bound to a name (one per expression in scope), in the open phase's body
        where it reads an inner name (or ``inner`` says so), else before its loop; a name
        or a literal as it is."""
        code = expr.code(text)
        if code.trivial:
            return Expr(code, dtype)
        inner = self.in_phase and (self.is_inner(code) if inner is None else inner)
        name, new = self.bind(("text", code.text, dtype), hint, inner,
                              lambda name: stmt.Declare(dtype, name, code))
        if new and inner:
            self.inner(name)
        return Expr(Name(name), dtype)

    def convert(self, e: Expr, dtype: str) -> Expr:
        if e.dtype == dtype:
            return e
        # the renderer's spelling (text) of an operand (parenthesised unless a name, a
        # literal or parenthesised already): an opaque node
        return Expr(expr.code(self.renderer.convert(expr.par(e.code), e.dtype, dtype)), dtype)

    def cast(self, e: Expr, ir_dtype: str) -> Expr:
        """An explicit conversion to IR dtype ``ir_dtype``: bf16/f16 round, as f32."""
        if ir_dtype in LOW:
            return self.emit(self.rounded(e, ir_dtype).code, "f32", ir_dtype)
        return self.convert(e, COMPUTE[ir_dtype])

    def rounded(self, e: Expr, dtype: str) -> Expr:
        """``e`` rounded to bf16/f16 ``dtype`` as the renderer spells it, an f32 value not
        bound to a name (:meth:`cast` binds it)."""
        return Expr(expr.code(self.renderer.round(self.convert(e, "f32").text, dtype)), "f32")
