"""The lowering's statements in nested scopes (:class:`Scopes`): what the core's value walk
asks of an emitter (``emit``, ``convert``, ``cast``), values numbered by their text in
scope, and statements hoisted before the loops inside a scope."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torchloom.codegen import expr, stmt
from torchloom.codegen.contract import Renderer
from torchloom.codegen.expr import Code, Name
from torchloom.codegen.writer import COMPUTE, Expr

#: low-precision float dtypes: computed in f32, rounded as eager rounds them
LOW = ("bf16", "f16")


class Scopes:
    """Statements in nested scopes (a loop's body is one), each with the names its values
    are bound to: a value computed in a scope is visible in the scopes inside it."""

    def __init__(self, renderer: Renderer):
        self.renderer = renderer
        self.scopes: list[tuple[list, dict]] = [([], {})]
        self.count = 0
        #: the scope new statements go to (None: the innermost); see ``hoisting``
        self.target: int | None = None

    def fresh(self, hint: str) -> str:
        self.count += 1
        hint = "".join(c if c.isalnum() or c == "_" else "_" for c in hint).strip("_") or "v"
        return f"{hint}_{self.count}"

    def lookup(self, key: Any) -> Any:
        for _, memo in reversed(self.scopes):
            if key in memo:
                return memo[key]
        return None

    def remember(self, key: Any, value: Any) -> None:
        self.scopes[-1 if self.target is None else self.target][1][key] = value

    def add(self, statement: Any) -> None:
        self.scopes[-1 if self.target is None else self.target][0].append(statement)

    @contextlib.contextmanager
    def hoisting(self, level: int) -> Iterator[None]:
        """Statements and values go to scope ``level`` (before the loops inside it)."""
        saved, self.target = self.target, level
        try:
            yield
        finally:
            self.target = saved

    def open(self) -> None:
        self.scopes.append(([], {}))

    def close(self) -> list:
        return self.scopes.pop()[0]

    # ---- what ValueWalk asks of an emitter ---------------------------------------------
    def emit(self, text: Code | str, dtype: str, hint: str = "v", inner: bool = False
             ) -> Expr:
        """``text`` bound to a name (one per expression in scope); a name or a literal as
        it is."""
        code = expr.code(text)
        if code.trivial:
            return Expr(code, dtype)
        name = self.lookup(("text", code.text, dtype))
        if name is None:
            name = self.fresh(hint)
            self.remember(("text", code.text, dtype), name)
            self.add(stmt.Declare(dtype, name, code))
        return Expr(Name(name), dtype)

    def convert(self, e: Expr, dtype: str) -> Expr:
        if e.dtype == dtype:
            return e
        # the renderer's spelling (text): an opaque node
        return Expr(expr.code(self.renderer.convert(e.text, e.dtype, dtype)), dtype)

    def cast(self, e: Expr, ir_dtype: str) -> Expr:
        """An explicit conversion to IR dtype ``ir_dtype``: bf16/f16 round, as f32."""
        if ir_dtype in LOW:
            return self.emit(self.rounded(e, ir_dtype).code, "f32", ir_dtype)
        return self.convert(e, COMPUTE[ir_dtype])

    def rounded(self, e: Expr, dtype: str) -> Expr:
        """``e`` rounded to bf16/f16 ``dtype`` as the renderer spells it, an f32 value not
        bound to a name (:meth:`cast` binds it)."""
        return Expr(expr.code(self.renderer.round(self.convert(e, "f32").text, dtype)), "f32")
