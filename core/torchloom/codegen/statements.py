"""The one statement emitter every kernel writer builds on (:class:`Statements`): statements
(:mod:`torchloom.codegen.stmt`) in nested scopes (:meth:`Statements.open` /
:meth:`Statements.close`: a loop's body is one), values numbered by their text in scope,
fresh names, and *phases*, the one way a statement goes before the loop it was met in:
:meth:`Statements.open_phase` opens a loop over an inner index; a statement that is inner
(it reads a name depending on that index: :meth:`Statements.inner`) goes into the loop's
body, any other before the loop (hoisted by construction); :meth:`Statements.close_phase`
returns the body for the caller to wrap in its loop. The ``cpu`` and ``triton`` writers
and the core's lowering (:class:`torchloom.codegen.scopes.Scopes`) all write so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchloom.codegen import expr
from torchloom.codegen.expr import Code

#: names writers give coordinates and loop indices: no value is named after one
_COORDINATE_HINTS = frozenset({"x", "r", "j", "c", "xb", "ks", "xindex", "rindex", "roff"})


class Statements:
    """Statements in nested scopes (a loop's body is one), each with the values bound in
    it: ``scopes`` lists them, the outermost first, as (statements, memo) pairs."""

    def __init__(self) -> None:
        self.scopes: list[tuple[list[Any], dict[Any, Any]]] = [([], {})]
        #: the index in ``scopes`` of the open phase's body (None: no phase is open)
        self._phase: int | None = None
        self._count = 0
        #: how many phases were opened (a value bound inside one is valid in it only)
        self.phase_id = 0
        #: names that depend on the inner index: a loop variable, a coordinate declared
        #: from it, a value computed from those (:meth:`inner`)
        self.inner_names: set[str] = set()

    # ---- names ---------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        """A new name from ``hint`` (a value's name, say), made an identifier; never one of
        the names a writer gives coordinates and loop indices (``x1``, ``r0``, ``j``)."""
        self._count += 1
        hint = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_"
                       for c in hint) or "v"
        if hint in _COORDINATE_HINTS or hint[0].isdigit():
            hint = f"v{hint}"
        return f"{hint}_{self._count}" if hint[-1].isdigit() else f"{hint}{self._count}"

    def inner(self, name: str) -> None:
        """``name`` depends on the inner index (a loop variable, a coordinate of it)."""
        self.inner_names.add(name)

    def forget_inner(self) -> None:
        """No name depends on an inner index any more (a new nest, whose coordinates may
        take the names an earlier nest's inner ones had)."""
        self.inner_names.clear()

    def is_inner(self, e: Code | str) -> bool:
        """Whether expression ``e`` reads a name that depends on the inner index."""
        return not expr.names(e).isdisjoint(self.inner_names)

    def reads_inner(self, statement: Any) -> bool:
        """Whether ``statement`` mentions a name that depends on the inner index."""
        return not statement.names.isdisjoint(self.inner_names)

    # ---- scopes ----------------------------------------------------------------------------
    def open(self) -> None:
        """Open a scope (a loop's body) inside the innermost one."""
        self.scopes.append(([], {}))

    def close(self) -> list[Any]:
        """Close the innermost scope: its statements."""
        return self.scopes.pop()[0]

    def add(self, statement: Any) -> None:
        """``statement`` at the end of the innermost scope (an open phase's body)."""
        self.scopes[-1][0].append(statement)

    def lookup(self, key: Any) -> Any:
        """The value ``key`` is bound to in any scope open (None: in none)."""
        for _, memo in reversed(self.scopes):
            if key in memo:
                return memo[key]
        return None

    def remember(self, key: Any, value: Any, inner: bool) -> None:
        """Bind ``key`` to ``value`` where a statement that is ``inner`` or not goes (the
        open phase's body, or the scope before its loop): :meth:`statement`."""
        self.scopes[self._level(inner)][1][key] = value

    # ---- phases ----------------------------------------------------------------------------
    @property
    def in_phase(self) -> bool:
        return self._phase is not None

    def _outer(self) -> int:
        """The scope statements that are not inner go to: before the phase's loop."""
        return -1 if self._phase is None else self._phase - 1

    def _level(self, inner: bool) -> int:
        """The scope of a statement or value: the open phase's body when ``inner``, else
        :meth:`_outer`."""
        return self._phase if inner and self._phase is not None else self._outer()

    @property
    def lines(self) -> list[Any]:
        """The statements outside the phase (all of them when no phase is open)."""
        return self.scopes[self._outer()][0]

    @lines.setter
    def lines(self, statements: list[Any]) -> None:
        level = self._outer()
        self.scopes[level] = (statements, self.scopes[level][1])

    def statement(self, line: Any, inner: bool) -> None:
        """``line`` in the open phase's body when ``inner``, else before its loop."""
        self.scopes[self._level(inner)][0].append(line)

    def bind(self, text: Any, hint: str, inner: bool,
             line: Callable[[str], Any]) -> tuple[str, bool]:
        """The name bound to ``text`` (an expression's text, or a key naming it) in its
        scope (the open phase's body when ``inner``, the scope before its loop otherwise)
        or a scope around it, binding it there with the statement ``line(name)`` when there
        is none; (name, newly bound)."""
        level = self._level(inner) % len(self.scopes)  # (-1: the innermost, as an index)
        for _, memo in reversed(self.scopes[:level + 1]):
            if text in memo:
                return memo[text], False
        name = self.fresh(hint)
        self.scopes[level][1][text] = name
        self.statement(line(name), inner)
        return name, True

    def forget_values(self) -> None:
        """Values bound before the phase's loop so far are out of scope from here on."""
        self.scopes[self._outer()][1].clear()

    def capture(self, write: Callable[[], None]) -> list[Any]:
        """The statements ``write()`` emits outside a phase, taken out of ``lines``."""
        assert self._phase is None, "capture inside a phase"
        saved, self.lines = self.lines, []
        write()
        captured, self.lines = self.lines, saved
        return captured

    def open_phase(self) -> None:
        """Start a loop over the inner index."""
        assert self._phase is None, "a phase inside a phase"
        self.open()
        self._phase = len(self.scopes) - 1
        self.phase_id += 1

    def close_phase(self) -> list[Any] | None:
        """End the loop: its body (None when no phase is open) for the caller to wrap in
        its loop; the statements hoisted out of it are already before it."""
        if self._phase is None:
            return None
        self._phase = None
        return self.close()
