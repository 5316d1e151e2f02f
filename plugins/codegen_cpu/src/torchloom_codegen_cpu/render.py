"""C for the statement IR (``torchloom.api.stmt``): each statement's text, and the facts
about statements only C knows (which calls are costly, which declarations divide
integers, what a SIMD loop's pragma says).
"""

from __future__ import annotations

import attrs

from torchloom.api import expr, stmt

from torchloom_codegen_cpu.libmvec import VECTOR_MATH
from torchloom_codegen_cpu.ops import CTYPE

#: the value an accumulation masked off adds (see :func:`stmt.masked`)
_NEUTRAL = {"+=": "0", "*=": "1", "|=": "0"}
#: C types of integers (a declaration of one that divides may divide by zero)
_INTEGERS = frozenset({"int", *(c for c in CTYPE.values() if c not in ("float", "double"))})
#: the loop variable's type
_INDEX = "int64_t"


#: an expression's text, in parentheses unless it is a name or a literal
par = expr.par


@attrs.frozen
class Simd:
    """``#pragma omp simd`` with its reduction clauses (``(operator, accumulators)``) and
    ``simdlen``."""

    reductions: tuple[tuple[str, tuple[str, ...]], ...] = ()
    simdlen: int | None = None

    def text(self) -> str:
        clauses = [f"reduction({op}:{','.join(names)})" for op, names in self.reductions]
        if self.simdlen is not None:
            clauses.append(f"simdlen({self.simdlen})")
        return " ".join(["#pragma omp simd", *clauses])

    @property
    def names(self) -> frozenset[str]:
        return frozenset(n for _, names in self.reductions for n in names)

    def min_max(self) -> bool:
        """Whether it reduces with max or min (gcc runs such a loop's remainder scalar)."""
        return any(op in ("max", "min") for op, _ in self.reductions)


@attrs.frozen
class Pragma:
    """An OpenMP pragma other than SIMD before a loop or a block: a parallel loop, a
    parallel region, a loop of a region shared out or run by one thread (``line``: its
    text)."""

    line: str

    def text(self) -> str:
        return self.line

    @property
    def names(self) -> frozenset[str]:
        return stmt.lexed(self.line).names


#: the template of C's conditional expression (:func:`ternary`)
_TERNARY = "{0} ? {1} : {2}"


def ternary(cond: expr.Code, a: expr.Code, b: expr.Code) -> expr.Code:
    """C's ``cond ? a : b``, binding least of all: a branch needs no parentheses (C reads
    ``c ? a : d ? b : e`` as ``c ? a : (d ? b : e)``), a condition that is itself a
    conditional does."""
    nested = isinstance(cond, expr.Op) and cond.template == _TERNARY
    return expr.Op(_TERNARY, expr.LOWEST, (expr.paren(cond, expr.ATOM if nested else
                                                      expr.LOWEST), a, b))


#: a comparison, ``a < b`` (the core's: C spells it as Python does)
compare = expr.compare


def every(conditions: list[expr.Code]) -> expr.Code:
    """``a && b && ...``: conditions (comparisons, binding tighter) that all hold."""
    fields = " && ".join(f"{{{k}}}" for k in range(len(conditions)))
    return expr.Op(fields, expr.LOWEST, tuple(conditions))


def smaller(a: expr.Code, b: expr.Code) -> expr.Code:
    """``a < b ? a : b``, the smaller of two integers (a block's end clipped to the
    range's)."""
    return ternary(compare("<", a, b), a, b)


def element(e: stmt.Element) -> str:
    return f"{e.pointer}[{e.offset}]"


def _target(target: str | stmt.Element) -> str:
    return target if isinstance(target, str) else element(target)


def _declare(s: stmt.Declare) -> list[str]:
    return [f"const {s.ctype} {s.name} = {s.expr};"]


def _var(s: stmt.Var) -> list[str]:
    return [f"{s.ctype} {s.name} = {s.expr};"]


def _array(s: stmt.Array) -> list[str]:
    return [f"{s.ctype} {s.name}[{s.expr}];"]


def _store(s: stmt.Store) -> list[str]:
    t = element(s.target)
    if s.mask is None:
        return [f"{t} = {s.value};"]
    # the lanes masked off write back what they read (see row_loops._blocks)
    return [f"{t} = {s.mask} ? {par(s.value)} : {t};"]


def _update(s: stmt.Update) -> list[str]:
    t = _target(s.target)
    if s.mask is None:
        return [f"{t} {s.op} {s.value};"]
    if s.op == "=":  # a value set where the mask holds, kept elsewhere
        return [f"{t} = {s.mask} ? {par(s.value)} : {t};"]
    return [f"{t} {s.op} {s.mask} ? {par(s.value)} : {_NEUTRAL[s.op]};"]


def _select(s: stmt.Select) -> list[str]:
    t = _target(s.target)
    if s.mask is None:
        return [f"{t} = {s.cond} ? {s.value} : {t};"]
    return [f"{t} = {s.mask} && ({s.cond}) ? {s.value} : {t};"]


def _raw(s: stmt.Raw) -> list[str]:
    return [s.text]


def _loop(s: stmt.Loop) -> list[str]:
    lines = [] if s.annotation is None else [s.annotation.text()]
    v = s.var
    lines.append(f"for ({_INDEX} {v} = {s.start}; {v} < {s.end}; {v}++) {{")
    lines += indented(render([*s.head, *s.body]))
    return [*lines, "}"]


def _block(s: stmt.Block) -> list[str]:
    lines = [] if s.annotation is None else [s.annotation.text()]
    return [*lines, "{", *indented(render(s.body)), "}"]


def _if(s: stmt.If) -> list[str]:
    nest = (lambda lines: lines) if s.flat else indented
    lines = [f"if ({s.cond}) {{", *nest(render(s.then))]
    if s.orelse is not None:
        lines += ["} else {", *nest(render(s.orelse))]
    return [*lines, "}"]


_RENDER = {stmt.Declare: _declare, stmt.Var: _var, stmt.Array: _array, stmt.Store: _store,
           stmt.Update: _update, stmt.Select: _select, stmt.Raw: _raw, stmt.Loop: _loop,
           stmt.If: _if, stmt.Block: _block}


def render(statements) -> list[str]:
    """The C lines of ``statements``, nested ones indented by two spaces."""
    return [line for s in statements for line in _RENDER[type(s)](s)]


def indented(lines: list[str]) -> list[str]:
    return ["  " + line for line in lines]


#: the prelude's functions that are one instruction: a fused multiply-add
_ONE_INSTRUCTION = frozenset({"tl_fma", "tl_fmaf"})


def costly(s) -> bool:
    """Whether a statement calls a costly function (a transcendental, the prelude's but a
    multiply-add): see ``row_loops._cheap``."""
    return any(name.startswith("tl_") and len(name) > 3 and name not in _ONE_INSTRUCTION or
               name in VECTOR_MATH or name.endswith("f") and name[:-1] in VECTOR_MATH
               for name in s.facts.calls)


def divides_integers(s) -> bool:
    """Whether a declaration of an integer divides (or takes a remainder) anywhere: a
    node of its expression spells ``/`` or ``%`` (an op in its template, opaque text or a
    literal in its text: a size converted to a constant may divide)."""
    return isinstance(s, stmt.Declare) and s.ctype in _INTEGERS and any(
        "/" in spelt or "%" in spelt for spelt in map(_own_text, expr.walk(s.expr)))


def _own_text(node: expr.Code) -> str:
    """What ``node`` itself spells, its operands' text left out (an op's template)."""
    return node.template if isinstance(node, expr.Op) else node.text


def in_block(before: list, statements: list) -> list:
    """``statements`` after ``before`` (a nest's declarations), in a block of their own."""
    return [stmt.Block((*before, *statements))] if before else list(statements)


#: libm functions the op tables call (``f``-suffixed in f32): none has a side effect
_LIBM = frozenset({"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos",
                   "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "atan2", "asinh",
                   "acosh", "atanh", "erf", "erfc", "sqrt", "cbrt", "pow", "fabs", "floor",
                   "ceil", "trunc", "nearbyint", "round", "fmin", "fmax", "fmod", "copysign",
                   "hypot", "isnan", "isinf"})


def pure(facts: stmt.Scan) -> bool:
    """Whether a declaration gives one value wherever it runs in its nest: it calls the
    prelude's functions (``tl_``) and libm's only, and reads the kernel's inputs."""
    return all(c.startswith("tl_") or c in _LIBM or (c.endswith("f") and c[:-1] in _LIBM)
               for c in facts.calls) and all(e.pointer.startswith("in_")
                                             for e in facts.elements)
