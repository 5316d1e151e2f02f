"""Size arguments that hold whole expressions, and the dims printed from them.

A kernel's size argument may hold a whole size expression (``"s0*s1"``, ``"s2-s3"``) when
the symbols in it have no argument of their own (a flattened batch, a cache's length
less the tokens before it). :class:`Wholes` prints, from such arguments, the dims and
strides that are not that expression as a whole but follow from it:

- the expression itself, wherever it occurs as a sub-expression (``Max(1, s2-s3)``);
- a part that differs from it by a constant (``s0`` of ``s0+1``: the argument minus 1);
- a product holding all of its factors (``16*A*B`` of ``A*B``: 16 times the argument), or
  those of several (``2*A*B*B`` of ``A`` and ``B``);
- a polynomial equal to ``(c * whole + d) / q`` for ints ``c``, ``d`` and ``q``, the
  whole a polynomial too (``48*s2-48*s3`` of ``s2-s3``: 48 times the argument; ``s0`` of
  ``2*s0``: the argument halved), judged at five pseudo-random
  points (two polynomials of low degree equal there are equal everywhere; floor division,
  ``Max`` and ``Mod`` are left out, being equal at large sizes only, as ``Max(1, s0//20)``
  and ``s0//20`` are).

:class:`~torchloom.codegen.indexing.IndexMath` asks :meth:`Wholes.match` before printing a
sub-expression itself.
"""

from __future__ import annotations

import ast
from fractions import Fraction
from math import lcm
from collections.abc import Callable, Mapping

from torchloom.codegen.expr import PRODUCT, SUM, Code, Literal, Name, Op, paren
from torchloom.ir.symbols import (SymbolicDimError, evaluate, parse_dim, polynomial_tree,
                                  sample_points, symbols_of)


class Wholes:
    """The whole-expression keys of ``names`` (a kernel's size arguments: symbol or
    expression -> argument name)."""

    def __init__(self, names: Mapping[str, str], floor_div: str = "//"):
        self.floor_div = floor_div  # the target language's integer division
        self.symbols = frozenset(k for k in names if k.isidentifier())
        keys = {k: v for k, v in names.items() if not k.isidentifier()}
        self.whole = {ast.unparse(parse_dim(k).body): v for k, v in keys.items()}
        #: a part that differs from a whole expression by a constant (``s0`` of ``s0+1``,
        #: ``s0//20`` of ``s0//20 - 1``) -> its value from the argument, for strides and
        #: dims that name the part (a slice's strides keep the sliced length)
        self.parts = {ast.unparse(part): Op(f"{{0}} {op} {{1}}", SUM, (Name(v), Literal(
            str(c), c))) for k, v in keys.items()
            for part, op, c in [_offset_part(parse_dim(k).body)] if part is not None}
        #: whole expressions that are products, by their factors, the most factors first
        self.products = sorted(((f, v) for k, v in keys.items()
                                for f in [_factors(parse_dim(k).body)] if len(f) > 1),
                               key=lambda p: -len(p[0]))
        #: for the affine rule: each whole expression that is a polynomial (no floor
        #: division, Max or Mod: equal at random points is then equal everywhere), its
        #: symbols and its sample values
        self.affine = [(k, v, frozenset(symbols_of(k)), _samples(k)) for k, v in keys.items()
                       if polynomial_tree(parse_dim(k).body)]

    def __bool__(self) -> bool:
        return bool(self.whole or self.parts)

    def match(self, node: ast.AST, print_: Callable[[ast.AST], Code]) -> Code | None:
        """``node`` (not a symbol with an argument of its own) from a whole-expression
        argument, or None; ``print_`` prints the other factors of a product."""
        text = ast.unparse(node)
        if text in self.whole:
            return Name(self.whole[text])
        if text in self.parts:
            return self.parts[text]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            found = self._product(node, print_)
            if found is not None:
                return found
        if polynomial_tree(node) and any(s not in self.symbols for s in symbols_of(text)):
            return self._affine(text)
        return None

    def _product(self, node: ast.BinOp, print_: Callable[[ast.AST], Code]) -> Code | None:
        """A product holding all factors of one or more whole expressions (each as often
        as it occurs: ``A*B*B`` of ``A`` and ``B``): each argument where its first factor
        was, the other factors in their order. The wholes are taken greedily, the most
        factors first, or each one first in turn where that leaves fewer factors naming a
        symbol without an argument (``s0*s1*s2`` of ``s0*s1``, ``s1*s2`` and ``s0``)."""
        factors = _factors(node)
        best = None  # (factors left without a value, taken, heads): the first fewest
        for order in [self.products] + [[p, *(q for q in self.products if q is not p)]
                                        for p in self.products[1:]]:
            taken, heads = self._cover(factors, order)
            unheld = self._unheld(factors, taken)
            if best is None or unheld < best[0]:
                best = (unheld, taken, heads)
            if unheld == 0:
                break  # (the greedy order usually: the others are not tried)
        _, taken, heads = best
        if not heads:
            return None
        codes = [Name(heads[i]) if i in heads else print_(ast.parse(f, mode="eval").body)
                 for i, f in enumerate(factors) if i in heads or i not in taken]
        code = codes[0]
        for factor in codes[1:]:
            code = Op("{0} * {1}", PRODUCT, (paren(code, PRODUCT), paren(factor, PRODUCT + 1)))
        return code

    @staticmethod
    def _cover(factors: list[str], order) -> tuple[set[int], dict[int, str]]:
        """The factors the wholes of ``order`` (factors, argument) stand for, taken greedily,
        and each argument's first factor -> its name."""
        taken: set[int] = set()
        heads: dict[int, str] = {}
        for whole, name in order:
            while True:
                found: list[int] = []
                for f in whole:
                    at = next((i for i, g in enumerate(factors)
                               if g == f and i not in taken and i not in found), None)
                    if at is None:
                        break
                    found.append(at)
                else:
                    taken.update(found)
                    heads[min(found)] = name
                    continue
                break
        return taken, heads

    def _unheld(self, factors: list[str], taken: set[int]) -> int:
        """How many factors outside ``taken`` name a symbol without an argument."""
        return sum(1 for i, f in enumerate(factors) if i not in taken and
                   any(s not in self.symbols for s in symbols_of(f)))

    def _affine(self, text: str) -> Code | None:
        """``text`` as ``(c * argument + d) / q`` (ints, c not 0, q > 0, the division
        exact) where it is so at every sample point of a polynomial whole expression
        holding all its symbols."""
        names = frozenset(symbols_of(text))
        for key, name, held, samples in self.affine:
            if not names <= held or samples is None:
                continue
            values = _samples(text, held)
            if values is None or samples[0] == samples[1]:
                continue
            slope = Fraction(values[1] - values[0], samples[1] - samples[0])
            offset = values[0] - slope * samples[0]
            if slope == 0 or any(e != slope * w + offset for w, e in zip(samples, values)):
                continue
            q = lcm(slope.denominator, offset.denominator)
            c, d = int(slope * q), int(offset * q)
            code: Code = Name(name)
            if c != 1:
                code = Op("{0} * {1}", PRODUCT, (Literal(str(c), c), code)) if c > 0 else \
                    Op("-{0} * {1}", SUM, (Literal(str(-c), -c), code))
            if d:
                code = Op(f"{{0}} {'+' if d > 0 else '-'} {{1}}", SUM,
                          (code, Literal(str(abs(d)), abs(d))))
            if q != 1:  # exact: (c * argument + d) is q times an int at every size
                code = Op(f"{{0}} {self.floor_div} {{1}}", PRODUCT,
                          (paren(code, PRODUCT), Literal(str(q), q)))
            return code
        return None


def _samples(dim: str, symbols: frozenset[str] | None = None) -> tuple[int, ...] | None:
    """``dim`` at five pseudo-random points of ``symbols`` (its own by default), each
    symbol's value fixed by its name and the point; None where it cannot be evaluated."""
    values = []
    for point in sample_points(symbols if symbols is not None else symbols_of(dim), 5,
                               salt="whole "):
        try:
            values.append(evaluate(dim, point))
        except (SymbolicDimError, ZeroDivisionError):
            return None
    return tuple(values)


def _factors(node: ast.AST) -> list[str]:
    """The factors of a product (``16*A*B``: ``16``, ``A``, ``B``) as printed text; one
    factor for anything else."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left) + _factors(node.right)
    return [ast.unparse(node)]


def _offset_part(e: ast.AST) -> tuple[ast.AST | None, str, int]:
    """(``part``, op, c) where expression ``e`` is ``part + c`` or ``part - c`` (c a
    positive int): ``part`` is then ``e - c`` (op ``-``) or ``e + c`` (``+``); (None, "",
    0) for another expression."""
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
        for part, other, flip in ((e.left, e.right, False), (e.right, e.left, True)):
            if isinstance(other, ast.Constant) and type(other.value) is int and \
                    other.value > 0 and not (flip and isinstance(e.op, ast.Sub)):
                return part, "-" if isinstance(e.op, ast.Add) else "+", other.value
    return None, "", 0


__all__ = ["Wholes"]
