"""Triton for the statement IR (``torchloom.api.stmt``): each statement's lines of Python.

A kernel writer builds statements (``Assign`` for every ``name = expr``, ``Store`` for a
``tl.store``, ``Loop`` for a ``for ... in range(...)``, ``Unpack`` for ``a, b = ...``, a
line binding several names at once); :func:`stmt.drop_unused` removes the assignments
nothing reads, and only then are they printed here.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchloom.api import stmt

#: a nested statement's indent
INDENT = "    "


def _assign(s: stmt.Assign) -> list[str]:
    return [f"{s.name} = {s.expr}"]


def _store(s: stmt.Store) -> list[str]:
    """``tl.store(pointer + offset, value[, mask])``: the offset as the writer spelled the
    address (a kernel's outputs parenthesise theirs, a scratch buffer's do not)."""
    args = [f"{s.target.pointer} + {s.target.offset}", str(s.value)]
    return [f"tl.store({', '.join(args + ([str(s.mask)] if s.mask is not None else []))})"]


def _unpack(s: stmt.Unpack) -> list[str]:
    return [f"{', '.join(s.targets)} = {s.expr}"]


def _raw(s: stmt.Raw) -> list[str]:
    return [s.text]


def _loop(s: stmt.Loop) -> list[str]:
    bounds = [str(b) for b in (s.start, s.end, *(() if s.step is None else (s.step,)))]
    return [f"for {s.var} in range({', '.join(bounds)}):", *indented(render([*s.head,
                                                                             *s.body]))]


_RENDER = {stmt.Assign: _assign, stmt.Unpack: _unpack, stmt.Store: _store, stmt.Raw: _raw,
           stmt.Loop: _loop}


def render(statements: Sequence[stmt.Statement]) -> list[str]:
    """The Triton lines of ``statements``, nested ones indented by four spaces."""
    return [line for s in statements for line in _RENDER[type(s)](s)]


def indented(lines: Sequence[str]) -> list[str]:
    return [INDENT + line for line in lines]


def function(name: str, params: Sequence[str], statements: Sequence[stmt.Statement]
             ) -> str:
    """A ``@triton.jit`` function ``name(params)`` whose body is ``statements`` less the
    assignments nothing reads."""
    return "\n".join(["@triton.jit", f"def {name}({', '.join(params)}):",
                      *indented(render(stmt.drop_unused(statements)))])
