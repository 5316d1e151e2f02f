"""Coordinates and index expressions as :mod:`torchloom.codegen.expr` nodes: what
:mod:`torchloom.codegen.indexing` computes with and returns, and what writers compare.

A coordinate is a :class:`~torchloom.codegen.expr.Name` (``x0``), :data:`ZERO` or an
:class:`~torchloom.codegen.expr.Op` tree; text a caller writes is taken as a node by
:func:`node` (a name, digits, else opaque text). :func:`operand` parenthesises an index
term where index arithmetic needs it, :func:`total` adds terms, :func:`key` is the text a
set of coordinates is remembered by (``indexing.Known``).
"""

from __future__ import annotations

from collections.abc import Sequence

from torchloom.codegen.expr import SUM, Code, Literal, Name, Op, paren

Coords = tuple[Code, ...]


#: coordinate 0 (a dim of one, an index that does not move)
ZERO = Literal("0", 0)


def node(c: Code | str) -> Code:
    """Coordinate or index ``c`` as a node: a :class:`~torchloom.codegen.expr.Name` for an
    identifier, a :class:`~torchloom.codegen.expr.Literal` for digits, an opaque
    :class:`~torchloom.codegen.expr.Op` for other text a caller wrote."""
    if not isinstance(c, str):
        return c
    if c.isidentifier():
        return Name(c)
    if c.isdigit():
        return Literal(c, int(c))
    return Op(c)


def is_zero(c: Code | str) -> bool:
    """Whether coordinate ``c`` is the constant 0."""
    return isinstance(c, Literal) and c.value == 0 or c == "0"


def operand(e: Code | str) -> Code:
    """``e`` as an operand of index arithmetic: as it is when it is a name, a literal or
    one parenthesised whole, else in parentheses."""
    e = node(e)
    return e if isinstance(e, Op) and e.opaque and enclosed(e.text) else paren(e)


def enclosed(e: str) -> bool:
    """Whether a caller's text ``e`` is one parenthesised whole: ``(a ? b : c)``, not
    ``(a) + (b)``."""
    if not e.startswith("("):
        return False
    depth = 0
    for k, ch in enumerate(e):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return k == len(e) - 1
    return False


def total(terms: Sequence[Code]) -> Code:
    """``a + b + ...`` of index terms (0 for none)."""
    if not terms:
        return ZERO
    if len(terms) == 1:
        return terms[0]
    return Op(" + ".join(f"{{{k}}}" for k in range(len(terms))), SUM, tuple(terms))


def key(coords: Sequence[Code | str]) -> tuple[str, ...]:
    """The texts of ``coords``: coordinates that print alike are one."""
    return tuple(str(c) for c in coords)


__all__ = ["Coords", "ZERO", "enclosed", "is_zero", "key", "node", "operand", "total"]
