"""The structured statement IR a native kernel writer builds, and transforms over it.

A writer's statements are objects, not lines of text: a codegen builds them, transforms
them (masks a loop's side effects, drops declarations nothing reads, rebounds a loop) and
only then renders them in its language. An expression is a node of
:mod:`torchloom.codegen.expr` (a name, a literal, an op over its operands with its
precedence: what a renderer asks to parenthesise it) or the target's text (an expression
of unknown shape); what a transform needs to know of one (the names it reads, the elements
``pointer[offset]`` it touches, the functions it calls) is found once, when its statement
is built (:func:`scan`: a walk of its nodes, loads being
:class:`~torchloom.codegen.expr.Load` nodes over offset trees of
:mod:`torchloom.codegen.indexing`; only opaque text and the templates' own spelling are
read as text, :func:`lexed`).

- :class:`Declare`: ``const T name = expr;``, a value bound once;
- :class:`Var`: ``T name = expr;``, a variable statements after it update (an
  accumulator);
- :class:`Assign`: ``name = expr``, a name bound or bound again in a target without
  declarations (Triton: a value, a coordinate, an accumulator's next value);
- :class:`Unpack`: ``a, b = expr``, names bound together from one expression of several
  values (Triton: ``tl.reduce`` over a tuple, a combine helper returning a pair);
- :class:`Store`: ``pointer[offset] = value;``;
- :class:`Update`: ``target op= value;``, an accumulation (``+=``, ``*=``, ``|=``), or
  ``target = value;`` (``=``) into a variable declared before (an arg reduction's best);
- :class:`Select`: ``target = cond ? value : target;``, a max/min accumulation;
- :class:`Loop`: ``for var in [start, end)`` (by ``step``) with the target's annotation
  (a SIMD pragma), its per-iteration coordinates (``head``) and its body;
- :class:`If`: a branch between two statement lists;
- :class:`Block`: a scope of its own, with the target's annotation (a parallel region);
- :class:`Array`: ``T name[size];``, an array on the stack (a target with declarations);
- :class:`Raw`: a line of the target's own (a prefetch, a one-line loop), only
  where nothing transforms it.

A statement with a ``mask`` takes its side effect only where the mask holds
(:func:`masked`); how that reads is the renderer's business. :func:`drop_unused` removes
the declarations and assignments nothing after them reads; :func:`invariant` takes a
loop's invariant declarations out of its body; :func:`walk` and :func:`map_loops` visit
and rewrite the loops of a statement list.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Union

import attrs

from torchloom.codegen import expr
from torchloom.codegen.expr import IDENT, Code

#: an expression of a statement: a node, or the target's text
Text = Union[str, Code]


@attrs.frozen
class Element:
    """One element of memory, ``pointer[offset]`` (``offset``: an expression node, or the
    target's text where it was found in opaque text)."""

    pointer: str
    offset: Text


@attrs.frozen
class Scan:
    """What an expression's text holds: the ``names`` it mentions, the ``elements`` it
    indexes, whether an index holds another (``nested``) and the ``calls`` it makes."""

    names: frozenset[str]
    elements: tuple[Element, ...]
    nested: bool
    calls: frozenset[str]


def scan(e: Text) -> Scan:
    """The names, elements and calls of expression ``e``. A node is walked: its
    :class:`~torchloom.codegen.expr.Name` nodes are names, its
    :class:`~torchloom.codegen.expr.Load` nodes elements (a load whose offset holds a load
    is ``nested``), and the identifiers of an op's template (the target's own spelling) are
    names, or calls when ``(`` follows; only opaque text, and text given as a string, is
    read as text (:func:`lexed`)."""
    if isinstance(e, str):
        return lexed(e)
    names: set[str] = set()
    elements: list[Element] = []
    calls: set[str] = set()
    nested = False
    for node in expr.walk(e):
        if isinstance(node, expr.Name):
            names.add(node.text)
        elif isinstance(node, expr.Load):
            names.add(node.pointer)
            if any(isinstance(n, expr.Load) or (isinstance(n, expr.Op) and n.opaque and
                                                "[" in n.text) for n in expr.walk(node.offset)):
                nested = True
            else:
                elements.append(Element(node.pointer, node.offset))
        elif isinstance(node, expr.Op):
            part = lexed(node.template if node.opaque else _literal_text(node.template))
            names |= part.names
            elements.extend(part.elements)
            calls |= part.calls
            nested = nested or part.nested
    return Scan(frozenset(names), tuple(elements), nested, frozenset(calls))


def _literal_text(template: str) -> str:
    """An op template's own text, its operand fields left out (a space each)."""
    return " ".join(text for text, *_ in string.Formatter().parse(template))


def lexed(text: str) -> Scan:
    """:func:`scan` of text: an identifier followed by ``[`` indexes an element up to its
    matching ``]``; followed by ``(``, is a call; every identifier is a name."""
    names = IDENT.findall(text)
    elements: list[Element] = []
    calls: set[str] = set()
    nested = False
    for m in IDENT.finditer(text):
        end = m.end()
        after = text[end:end + 1]
        if after == "(":
            calls.add(m.group())
        elif after == "[":
            depth, k = 0, end
            while k < len(text):
                depth += {"[": 1, "]": -1}.get(text[k], 0)
                if depth == 0:
                    break
                k += 1
            offset = text[end + 1:k]
            if "[" in offset:
                nested = True
            else:
                elements.append(Element(m.group(), offset))
    return Scan(frozenset(names), tuple(elements), nested, frozenset(calls))


def _scanned(*texts: Text) -> Scan:
    parts = [scan(t) for t in texts]
    return Scan(frozenset().union(*(p.names for p in parts)),
                tuple(e for p in parts for e in p.elements), any(p.nested for p in parts),
                frozenset().union(*(p.calls for p in parts)))


def _target(target: Union[str, Element]) -> Text:
    """A statement's target as an expression: a name's text, an element's load."""
    return target if isinstance(target, str) else expr.Load(target.pointer, target.offset)


@attrs.frozen
class _Binding:
    """A name bound to ``expr`` with a type: what :class:`Declare` and :class:`Var` share."""

    ctype: str
    name: str
    expr: Text
    facts: Scan = attrs.field(default=attrs.Factory(lambda s: scan(s.expr), takes_self=True),
                              eq=False, repr=False, init=False)

    @property
    def names(self) -> frozenset[str]:
        """Every name the statement mentions (its own and its type's too)."""
        return self.facts.names | {self.name, self.ctype}


@attrs.frozen
class Declare(_Binding):
    """``const ctype name = expr;``"""


@attrs.frozen
class Var(_Binding):
    """``ctype name = expr;``: a variable that statements after it update or assign (an
    accumulator of a target with declarations); never dropped by :func:`drop_unused`."""


@attrs.frozen
class Assign:
    """``name = expr``: a name bound, or bound again (an accumulator), in a target whose
    names need no declaration; :func:`drop_unused` drops it as a declaration when no
    statement after it reads the name."""

    name: str
    expr: Text
    facts: Scan = attrs.field(default=attrs.Factory(lambda s: scan(s.expr), takes_self=True),
                              eq=False, repr=False, init=False)

    @property
    def names(self) -> frozenset[str]:
        return self.facts.names | {self.name}


@attrs.frozen
class Unpack:
    """``a, b = expr``: ``targets`` bound together (again, for accumulators) from one
    expression giving as many values, in a target without declarations; dropped by
    :func:`drop_unused` when no statement after it reads any of them."""

    targets: tuple[str, ...] = attrs.field(converter=tuple)
    expr: Text
    facts: Scan = attrs.field(default=attrs.Factory(lambda s: scan(s.expr), takes_self=True),
                              eq=False, repr=False, init=False)

    @property
    def names(self) -> frozenset[str]:
        return self.facts.names | set(self.targets)


@attrs.frozen
class Store:
    """``target = value;`` to one element; with ``mask``, only where it holds."""

    target: Element
    value: Text
    mask: Text | None = None
    facts: Scan = attrs.field(
        default=attrs.Factory(lambda s: _scanned(_target(s.target), s.value,
                                                 s.mask or ""), takes_self=True),
        eq=False, repr=False, init=False)

    @property
    def names(self) -> frozenset[str]:
        return self.facts.names


@attrs.frozen
class Update:
    """``target op value;`` (``op``: ``+=``, ``*=``, ``|=``; ``=``: set, a variable a
    branch changes): an accumulation into a name or an element; with ``mask``, only where
    it holds."""

    target: Union[str, Element]
    op: str
    value: Text
    mask: Text | None = None
    facts: Scan = attrs.field(
        default=attrs.Factory(lambda s: _scanned(_target(s.target), s.value,
                                                 s.mask or ""), takes_self=True),
        eq=False, repr=False, init=False)

    @property
    def names(self) -> frozenset[str]:
        return self.facts.names


@attrs.frozen
class Select:
    """``target = cond ? value : target;`` (a max or min accumulation); with ``mask``,
    only where it holds."""

    target: Union[str, Element]
    cond: Text
    value: Text
    mask: Text | None = None
    facts: Scan = attrs.field(
        default=attrs.Factory(lambda s: _scanned(_target(s.target), s.cond, s.value,
                                                 s.mask or ""), takes_self=True),
        eq=False, repr=False, init=False)

    @property
    def names(self) -> frozenset[str]:
        return self.facts.names


@attrs.frozen
class Array(_Binding):
    """``ctype name[expr];``: an array of ``expr`` elements a target with declarations keeps
    on the stack (a block's accumulators, a row's buffer, a staged block of rows); loads and
    stores touch its elements, the declaration none; never dropped by :func:`drop_unused`."""


@attrs.frozen
class Raw:
    """A line of the target's own that no transform looks into but for its names."""

    text: str
    facts: Scan = attrs.field(default=attrs.Factory(lambda s: scan(s.text), takes_self=True),
                              eq=False, repr=False, init=False)

    @property
    def names(self) -> frozenset[str]:
        return self.facts.names


@attrs.frozen
class Loop:
    """``var`` over ``[start, end)`` (expressions: nodes, or the target's text) by
    ``step`` (None: one, as the target writes a unit step); ``annotation``: the target's
    (a SIMD pragma, None: none); ``head``: statements each iteration starts with (its
    coordinates)."""

    var: str
    start: Text
    end: Text
    body: tuple[Any, ...]
    head: tuple[Any, ...] = ()
    annotation: Any = None
    step: Text | None = None

    @property
    def names(self) -> frozenset[str]:
        """The names its header mentions (the body's are its statements')."""
        return (scan(self.start).names | scan(self.end).names | {self.var}
                | scan(self.step or "").names
                | getattr(self.annotation, "names", frozenset()))


@attrs.frozen
class If:
    """``if (cond) then else orelse`` (``cond``: a node, or the target's text; ``orelse``
    None: no else branch); ``flat``: its branches written at its own depth (a guard
    around one loop), not indented."""

    cond: Text
    then: tuple[Any, ...]
    orelse: tuple[Any, ...] | None = None
    flat: bool = False

    @property
    def names(self) -> frozenset[str]:
        return scan(self.cond).names


@attrs.frozen
class Block:
    """``{ body }``: statements in a scope of their own (a nest's declarations with its
    loop); ``annotation``: the target's, before it (a parallel region's pragma; None:
    none)."""

    body: tuple[Any, ...]
    annotation: Any = None

    @property
    def names(self) -> frozenset[str]:
        """The names its annotation mentions (the body's are its statements')."""
        return getattr(self.annotation, "names", frozenset())


Statement = Union[Declare, Var, Assign, Unpack, Store, Update, Select, Array, Raw, Loop, If,
                  Block]

#: the statements :func:`masked` makes conditional
_MASKABLE = (Update, Select)


def masked(statement: Statement, mask: Text) -> Statement | None:
    """``statement`` with its side effect taken only where ``mask`` holds: a declaration
    as it is (it has none), an accumulation into a name or a store with the mask; None for
    a statement of another kind (an accumulation into an element, a loop, a raw line)."""
    if isinstance(statement, Declare):
        return statement
    if isinstance(statement, Store) or (isinstance(statement, _MASKABLE)
                                        and isinstance(statement.target, str)):
        return attrs.evolve(statement, mask=mask)
    return None


def drop_unused(statements: Sequence[Statement]) -> list[Statement]:
    """``statements`` without the declarations (and assignments) no statement after them
    (in program order, at any depth) mentions, and without the loops (whose head assigns
    nothing: a Python target's names outlive its loop), branches and blocks left with
    nothing to do: coordinates a walk did not need, so the source shows only what the
    kernel computes."""
    used: set[str] = set()
    return _kept(statements, used)


def _kept(statements: Sequence[Statement], used: set[str]) -> list[Statement]:
    kept: list[Statement] = []
    for s in reversed(statements):
        if isinstance(s, (Declare, Assign)) and s.name not in used or \
                isinstance(s, Unpack) and not used.intersection(s.targets):
            continue
        if isinstance(s, Loop):
            body = _kept(s.body, used)
            if not body and not any(isinstance(h, Assign) for h in s.head):
                continue  # (nothing to do; an assignment in its head may outlive it)
            head = _kept(s.head, used)
            s = attrs.evolve(s, head=tuple(head), body=tuple(body))
        elif isinstance(s, If):
            orelse = None if s.orelse is None else tuple(_kept(s.orelse, used))
            then = tuple(_kept(s.then, used))
            if not then and not orelse:
                continue  # (a branch left with nothing to do either way)
            s = attrs.evolve(s, then=then, orelse=orelse)
        elif isinstance(s, Block):
            body = tuple(_kept(s.body, used))
            if not body:
                continue
            s = attrs.evolve(s, body=body)
        used.update(s.names)
        kept.append(s)
    return kept[::-1]


def invariant(statements: Sequence[Statement], var: str,
              pure: Callable[[Scan], bool]) -> tuple[list[Statement], list[Statement]]:
    """``statements`` (a loop's body over ``var``) split into the declarations that read
    nothing the loop declares or changes, to run once before it, and the rest::

        for x:  const float s = powf(0.9f, in_t[0]);     const float s = powf(0.9f, in_t[0]);
                const float a = in_p[x] * s;       ->    for x:  const float a = in_p[x] * s;

    A declaration moves when every name its expression mentions is declared outside the
    loop or by a declaration that moved (no coordinate, loop variable, variable, or name a
    raw line mentions) and ``pure(its scan)`` says its calls and the memory it reads give
    the same value before the loop as in it (the target's functions without side effects,
    inputs no statement of the loop writes)."""
    local = {var}
    for s in walk(statements):
        if isinstance(s, (Declare, Var, Assign, Array)):
            local.add(s.name)
        elif isinstance(s, Unpack):
            local.update(s.targets)
        elif isinstance(s, Loop):
            local.add(s.var)
        elif isinstance(s, Raw):
            local.update(s.names)
    written = {s.target.pointer for s in walk(statements)
               if isinstance(s, (Store, Update, Select)) and isinstance(s.target, Element)}
    moved: list[Statement] = []
    kept: list[Statement] = []
    outside: set[str] = set()
    for s in statements:
        if isinstance(s, Declare) and not (s.facts.names & (local - outside)) and \
                not {e.pointer for e in s.facts.elements} & written and pure(s.facts):
            moved.append(s)
            outside.add(s.name)
        else:
            kept.append(s)
    return moved, kept


def walk(statements: Sequence[Statement]) -> Iterator[Statement]:
    """Every statement, in program order, nested ones after the loop, branch or block
    holding them."""
    for s in statements:
        yield s
        if isinstance(s, Loop):
            yield from walk(s.head)
            yield from walk(s.body)
        elif isinstance(s, If):
            yield from walk(s.then)
            yield from walk(s.orelse or ())
        elif isinstance(s, Block):
            yield from walk(s.body)


def map_loops(statements: Sequence[Statement], change: Callable[[Loop], Loop]
              ) -> list[Statement]:
    """``statements`` with every loop (at any depth, inner ones first) replaced by
    ``change(loop)``."""
    out: list[Statement] = []
    for s in statements:
        if isinstance(s, Loop):
            s = change(attrs.evolve(s, body=tuple(map_loops(s.body, change))))
        elif isinstance(s, If):
            s = attrs.evolve(s, then=tuple(map_loops(s.then, change)),
                             orelse=None if s.orelse is None else
                             tuple(map_loops(s.orelse, change)))
        elif isinstance(s, Block):
            s = attrs.evolve(s, body=tuple(map_loops(s.body, change)))
        out.append(s)
    return out
