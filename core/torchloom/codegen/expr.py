"""A kernel's expressions as trees: what a writer asks of an expression (is it a literal,
does it need parentheses, can it be used as it is or must it be bound to a name, which
names does it read) is a question about the nodes it built, never a match over its text.

- :class:`Name`: a name (a value bound by a statement, a parameter, a loop index);
- :class:`Literal`: a constant the target spells inline: a number (``1.5f``, ``3LL``,
  ``float("-inf")``, ``True``), or a size argument converted to a type
  (``((double)ks0)``); ``value`` is the number when there is one;
- :class:`Load`: element ``offset`` of the tensor at ``pointer`` (``in_x[x * 16 + r]``);
- :class:`Op`: any other expression (an operator, a call, a conversion): its
  ``template`` with a positional field per operand (``"{0} * {1}"``), its ``operands``
  (nodes) and its ``precedence`` (:data:`LOWEST` .. :data:`ATOM`): how tightly it binds
  as an operand. Its text is the template filled with its operands' texts.

Names and literals are *trivial*: a writer uses them as they are (never binds them to a
name, never puts them in parentheses). A node prints as its text (``str``, f-strings), so
a renderer spells a statement by formatting its expressions::

    >>> x = Name("x"); half = Literal("0.5f", 0.5)
    >>> e = Op("{0} * {1}", PRODUCT, (x, half))
    >>> f"{par(e)} + 1"
    '(x * 0.5f) + 1'
    >>> par(e, PRODUCT), par(half), sorted(names(e))
    ('x * 0.5f', '0.5f', ['x'])
    >>> str(substitute(e, {"x": Name("y")}))
    'y * 0.5f'

:func:`fill` makes the tree of an op's template (``"{self} * {other}"``) over its
operands' nodes: a template that is one operand is that operand's node (an identity op on
a name is that name, not an expression to bind). An :class:`Op` without operands is
opaque text (:func:`code` of a string: a writer's own spelling), a leaf whose names
:func:`names` finds by scanning its identifiers; every other node is walked.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator, Mapping
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

#: an identifier in a target's text (what opaque text names)
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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


def _operands(given: Any) -> tuple:
    return tuple(code(e) for e in given)


def _filled(op: Op) -> str:
    return op.template.format(*op.operands) if op.operands else op.template


@attrs.frozen(repr=False)
class Op(_Printed):
    """An expression over ``operands``, binding as tightly as ``precedence``:
    ``template``'s field ``{k}`` is operand k (``Op("{0} * {1}", PRODUCT, (x, y))``).
    Without operands it is opaque text, ``template`` verbatim. Two ops are equal when
    their trees are; ``text`` is derived once, when the op is made."""

    template: str
    precedence: int = LOWEST
    operands: tuple[Code, ...] = attrs.field(default=(), converter=_operands)
    text: str = attrs.field(init=False, eq=False,
                            default=attrs.Factory(_filled, takes_self=True))
    trivial = False

    @property
    def opaque(self) -> bool:
        """Whether it is text of unknown shape (no operands to walk)."""
        return not self.operands

    def __repr__(self) -> str:
        level = "" if self.precedence == LOWEST and not self.operands else \
            f", {self.precedence}"
        operands = f", {self.operands!r}" if self.operands else ""
        return f"Op({self.template!r}{level}{operands})"


@attrs.frozen(repr=False)
class Load(_Printed):
    """Element ``offset`` (a node) of the tensor at ``pointer`` (a name), written
    ``pointer[offset]``: a read of memory whose element a transform can ask for (which
    array, which offset) without reading text."""

    pointer: str
    offset: "Code" = attrs.field(converter=lambda e: code(e))
    text: str = attrs.field(init=False, eq=False, default=attrs.Factory(
        lambda s: f"{s.pointer}[{s.offset}]", takes_self=True))
    precedence = POSTFIX
    trivial = False

    def __repr__(self) -> str:
        return f"Load({self.pointer!r}, {self.offset!r})"


Code = Union[Name, Literal, Op, Load]


def code(e: Code | str) -> Code:
    """``e`` as a node: text given as a string is an expression of unknown shape, opaque
    (an :class:`Op` without operands, of the lowest precedence: parenthesised wherever
    it is an operand)."""
    if isinstance(e, str):
        return Op(e)
    if not isinstance(e, (Name, Literal, Op, Load)):
        raise TypeError(f"an expression is a node or text, not {type(e).__name__}: {e!r}")
    return e


def is_literal(e: Code | str) -> bool:
    """Whether ``e`` is a :class:`Literal` (a string never is: its shape is unknown)."""
    return isinstance(e, Literal)


def paren(e: Code | str, within: int = ATOM) -> Code:
    """``e`` as an operand of a place binding as tightly as ``within``: itself, or an
    :class:`Op` parenthesising it when ``e`` binds less tightly."""
    e = code(e)
    return e if e.precedence >= within else Op("({0})", ATOM, (e,))


def par(e: Code | str, within: int = ATOM) -> str:
    """The text of :func:`paren`: ``e``'s, in parentheses when it binds less tightly than
    ``within``. The default, :data:`ATOM`, parenthesises everything but names, literals
    and parenthesised text (what the codegens' kernels have always read)."""
    return paren(e, within).text


def infix(symbol: str, level: int, a: Code | str, b: Code | str, left: int | None = None,
          right: int | None = None) -> Code:
    """``a symbol b`` (an operator both C and Python spell alike: ``+``, ``*``, ``%``,
    ``<``, ``==``), binding as ``level``: the left operand in parentheses where it binds
    less tightly than ``left`` (default ``level``), the right one where it binds less
    tightly than ``right`` (default one level tighter: ``a - (b - c)``, ``a / (b * c)``).
    A comparison binds as :data:`LOWEST` over operands of :data:`SUM`::

        >>> str(infix("<", LOWEST, infix("%", PRODUCT, Name("n"), Literal("16", 16)),
        ...           Literal("4", 4), left=SUM, right=SUM))
        'n % 16 < 4'
    """
    left = level if left is None else left
    right = level + 1 if right is None else right
    return Op(f"{{0}} {symbol} {{1}}", level, (paren(a, left), paren(b, right)))


def compare(symbol: str, a: Code | str, b: Code | str) -> Code:
    """``a symbol b`` for a comparison (``<``, ``>=``, ``==``, ...), spelt alike in C and
    Python: arithmetic operands bind tighter and need no parentheses."""
    return infix(symbol, LOWEST, a, b, left=SUM, right=SUM)


def as_node(v: Code | str | int) -> Code:
    """``v`` as a node: an int as its :class:`Literal`, an identifier as a :class:`Name`,
    digits as a literal, other text as opaque text (:func:`code`), a node as it is."""
    if isinstance(v, bool):
        raise TypeError(f"an operand is a node, a name or an int, not {v!r}")
    if isinstance(v, int):
        return Literal(str(v), v)
    if isinstance(v, str):
        if v.isidentifier():
            return Name(v)
        if v.isdigit():
            return Literal(v, int(v))
    return code(v)


def plus(a: Code | str | int, b: Code | str | int) -> Code:
    """``a + b`` (operands taken by :func:`as_node`)."""
    return infix("+", SUM, as_node(a), as_node(b))


def minus(a: Code | str | int, b: Code | str | int) -> Code:
    """``a - b``."""
    return infix("-", SUM, as_node(a), as_node(b))


def times(a: Code | str | int, b: Code | str | int) -> Code:
    """``a * b``."""
    return infix("*", PRODUCT, as_node(a), as_node(b))


def over(a: Code | str | int, b: Code | str | int) -> Code:
    """``a / b`` (C's division; an integer one between integers)."""
    return infix("/", PRODUCT, as_node(a), as_node(b))


def modulo(a: Code | str | int, b: Code | str | int) -> Code:
    """``a % b``."""
    return infix("%", PRODUCT, as_node(a), as_node(b))


def wrapped(e: Code) -> Code:
    """``e`` ready to stand as an operand anywhere: itself when trivial, else in
    parentheses (still an expression to bind, not a name)."""
    return e if e.trivial else Op("({0})", ATOM, (e,))


def walk(e: Code | str) -> Iterator[Code]:
    """``e`` and every node under it, each before its operands."""
    stack = [code(e)]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, Op):
            stack.extend(reversed(node.operands))
        elif isinstance(node, Load):
            stack.append(node.offset)


def names(e: Code | str) -> frozenset[str]:
    """The names ``e`` reads: its :class:`Name` nodes, and the identifiers of its opaque
    text (a function or type such text calls is among them). A literal reads none (a
    size argument it converts is constant over the kernel), nor does an op's template
    (its function names are the target's, not values)."""
    found: set[str] = set()
    for node in walk(e):
        if isinstance(node, Name):
            found.add(node.text)
        elif isinstance(node, Load):
            found.add(node.pointer)
        elif isinstance(node, Op) and node.opaque:
            found.update(IDENT.findall(node.template))
    return frozenset(found)


def substitute(e: Code | str, replace: Mapping[str, Code]) -> Code:
    """``e`` with each :class:`Name` in ``replace`` replaced by its node (opaque text is
    kept as it is: its names are not nodes)."""
    e = code(e)
    if isinstance(e, Name):
        return replace.get(e.text, e)
    if isinstance(e, Load):
        offset = substitute(e.offset, replace)
        return e if offset == e.offset else Load(e.pointer, offset)
    if isinstance(e, Op) and e.operands:
        operands = tuple(substitute(o, replace) for o in e.operands)
        if operands != e.operands:
            return Op(e.template, e.precedence, operands)
    return e


def fill(template: str, named: Mapping[str, Code | str]) -> Code:
    """The expression of ``template`` (``"{self} * {other}"``) over the operands ``named``
    (nodes, or text: :func:`code`): the operand itself for a template that is one operand
    (``"{self}"``), a :class:`Literal` for a template without operands (``"1"``: isfinite
    of an integer), else an :class:`Op` over the operands it names, each once and in the
    order it first appears (:data:`LOWEST`: its shape is the template's); KeyError for
    an operand ``named`` lacks."""
    if template.startswith("{") and template.endswith("}") and template[1:-1] in named:
        return code(named[template[1:-1]])
    fields: dict[str, int] = {}
    parts = []
    for text, field, spec, conversion in string.Formatter().parse(template):
        parts.append(text.replace("{", "{{").replace("}", "}}"))
        if field is None:
            continue
        if field not in named:
            raise KeyError(field)
        k = fields.setdefault(field, len(fields))
        parts.append(f"{{{k}{'!' + conversion if conversion else ''}"
                     f"{':' + spec if spec else ''}}}")
    if not fields:
        return Literal(template.format())  # no operand: the op's value is a constant
    return Op("".join(parts), LOWEST, tuple(named[f] for f in fields))


__all__ = ["ATOM", "Code", "IDENT", "LOWEST", "Literal", "Load", "Name", "Op", "POSTFIX", "PRODUCT",
           "SUM", "as_node", "code", "compare", "fill", "infix", "is_literal", "minus", "modulo", "names",
           "over", "par", "paren", "plus", "substitute", "times", "walk", "wrapped"]
