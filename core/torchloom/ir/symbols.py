"""Symbolic sizes: a dim that is not an int is a symbol (``s0``) or an expression of
symbols as torch's ShapeEnv prints it (``2*s0``, ``s0*s1``, ``(s0//2)``, ``Max(s0, s1)``).

Expressions are data read back from IR text, so they are never handed to ``eval`` or to
sympy's parser: :func:`parse_dim` accepts integer arithmetic (``+ - * // / % **``, unary
minus) over symbols and int literals, and the calls in :data:`FUNCTIONS`, and nothing
else. The runtime evaluates them with the symbols bound from the actual inputs
(:func:`evaluate`, or :func:`python_source` compiled once into a guard).

A symbol is any identifier but a function's name (torch names backed sizes ``s0``,
``s27`` and unbacked ones ``u3``; IR written by hand may say ``N``). :func:`rename_dim`
renames them (the canonical form
numbers symbols by first appearance, so that graphs equal up to their symbols' names
share a kernel and a compile-cache entry).
"""

from __future__ import annotations

import ast
import functools
import math
import random
import re
from fractions import Fraction
from typing import Callable, Mapping, Sequence, Union

Dim = Union[int, str, None]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _floor_div(a, b):
    return math.floor(Fraction(a) / Fraction(b))


def _ceil_div(a, b):
    return math.ceil(Fraction(a) / Fraction(b))


def _mod(a, b):
    return a - b * math.floor(Fraction(a) / Fraction(b))


#: function name in torch's printed expressions -> its integer meaning
FUNCTIONS: dict[str, Callable] = {
    "Max": max, "Min": min, "Abs": abs,
    "floor": math.floor, "ceiling": math.ceil, "TruncToInt": math.trunc,
    "CeilToInt": math.ceil, "FloorToInt": math.floor,  # math.ceil(h / 2) of a size h
    "FloorDiv": _floor_div, "CleanDiv": _floor_div, "CeilDiv": _ceil_div,
    "Mod": _mod, "PythonMod": _mod, "IntTrueDiv": lambda a, b: Fraction(a) / Fraction(b),
}

_BINOPS: dict[type, Callable] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: _floor_div, ast.Div: lambda a, b: Fraction(a) / Fraction(b),
    ast.Mod: _mod, ast.Pow: lambda a, b: a ** b,
}


class SymbolicDimError(ValueError):
    """A dim's text is not an expression :func:`parse_dim` accepts."""


def symbols_of(dim: Dim) -> list[str]:
    """The symbols ``dim`` names, in order of first appearance."""
    if not isinstance(dim, str):
        return []
    return list(dict.fromkeys(w for w in _IDENT.findall(dim) if w not in FUNCTIONS))


def is_symbol(dim: Dim) -> bool:
    """Whether ``dim`` is one bare symbol (``s0``), not an expression of symbols."""
    return isinstance(dim, str) and _IDENT.fullmatch(dim) is not None and dim not in FUNCTIONS


def rename_dim(dim: Dim, names: Mapping[str, str]) -> Dim:
    """``dim`` with each symbol renamed through ``names`` (symbols not in it unchanged)."""
    if not isinstance(dim, str):
        return dim
    return _IDENT.sub(lambda m: names.get(m.group(0), m.group(0)), dim)


def _shown(text: str) -> str:
    """``text`` quoted for a message, its middle left out when it is long (a hostile dim
    can be thousands of characters)."""
    return repr(text if len(text) <= 80 else f"{text[:40]}...{text[-20:]}")


@functools.lru_cache(maxsize=4096)
def parse_dim(text: str) -> ast.Expression:
    """The checked syntax tree of a dim expression; :class:`SymbolicDimError` when it is
    anything but integer arithmetic over symbols, int literals and :data:`FUNCTIONS`."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise SymbolicDimError(f"dim {_shown(text)} is not an expression: {exc.msg}") from None
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.Load)) or type(node) in _BINOPS:
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and not (
                isinstance(node.right, ast.Constant) and 0 <= node.right.value <= 64):
            raise SymbolicDimError(f"dim {_shown(text)}: a power's exponent must be an int "
                                   f"literal from 0 to 64")
        if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd)):
            continue
        if isinstance(node, ast.Constant) and type(node.value) is int:
            continue
        if isinstance(node, ast.Name) and (node.id in FUNCTIONS) == (id(node) in called):
            continue  # a symbol, or a function being called
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in FUNCTIONS and not node.keywords:
            continue
        raise SymbolicDimError(f"dim {_shown(text)}: {type(node).__name__} is not allowed in a "
                               f"size expression")
    return tree


def evaluate(dim: Dim, bindings: Mapping[str, int]) -> int | None:
    """The value of ``dim`` with its symbols bound; None for an unknown dim (``?``) or a
    symbol ``bindings`` lacks."""
    if dim is None or isinstance(dim, int):
        return dim
    if any(s not in bindings for s in symbols_of(dim)):
        return None
    value = _eval(parse_dim(dim).body, bindings)
    if isinstance(value, Fraction):
        if value.denominator != 1:
            raise SymbolicDimError(f"dim {dim!r} is {value}, not an integer")
        value = int(value)
    return value


def _eval(node: ast.AST, env: Mapping[str, int]):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, env)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        return _BINOPS[type(node.op)](_eval(node.left, env), _eval(node.right, env))
    return FUNCTIONS[node.func.id](*(_eval(a, env) for a in node.args))


def sample_points(names, count: int, small_last: bool = False,
                  salt: str = "") -> list[dict[str, int]]:
    """``count`` pseudo-random points of the symbols ``names``, each symbol's value fixed
    by its name, the point's index and ``salt`` (a symbol takes the same value wherever it
    is drawn, whatever other symbols are): from 2 to 2**20, the last point from 8 to 63
    where ``small_last`` (sizes equal only past a threshold are told apart there:
    ``64 - Max(0, 64 - s)``, the last ``s`` of 64 positions, is ``s`` only below 64)."""
    def bounds(k: int) -> tuple[int, int]:
        return (8, 64) if small_last and k == count - 1 else (2, 1 << 20)
    return [{s: random.Random(f"{salt}{k}:{s}").randrange(*bounds(k)) for s in sorted(names)}
            for k in range(count)]


def polynomial_tree(node: ast.AST) -> bool:
    """Whether the expression ``node`` (of :func:`parse_dim`'s tree) is built of symbols
    and ints by ``+``, ``-`` and ``*`` only."""
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)) and \
            polynomial_tree(node.left) and polynomial_tree(node.right)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.UAdd)) and polynomial_tree(node.operand)
    return isinstance(node, ast.Name) or (isinstance(node, ast.Constant) and
                                          type(node.value) is int)


@functools.lru_cache(maxsize=4096)
def is_polynomial(dim: Dim) -> bool:
    """Whether ``dim`` is an int, or symbols and ints joined by ``+``, ``-`` and ``*`` only
    (:func:`polynomial_tree`): two such dims equal at a few pseudo-random points are equal
    at every size. A dim with a function (``Max``, ``Min``, ``Mod``), a division or a power
    may equal another only past a threshold (:func:`agree_at_small_sizes`)."""
    if not isinstance(dim, str):
        return True
    try:
        return polynomial_tree(parse_dim(dim).body)
    except SymbolicDimError:
        return False


#: sizes every symbol takes at once where dims with thresholds are compared (besides the
#: int constants of the dims themselves, each one below and one above)
SMALL_SIZES = (2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129)


def small_size_points(dims: Sequence[Dim]) -> list[dict[str, int]]:
    """Points of the symbols of ``dims`` where thresholds bite: every symbol at once at
    each of :data:`SMALL_SIZES` and at each int constant ``c`` of the dims (``c - 1``,
    ``c``, ``c + 1``: ``Min(8, s)`` turns at 8), then the symbols at staggered small sizes
    (the ``k``-th at ``2 + k`` and ``9 + k``)."""
    names = sorted({s for d in dims for s in symbols_of(d)})
    values = set(SMALL_SIZES)
    for d in dims:
        if isinstance(d, str):
            for node in ast.walk(parse_dim(d)):
                if isinstance(node, ast.Constant) and type(node.value) is int and \
                        2 <= node.value <= 1 << 40:
                    values |= {node.value - 1, node.value, node.value + 1}
    points = [{s: v for s in names} for v in sorted(v for v in values if v >= 2)]
    return points + [{s: base + k for k, s in enumerate(names)} for base in (2, 9)]


@functools.lru_cache(maxsize=4096)
def agree_at_small_sizes(a: Dim, b: Dim) -> bool:
    """Whether dims ``a`` and ``b``, known equal at pseudo-random points, are equal where
    thresholds bite too (:func:`small_size_points`): at once where both are polynomials
    (:func:`is_polynomial`). ``Max(1, Min(8, s))``, the rows of a chunk of at most 8 (the
    last one shorter), is 8 at every point from 8 up, yet 2 at ``s = 2``. False where
    either cannot be evaluated at one of the points (a verdict of equal must hold at
    every size)."""
    if is_polynomial(a) and is_polynomial(b):
        return True
    try:
        return all(evaluate(a, p) == evaluate(b, p) for p in small_size_points((a, b)))
    except (SymbolicDimError, ZeroDivisionError, OverflowError):
        return False


def symbolic_contiguous(shape, strides) -> bool:
    """Whether symbolic ``strides`` are the row-major ones of ``shape`` (dims of size 1
    aside, as torch's ``is_contiguous``): equal at four pseudo-random points with every
    symbol > 1 (the last with symbols below 64), which two different polynomials of sizes
    practically never are, and at small sizes too where a dim has a threshold
    (``Min(8, s)``: :func:`small_size_points`). No symbolic algebra runs, so any printed
    form torch gives (``32*s0``, ``s0*32``) agrees.
    Only a dim that is the int 1 (or 0) excuses its stride: a symbolic dim that is 1 at
    every point drawn may be 2 at another (``X // CeilToInt(X / 2)`` is 1 for odd ``X``,
    2 for even: MobileViT's patch grid, whose transposed gradient was taken for
    contiguous and its copy dropped).
    False when a dim or stride is unknown or cannot be evaluated."""
    if len(shape) != len(strides) or None in shape or None in strides:
        return False
    names = {s for d in (*shape, *strides) for s in symbols_of(d)}
    try:
        points = sample_points(names, 4, small_last=True, salt="contiguous ")
        if not all(is_polynomial(d) for d in (*shape, *strides)):
            points += small_size_points((*shape, *strides))  # (agree_at_small_sizes)
        for point in points:
            expected = 1
            for d, stride in zip(reversed(shape), reversed(strides)):
                size = evaluate(d, point)
                if (size > 1 or type(d) is not int) and evaluate(stride, point) != expected:
                    return False
                expected *= max(size, 1)
    except (SymbolicDimError, ZeroDivisionError, OverflowError):
        return False
    return True


def python_source(dim: Dim, local_of: Callable[[str], str]) -> str:
    """A Python expression computing ``dim``: symbols read the locals ``local_of(symbol)``
    names, functions are ``_sym_<name>`` (bind them with :func:`guard_namespace`). Built
    from the checked tree, so it contains nothing :func:`parse_dim` does not accept."""
    if isinstance(dim, int):
        return repr(dim)
    if is_symbol(dim):
        return local_of(dim)
    tree = parse_dim(dim)

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name):
            new = f"_sym_{node.id}" if node.id in FUNCTIONS else local_of(node.id)
            return ast.copy_location(ast.Name(new, ast.Load()), node)

        def visit_BinOp(self, node: ast.BinOp):
            self.generic_visit(node)
            if isinstance(node.op, (ast.FloorDiv, ast.Div, ast.Mod)):  # exact, as sympy's
                name = {ast.FloorDiv: "FloorDiv", ast.Div: "IntTrueDiv", ast.Mod: "Mod"}[
                    type(node.op)]
                return ast.copy_location(ast.Call(ast.Name(f"_sym_{name}", ast.Load()),
                                                  [node.left, node.right], []), node)
            return node

    exact = not any(isinstance(n, (ast.Div, ast.Pow)) or
                    (isinstance(n, ast.Name) and n.id == "IntTrueDiv") for n in ast.walk(tree))
    body = Rename().visit(ast.parse(ast.unparse(tree), mode="eval")).body
    text = ast.unparse(ast.fix_missing_locations(body))
    # integers in, integers out: only a true division or a power can give a non-integer
    return f"({text})" if exact else f"_sym_int({text})"


def bind_symbols(shapes: Sequence[Sequence[Dim] | None]) -> dict[str, tuple[int, int]]:
    """Where each symbol's value is read: symbol -> ``(i, k)``, the first dim ``k`` of the
    first shape ``i`` that is that bare symbol (``shapes[i]`` None: not a tensor, skipped).
    Symbols that only appear inside expressions (``2*s0``) are not bound."""
    bound: dict[str, tuple[int, int]] = {}
    for i, shape in enumerate(shapes):
        for k, d in enumerate(shape or ()):
            if is_symbol(d) and d not in bound:
                bound[d] = (i, k)
    return bound


def _to_int(value) -> int:
    if isinstance(value, Fraction):
        if value.denominator != 1:
            raise SymbolicDimError(f"a size expression gave {value}, not an integer")
        return int(value)
    return value


def guard_namespace() -> dict[str, Callable]:
    """The functions :func:`python_source` expressions call."""
    return {"_sym_int": _to_int, **{f"_sym_{k}": v for k, v in FUNCTIONS.items()}}


__all__ = ["Dim", "FUNCTIONS", "SymbolicDimError", "symbols_of", "is_symbol",
           "rename_dim", "parse_dim", "evaluate", "python_source", "guard_namespace",
           "symbolic_contiguous", "bind_symbols"]
