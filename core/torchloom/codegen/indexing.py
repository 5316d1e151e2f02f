"""Index math for the native codegens: coordinates, offsets and sizes as expression nodes.

A coordinate is an expression of :mod:`torchloom.codegen.expr`, one per dim: a
:class:`~torchloom.codegen.expr.Name` (``x0``), :data:`ZERO`, or an
:class:`~torchloom.codegen.expr.Op` tree over them (``r / 8 % 4``) that prints in the target
language; callers may pass names as strings (:func:`node`). Views never move data: a
view's element at output coordinates is its input's element at coordinates these functions
compute (tinygrad's ShapeTracker idea, done eagerly on expression trees). Dims of size 1
always have coordinate :data:`ZERO` (:func:`is_zero`). What the math returns is a tree,
never text to parse again: a writer puts it in its statements as it is (the offset of a
``Store``'s element, an operand of a load).

Dims are ints or size expressions (``"s0"``, ``"2*s0"``; see :mod:`torchloom.ir.symbols`).
A symbolic dim prints as source text over the kernel's runtime size arguments, and is never
assumed to be 1 or 0: the text computed for it is right at every runtime size. Facts about
symbolic dims that decide the text (two products are equal, which is larger) are judged by
evaluating them at pseudo-random points, as ``symbols.symbolic_contiguous`` does.

One object per kernel, bound to a language and to the names of its size arguments::

    ix = IndexMath(C, {"s0": "S_0"})     # or TRITON; symbols not named print as themselves
    ix.size("2*s0")                      # "2 * S_0"
    ix.delinear("x", (4, "s0"))          # nodes printing ("x / S_0", "x % S_0")
    ix.linear(("a", "b"), (4, "s0"))     # a node printing "a * S_0 + b"
    ix.address(coords, strides, shape)   # offset of an element (strides None: contiguous)
    ix.broadcast(coords, out_shape, in_shape)
    ix.reshape(coords, out_shape, in_shape)
    ix.view_coords(rule, coords, attrs, out_shape, in_shape, known, output)

``known`` (optional, a dict the caller keeps per kernel, filled by :meth:`IndexMath.remember`
and the math itself) remembers which linear index a set of coordinates was delinearised
from, so linearising them again gives that index back (keyed by the coordinates' printed
text: two trees that print alike are one coordinate).
Module functions work on dims without printing: :func:`checked_tensor_type` (a value's type
when a native codegen can touch it), :func:`prod` (a product, an int when every
factor is one), :func:`same` (equal at every runtime size; :func:`same_shape`, every dim so) and :func:`sample_value` (a
dim's value at a representative size, for choices that only cost speed). What the math
cannot express raises :class:`Unsupported` with the reason (a codegen declines the group with it).
Division and modulo are exact for the non-negative operands sizes and indices are.
"""

from __future__ import annotations

import ast
from collections.abc import Container, Mapping, Sequence
from typing import Any

import attrs

from torchloom.codegen.coords import ZERO, Coords, enclosed, is_zero, key, node, operand, total
from torchloom.codegen.known_runs import fold_runs, known_runs as _known_runs
from torchloom.codegen.samples import (Unsupported, points as _points, prod, same, same_shape,
                                       sample_value, view_groups as _view_groups)
from torchloom.codegen.wholes import Wholes
from torchloom.codegen.expr import (ATOM, LOWEST, POSTFIX, PRODUCT, SUM, Code, Literal, Name,
                                    Op, paren, substitute)
from torchloom.ir.graph import Value
from torchloom.ir.symbols import Dim, parse_dim
from torchloom.ir.types import TensorType

#: (coords' texts, shape) with size-1 dims dropped -> the index they were delinearised from
Known = dict[tuple[tuple[str, ...], tuple[Dim, ...]], Code]


def checked_tensor_type(v: Value, storage: Container[str], scalar_reason: str) -> TensorType:
    """``v``'s TensorType when a native codegen can touch it: sizes and strides known (int or
    symbolic) and a dtype in ``storage``; else :class:`Unsupported` with the reason
    (``scalar_reason`` follows "%v is a scalar (kind); " for a scalar value)."""
    t = v.type
    if not isinstance(t, TensorType):
        raise Unsupported(f"%{v.name} is a scalar ({t.kind}); {scalar_reason}")
    if None in t.shape or (t.strides is not None and None in t.strides):
        raise Unsupported(f"%{v.name} has a dim of unknown size {list(t.shape)}")
    if t.dtype not in storage:
        raise Unsupported(f"dtype {t.dtype} of %{v.name} is not supported")
    return t


@attrs.frozen
class Language:
    """How a target language writes integer arithmetic on sizes and indices."""

    name: str
    floor_div: str  # the integer division operator
    #: size-expression function -> template over its (parenthesised) arguments, ``{0}``,
    #: ``{1}``: an :class:`~torchloom.codegen.expr.Op`'s
    functions: Mapping[str, str]
    #: (narrow, wide): casts of an index to a 32-bit integer and of a coordinate back, for
    #: dividing indices below :data:`NARROW_LIMIT` by sizes that are not powers of two; None:
    #: the index's own type
    narrow: tuple[str, str] | None = None


#: indices below this divide in 32 bits where the language says how (:meth:`IndexMath.delinear`;
#: a loop may run a vector past a row's end: far below 2^31)
NARROW_LIMIT = 2 ** 30

C = Language("c", "/", {"Max": "({0} > {1} ? {0} : {1})", "Min": "({0} < {1} ? {0} : {1})",
                        "Abs": "({0} < 0 ? -{0} : {0})"},
             ("(int32_t){0}", "(int64_t)({0})"))
TRITON = Language("triton", "//", {"Max": "tl.maximum({0}, {1})",
                                   "Min": "tl.minimum({0}, {1})", "Abs": "tl.abs({0})"})
#: size expressions themselves (``symbols``' grammar): dims renamed to the size arguments
SYMBOLS = Language("symbols", "//", {"Max": "Max({0}, {1})", "Min": "Min({0}, {1})",
                                     "Abs": "Abs({0})"})


def _power_of_two(d: Dim) -> bool:
    """Whether size ``d`` is a power of two (a shift and a mask: no division to narrow)."""
    return isinstance(d, int) and d > 0 and d & (d - 1) == 0


def memory_order(t: TensorType) -> tuple[int, ...]:
    """Dims of ``t`` from outermost to innermost in memory (logical order among equal
    strides; symbolic strides compared at a representative size)."""
    strides = t.actual_strides()
    if strides is None:  # symbolic and contiguous
        return tuple(range(len(t.shape)))
    return tuple(sorted(range(len(t.shape)),
                        key=lambda d: (-abs(sample_value(strides[d])), d)))


_PRECEDENCE = {ast.Add: SUM, ast.Sub: SUM, ast.Mult: PRODUCT, ast.FloorDiv: PRODUCT,
               ast.Mod: PRODUCT}


class IndexMath:
    """Index math for one kernel: ``language`` and ``names`` (symbol -> the source name of
    the runtime size argument holding it). See the module docstring.

    A key of ``names`` may also be a size expression (``"s0*s1"``: an argument holding the
    product, when the factors have no argument of their own): wherever it occurs as a whole
    in a dim, it prints as that name. With ``names`` given, a symbol it does not cover is
    :class:`Unsupported` (the kernel has no value for it)."""

    def __init__(self, language: Language, names: Mapping[str, str] | None = None):
        self.language = language
        self.strict = names is not None
        self.names = dict(names or {})
        self.wholes = Wholes(self.names, language.floor_div)  # whole-expression arguments

    # ---- sizes -------------------------------------------------------------------------
    def size(self, dim: Dim) -> str:
        """Source text computing ``dim`` from the size arguments."""
        return self.size_code(dim).text

    def size_code(self, dim: Dim) -> Code:
        """``dim`` as an expression node (:mod:`torchloom.codegen.expr`): a literal for an
        int, a name for a size argument, an op over its operands' nodes (parenthesised by
        precedence) for the rest."""
        if isinstance(dim, int):
            return Literal(str(dim), dim)
        if dim is None:
            raise Unsupported("a dim of unknown size")
        return self._print(parse_dim(dim).body)

    def _print(self, node: ast.AST) -> Code:
        if isinstance(node, ast.Constant):
            if node.value >= 0:
                return Literal(str(node.value), node.value)
            return Op("-{0}", LOWEST, (Literal(str(-node.value), -node.value),))
        if self.wholes and not (isinstance(node, ast.Name) and node.id in self.names):
            found = self.wholes.match(node, self._print)
            if found is not None:
                return found
        if isinstance(node, ast.Name):
            if self.strict and node.id not in self.names:
                raise Unsupported(f"size symbol {node.id} has no value in the kernel (it is "
                                  f"no dim of a group input)")
            return Name(self.names.get(node.id, node.id))
        if isinstance(node, ast.UnaryOp):
            operand = self._print(node.operand)
            if isinstance(node.op, ast.UAdd):
                return operand
            return Op("-{0}", LOWEST, (paren(operand, POSTFIX),))
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                # (a base that is a division is whole in each factor: (a / 2) * (a / 2))
                base = paren(self._print(node.left), PRODUCT + 1)
                n = node.right.value
                return Op(" * ".join(["{0}"] * n), PRODUCT, (base,)) if n else Literal("1", 1)
            level = _PRECEDENCE.get(type(node.op))
            if level is None:
                raise Unsupported(f"size expression {ast.unparse(node)!r}: true division")
            op = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Mod: "%",
                  ast.FloorDiv: self.language.floor_div}[type(node.op)]
            left = paren(self._print(node.left), level)
            right = paren(self._print(node.right), level + 1)
            return Op(f"{{0}} {op} {{1}}", level, (left, right))
        name = node.func.id
        div = self.language.floor_div
        inner = node.args[0] if len(node.args) == 1 else None
        if name in ("CeilToInt", "FloorToInt") and isinstance(inner, ast.Call) and \
                inner.func.id == "IntTrueDiv" and len(inner.args) == 2:
            # math.ceil(h / 2) of a size: a ceiling (floor) division of non-negative sizes
            a, b = (paren(self._print(x), POSTFIX) for x in inner.args)
            if name == "FloorToInt":
                return Op(f"{{0}} {div} {{1}}", PRODUCT, (a, b))
            return Op(f"({{0}} + {{1}} - 1) {div} {{1}}", PRODUCT, (a, b))
        args = [paren(self._print(a), POSTFIX) for a in node.args]
        if name in ("FloorDiv", "CleanDiv") and len(args) == 2:
            return Op(f"{{0}} {div} {{1}}", PRODUCT, args)
        if name in ("Mod", "PythonMod") and len(args) == 2:
            return Op("{0} % {1}", PRODUCT, args)
        if name == "CeilDiv" and len(args) == 2:
            return Op(f"({{0}} + {{1}} - 1) {div} {{1}}", PRODUCT, args)
        template = self.language.functions.get(name)
        if template is None or len(args) < (1 if name == "Abs" else 2):
            raise Unsupported(f"size expression {ast.unparse(node)!r}: {name} has no "
                              f"{self.language.name} form")
        level = ATOM if enclosed(template) else POSTFIX  # C's (a > b ? a : b): a whole
        e = args[0]  # the language's templates are positional: {0}, {1}
        for arg in args[1:] or [None]:  # Max(a, b, c) = Max(Max(a, b), c)
            e = Op(template, level, (e,) if arg is None else (e, arg))
        return e

    def remember(self, known: Known, coords: Sequence[Code | str], shape: Sequence[Dim],
                 index: Code | str) -> None:
        """Record in ``known`` that ``coords`` over ``shape`` were delinearised from
        ``index`` (:meth:`linear` of them gives ``index`` back); nothing for no real dims."""
        real = [(c, d) for c, d in zip(coords, shape) if d != 1]
        if real:
            known[(key([c for c, _ in real]), tuple(d for _, d in real))] = node(index)

    def times(self, c: Code, stride: Dim) -> Code:
        """``c`` times ``stride`` (``c`` itself for a stride of 1)."""
        return c if stride == 1 else Op("{0} * {1}", PRODUCT,
                                        (operand(c), operand(self.size_code(stride))))

    # ---- coordinates -------------------------------------------------------------------
    def linear(self, coords: Sequence[Code | str], shape: Sequence[Dim],
               known: Known | None = None) -> Code:
        """Row-major linear index of ``coords`` within ``shape`` (size-1 dims skipped).
        With ``known``, a run of coordinates delinearised from one index (the row
        coordinates ``x0, x1, x2`` of ``x``) is that index again: ``x * S_0 + r``, not
        ``(x / (4 * S_0)) * (4 * S_0 * S_0) + ...``, which a C compiler keeps as divisions
        when the sizes are runtime arguments."""
        coords = [node(c) for c in coords]
        if known:
            cs = tuple(c for c, d in zip(coords, shape) if d != 1)
            ds = tuple(d for d in shape if d != 1)
            if cs and (key(cs), ds) in known:  # no real dims: element 0 (never a loop's)
                return known[(key(cs), ds)]
            coords, shape = _known_runs(cs, ds, known)
        terms: list[Code] = []
        stride: Dim = 1
        for c, d in reversed(list(zip(coords, shape))):
            if d != 1 and not is_zero(c):
                terms.append(self.times(c, stride))
            stride = prod([stride, d])
        return total(terms[::-1])

    def delinear(self, index: Code | str, shape: Sequence[Dim]) -> Coords:
        """Coordinates of the row-major ``index`` within ``shape``. Where the language has
        32-bit casts, ``shape`` is static with fewer than :data:`NARROW_LIMIT` elements and a
        coordinate divides by a size that is no power of two, that coordinate is computed
        from the index cast to 32 bits and cast back (``(int64_t)((int32_t)r / 7 % 7)``):
        gcc vectorizes 32-bit division by a constant (a multiply-high), never 64-bit (a
        SIMD loop over Swin's window rows of 49 reading a mask at ``r / 7`` and ``r % 7``:
        8.0 -> 4.8 ms, C harness)."""
        out = []
        real = [i for i, d in enumerate(shape) if d != 1]
        narrow = self._narrowed(index, shape)
        strides: dict[int, Dim] = {}
        stride: Dim = 1
        for i in reversed(range(len(shape))):
            strides[i] = stride
            stride = prod([stride, shape[i]])
        for i, d in enumerate(shape):
            if d == 1:
                out.append(ZERO)
                continue
            divides = (strides[i] != 1 and not _power_of_two(strides[i])) or \
                (i != real[0] and not _power_of_two(d))
            e = operand(index) if narrow is None or not divides else narrow
            if strides[i] != 1:
                e = Op(f"{{0}} {self.language.floor_div} {{1}}", PRODUCT,
                       (e, operand(self.size_code(strides[i]))))
            if i != real[0]:
                e = Op("{0} % {1}", PRODUCT, (operand(e) if strides[i] != 1 else e,
                                              operand(self.size_code(d))))
            if narrow is not None and divides:
                e = Op(self.language.narrow[1], POSTFIX, (e,))
            out.append(e)
        return tuple(out)

    def _narrowed(self, index: Code | str, shape: Sequence[Dim]) -> Code | None:
        """``index`` cast to 32 bits, where :meth:`delinear` divides it so (None: not)."""
        numel = 1
        for d in shape:
            if not isinstance(d, int):
                return None
            numel *= d
        if self.language.narrow is None or numel >= NARROW_LIMIT:
            return None
        return Op(self.language.narrow[0], POSTFIX, (operand(index),))

    def address(self, coords: Sequence[Code | str], strides: Sequence[Dim] | None,
                shape: Sequence[Dim], known: Known | None = None) -> Code:
        """Element offset of ``coords`` in a tensor with ``strides`` (None: contiguous)."""
        coords = [node(c) for c in coords]
        if strides is None:
            return self.linear(coords, shape, known)
        real = sorted(((c, s, d) for c, s, d in zip(coords, strides, shape) if d != 1),
                      key=lambda t: -abs(_points(t[1])[0]))  # memory order (stable)
        expected: Dim = 1
        for _, s, d in reversed(real):
            if not same(s, expected):
                break
            expected = prod([expected, d])
        else:  # row-major: the linear index (often the very index the coords came from)
            return self.linear([c for c, _, _ in real], [d for _, _, d in real], known)
        if known:
            folded = fold_runs(self, real, known)
            if folded is not None:
                return folded
        return total([self.times(c, s) for c, s, d in zip(coords, strides, shape)
                     if d != 1 and s != 0 and not is_zero(c)])

    def broadcast(self, coords: Sequence[Code | str], out_shape: Sequence[Dim],
                  in_shape: Sequence[Dim]) -> Coords:
        """Coordinates in an input that broadcasts (right-aligned) to ``out_shape``. A
        symbolic dim not judged equal to the output's (``2*ceil(s0/2)`` to ``s0``: equal
        under Dynamo's guards, which the IR does not hold) is either it or 1 wherever the
        op is valid: its coordinate is the output's modulo the dim, right in both cases
        and never out of bounds."""
        offset = len(out_shape) - len(in_shape)
        if offset < 0:
            raise Unsupported(f"input of rank {len(in_shape)} broadcast to rank "
                              f"{len(out_shape)}")
        result = []
        for i, d in enumerate(in_shape):
            out = out_shape[offset + i]
            if isinstance(d, int) and isinstance(out, int) and d not in (1, out):
                raise Unsupported(f"dim {d} broadcast to {out}: the sizes differ")
            if d != 1 and not same(d, out):  # (two ints here are equal)
                result.append(Op("{0} % {1}", PRODUCT, (
                    paren(node(coords[offset + i]), PRODUCT),
                    paren(self.size_code(d), PRODUCT + 1))))
                continue
            result.append(ZERO if d == 1 else node(coords[offset + i]))
        return tuple(result)

    def reshape(self, coords: Sequence[Code | str], out_shape: Sequence[Dim],
                in_shape: Sequence[Dim], known: Known | None = None) -> Coords:
        """Coordinates in the input of a view/reshape/squeeze/unsqueeze (logical order)."""
        coords = [node(c) for c in coords]
        if 0 in out_shape or 0 in in_shape:
            return tuple(ZERO for _ in in_shape)
        result: list[Code] = [ZERO] * len(in_shape)
        outs = [i for i, d in enumerate(out_shape) if d != 1]
        ins = [j for j, d in enumerate(in_shape) if d != 1]
        for group_o, group_i in _view_groups(outs, ins, out_shape, in_shape):
            if len(group_o) == 1 and len(group_i) == 1:
                result[group_i[0]] = coords[group_o[0]]
                continue
            lin = self.linear([coords[k] for k in group_o], [out_shape[k] for k in group_o],
                              known)
            pieces = self.delinear(lin, [in_shape[k] for k in group_i])
            if known is not None:
                sizes = tuple(in_shape[k] for k in group_i)
                known[(key([c for c, d in zip(pieces, sizes) if d != 1]),
                       tuple(d for d in sizes if d != 1))] = lin
            for k, c in zip(group_i, pieces):
                result[k] = c
        if known is not None:  # a view keeps the row-major index of every element
            real = tuple((c, d) for c, d in zip(result, in_shape) if d != 1)
            if len(real) > 1:
                known.setdefault((key([c for c, _ in real]), tuple(d for _, d in real)),
                                 self.linear(coords, out_shape, known))
        return tuple(result)

    def view_coords(self, rule: str, coords: Coords, attrs_: Mapping[str, Any],
                    out_shape: Sequence[Dim], in_shape: Sequence[Dim],
                    known: Known | None = None, output: int = 0) -> Coords:
        """Input coordinates of a view op's element at ``coords``; ``rule`` is the op's
        index rule (reshape, expand, permute, transpose, slice, split, split_with_sizes,
        unbind, select), ``output`` the index of the output for multi-output views."""
        rank = len(in_shape)
        coords = tuple(node(c) for c in coords)
        for attr in ("start", "step", "index", "split_size", "split_sizes"):
            value = attrs_.get(attr)
            if attr == "start" and rule == "slice" and attrs_.get("step", 1) in (1, None):
                continue  # read from the types (:meth:`slice_start`)
            if isinstance(value, str) or (isinstance(value, (list, tuple)) and any(
                    isinstance(v, str) for v in value)):
                raise Unsupported(f"{rule} with a symbolic {attr} ({value})")
        if rule == "reshape":
            return self.reshape(coords, out_shape, in_shape, known)
        if rule == "expand":
            return self.broadcast(coords, out_shape, in_shape)
        if rule == "permute":
            result: list[Code] = [ZERO] * rank
            for i, d in enumerate(attrs_["dims"]):
                result[_norm(d, rank)] = coords[i]
            return tuple(result)
        if rule == "transpose":
            if rank < 2:
                return tuple(coords)
            a, b = _norm(attrs_.get("dim0", 0), rank), _norm(attrs_.get("dim1", 1), rank)
            result = list(coords)
            result[a], result[b] = coords[b], coords[a]
            return tuple(result)
        if rule == "slice":
            dim = _norm(attrs_.get("dim", 0), rank)
            size = in_shape[dim]
            start = attrs_.get("start") or 0
            step = attrs_.get("step", 1) or 1
            c = coords[dim] if step == 1 else Op("{0} * {1}", PRODUCT, (
                operand(coords[dim]), Literal(str(step), step)))
            if isinstance(start, (Name, Op)):  # read at run time (both bounds graph values)
                start = self.run_time_index(start, size, clamp=True)
            elif not isinstance(start, int):
                start = self.slice_start(attrs_.get("end"), size, out_shape[dim], start)
            elif isinstance(size, int):
                start = min(max(start + size if start < 0 else start, 0), size)
            elif start < 0:  # from the end of a symbolic dim
                start = self.size_code(f"Max({size} - {-start}, 0)")
            if start:  # a start past a symbolic end leaves nothing to read
                first = start if not isinstance(start, int) else Literal(str(start), start)
                c = first if is_zero(c) else Op("{0} + {1}", SUM, (c, operand(first)))
            return tuple(coords[:dim]) + (c,) + tuple(coords[dim + 1:])
        if rule in ("split", "split_with_sizes"):  # output ``output`` is one piece along dim
            dim = _norm(attrs_.get("dim", 0), rank)
            if rule == "split_with_sizes":
                start = sum(attrs_["split_sizes"][:output])
            elif isinstance(attrs_["split_size"], (Name, Op)):  # read at run time: k * it
                start = output and Op("{0} * {1}", PRODUCT, (Literal(str(output), output),
                                                             operand(attrs_["split_size"])))
            else:
                start = output * attrs_["split_size"]
            first = start if isinstance(start, Op) else Literal(str(start), start)
            c = coords[dim] if not start else (first if is_zero(coords[dim]) else
                                               Op("{0} + {1}", SUM, (coords[dim], first)))
            return tuple(coords[:dim]) + (c,) + tuple(coords[dim + 1:])
        if rule == "unbind":
            dim = _norm(attrs_.get("dim", 0), rank)
            return tuple(coords[:dim]) + (Literal(str(output), output),) + tuple(coords[dim:])
        if rule == "select":
            dim = _norm(attrs_["dim"], rank)
            index = attrs_["index"]
            if isinstance(index, (Name, Op)):  # read at run time
                at = self.run_time_index(index, in_shape[dim], clamp=False)
            elif index < 0 and not isinstance(in_shape[dim], int):
                at = self.size_code(f"{in_shape[dim]} - {-index}")
            else:
                index = index + in_shape[dim] if index < 0 else index
                at = Literal(str(index), index)
            return tuple(coords[:dim]) + (at,) + tuple(coords[dim:])
        raise Unsupported(f"no index rule {rule!r}")

    def run_time_index(self, value: Code, size: Dim, clamp: bool) -> Code:
        """Where a view reads along a dim of ``size`` at an int known only at run time
        (``value``: the node reading it, a kernel argument): a negative one counts from the
        end (``v + size * Min(Max(-v, 0), 1)``, the factor 1 for a negative ``v``); with
        ``clamp`` (the start of a slice between two graph values, whose length is its
        type's) held in ``[0, size]`` as Python clamps a slice; a select's index is in range
        (Dynamo's guards). In Max and Min alone, which every language spells."""
        if size is None:
            raise Unsupported("a view of a dim of unknown size at an int read at run time")
        v = _RUN_TIME_VALUE
        text = f"{v} + ({size}) * Min(Max(-{v}, 0), 1)"
        text = f"Min(Max({text}, 0), {size})" if clamp else text
        math = IndexMath(self.language, {**self.names, v: v}) if self.strict else self
        return substitute(math.size_code(text), {v: value})

    def slice_start(self, end: Any, size: Dim, length: Dim, start: str) -> Code | int:
        """The first element a step-1 slice of a dim of ``size`` reads, where its start
        (``start``: a symbolic attribute or a graph value's name) is known only at run time:
        the slice's end, clamped as Python clamps it, less the ``length`` its type holds
        (the type was computed from the same start: MPT's ALiBi bias
        ``bias[:, Max(0, 64 - s):]`` of length ``64 - Max(0, 64 - s)``)."""
        if size is None or length is None:
            raise Unsupported("a slice of a dim of unknown size")
        if end is None or (isinstance(end, int) and end >= 2 ** 62):
            last: Dim = size
        elif not isinstance(end, int):
            raise Unsupported(f"slice with a start ({start}) and an end ({end}) known only "
                              f"at run time")
        elif isinstance(size, int):
            last = min(max(end + size if end < 0 else end, 0), size)
        else:
            last = f"Max({size} - {-end}, 0)" if end < 0 else f"Min({size}, {end})"
        if isinstance(last, int) and isinstance(length, int):
            return last - length
        body = parse_dim(str(length)).body  # ``last - start`` as a type spells it: ``start``
        if (isinstance(body, ast.BinOp) and isinstance(body.op, ast.Sub) and
                ast.dump(body.left) == ast.dump(parse_dim(str(last)).body)):
            return self._print(body.right)
        return self.size_code(f"({last}) - ({length})")


#: the name standing for a value read at run time while an expression of it is printed
_RUN_TIME_VALUE = "tl_run_time_value"


def _norm(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


__all__ = ["Coords", "Known", "Unsupported", "Language", "C", "TRITON", "SYMBOLS", "IndexMath",
           "ZERO", "is_zero", "node", "prod",
           "same", "sample_value"]
