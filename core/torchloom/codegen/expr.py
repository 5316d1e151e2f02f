"""A kernel's expressions as structure: what a writer asks of an expression (is it a
literal, does it need parentheses, can it be used as it is or must it be bound to a name)
is a question about the node it built, never a match over its text.

- :class:`Name`: a name (a value bound by a statement, a parameter, a loop index);
- :class:`Literal`: a constant the target spells inline: a number (``1.5f``, ``3LL``,
  ``float("-inf")``, ``True``), or a size argument converted to a type
  (``((double)ks0)``); ``value`` is the number when there is one;
- :class:`Op`: any other expression (an operator, a call, a conversion), with its
  ``precedence`` (:data:`LOWEST` .. :data:`ATOM`): how tightly it binds as an operand.

Names and literals are *trivial*: a writer uses them as they are (never binds them to a
name, never puts them in parentheses). A node prints as its text (``str``, f-strings), so
a renderer spells a statement by formatting its expressions::

    >>> x = Name("x"); half = Literal("0.5f", 0.5)
    >>> e = Op(f"{x} * {half}", PRODUCT)
    >>> f"{par(e)} + 1"
    '(x * 0.5f) + 1'
    >>> par(e, PRODUCT), par(half)
    ('x * 0.5f', '0.5f')

:func:`fill` makes the expression of an op's template (``"{self} * {other}"``) over its
operands' nodes: a template that is one operand is that operand's node (an identity op on
a name is that name, not an expression to bind).
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any, Union

import attrs

#: precedence levels (higher binds tighter): :func:`par` puts an operand in parentheses
#: when it binds less tightly than the place it goes
LOWEST = 0
SUM = 1
PRODUCT = 2
#: a call, an index, a conversion written ``(T)x``: tighter than any operator, not a name
POSTFIX = 3
#: a name, a literal, text in its own parentheses
ATOM = 4


class _Printed:
    """A node prints as its text."""

    text: str

    def __str__(self) -> str:
        return self.text

    def __format__(self, spec: str) -> str:
        return format(self.text, spec)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.text!r})"


@attrs.frozen(repr=False)
class Name(_Printed):
    """A name: a bound value, a parameter, a loop index."""

    text: str
    precedence = ATOM
    trivial = True


@attrs.frozen(repr=False)
class Literal(_Printed):
    """A constant spelt inline (see the module docstring); ``value``: its number, None
    for a constant without one (a converted size argument)."""

    text: str
    value: Any = None
    precedence = ATOM
    trivial = True


@attrs.frozen(repr=False)
class Op(_Printed):
    """Any other expression, binding as tightly as ``precedence``."""

    text: str
    precedence: int = LOWEST
    trivial = False

    def __repr__(self) -> str:
        level = "" if self.precedence == LOWEST else f", {self.precedence}"
        return f"Op({self.text!r}{level})"


Code = Union[Name, Literal, Op]


def code(e: Code | str) -> Code:
    """``e`` as a node: text given as a string is an expression of unknown shape (an
    :class:`Op` of the lowest precedence, parenthesised wherever it is an operand)."""
    return Op(e) if isinstance(e, str) else e


def is_literal(e: Code | str) -> bool:
    """Whether ``e`` is a :class:`Literal` (a string never is: its shape is unknown)."""
    return isinstance(e, Literal)


def par(e: Code | str, within: int = ATOM) -> str:
    """``e``'s text as an operand of a place binding as tightly as ``within``: in
    parentheses when ``e`` binds less tightly. The default, :data:`ATOM`, parenthesises
    everything but names, literals and parenthesised text (what the codegens' kernels have
    always read)."""
    e = code(e)
    return e.text if e.precedence >= within else f"({e.text})"


def wrapped(e: Code) -> Code:
    """``e`` ready to stand as an operand anywhere: itself when trivial, else its text in
    parentheses (still an expression to bind, not a name)."""
    return e if e.trivial else Op(f"({e.text})", ATOM)


def fill(template: str, named: Mapping[str, Code | str]) -> Code:
    """The expression of ``template`` (``"{self} * {other}"``) over the operands ``named``
    (nodes, or text: :func:`code`): the operand itself for a template that is one operand
    (``"{self}"``), a :class:`Literal` for a template without operands (``"1"``: isfinite
    of an integer), else an :class:`Op` of its text (:data:`LOWEST`: its shape is the
    template's); KeyError for an operand ``named`` lacks."""
    if template.startswith("{") and template.endswith("}") and template[1:-1] in named:
        return code(named[template[1:-1]])
    if not any(field is not None for _, field, _, _ in string.Formatter().parse(template)):
        return Literal(template.format())  # no operand: the op's value is a constant
    return Op(template.format(**named))


__all__ = ["ATOM", "Code", "LOWEST", "Literal", "Name", "Op", "POSTFIX", "PRODUCT", "SUM",
           "code", "fill", "is_literal", "par", "wrapped"]
