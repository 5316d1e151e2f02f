"""Op tables: aten op -> Triton expression template (pointwise), index rule (views) and
reduction kind. Tables, not if-chains: adding an op is adding a row.

A pointwise template is a format string over the op's tensor inputs ``{0}``, ``{1}``... and
its attributes ``{alpha}``, ``{other}``...; ``args`` says which dtype the inputs are
converted to before the template applies: ``"out"`` (the compute dtype of the result),
``"promote"`` (the promoted input dtype, for comparisons), ``"keep"`` (as they are) or
``"where"`` (condition as bool, the rest as the result).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
from torchloom.api import InputRef, Node, Unsupported, expr, op_rows, reductions, spelling, writer

from torchloom_codegen_triton import lanes

#: IR dtype -> Triton dtype of the values in memory
STORAGE = {"f64": "tl.float64", "f32": "tl.float32", "f16": "tl.float16",
           "bf16": "tl.bfloat16", "i64": "tl.int64", "i32": "tl.int32", "i16": "tl.int16",
           "i8": "tl.int8", "u8": "tl.uint8", "b8": "tl.int1"}
COMPUTE, FLOATS, VIEWS = writer.COMPUTE, writer.FLOATS, writer.VIEWS
named_args, promote_dtype = writer.named_args, writer.promote_dtype


def literal(value: Any) -> expr.Literal:
    """A Python scalar as Triton source (non-finite floats included)."""
    return expr.Literal(_constant(value), value)


def f64_constant(value: Any) -> bool:
    """Whether ``value`` is a float that a float32 does not hold (Triton makes a float
    constant that meets no tensor first a float32: an f64 computation takes such a float
    as an f64 constant, ``TritonSpelling.literal``). Ints and bools are Triton's integer
    constants: no."""
    if not isinstance(value, float) or not math.isfinite(value):
        return False
    try:
        return struct.unpack("f", struct.pack("f", value))[0] != value
    except OverflowError:  # (beyond float32's range)
        return True


def _constant(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    if isinstance(value, int):
        return repr(value)
    raise TypeError(f"attribute value {value!r} is not a scalar")


@attrs.frozen
class Pointwise(op_rows.OpRow):
    template: str | Callable[[Mapping[str, Any]], str]
    args: str = "out"
    #: the module helpers (``HELPERS``) the template calls (or a function giving them,
    #: as ``template`` is given its arguments)
    helpers: tuple[str, ...] | Callable[..., tuple[str, ...]] = ()
    #: whether ``template`` and ``helpers`` are functions of the attributes and the
    #: result's IR dtype (else of the attributes)
    typed: bool = False

    def _given(self, attrs_: Mapping[str, Any], dtype: str) -> tuple:
        return (attrs_, dtype) if self.typed else (attrs_,)

    def render(self, named: Mapping[str, expr.Code], attrs_: Mapping[str, Any],
               dtype: str = "f32") -> expr.Code:
        """``named``: schema argument name -> its expression (tensor values, literals);
        ``dtype``: the result's IR dtype."""
        return expr.fill(self.resolve(self.template, *self._given(attrs_, dtype)), named)

    def helpers_for(self, attrs_: Mapping[str, Any], dtype: str = "f32") -> tuple[str, ...]:
        """The helpers the rendered template calls, with those they call (``NEEDS``)."""
        called: dict[str, None] = {}  # (in order, each once)
        todo = list(self.resolve(self.helpers, *self._given(attrs_, dtype)))
        while todo:
            name = todo.pop(0)
            if name not in called:
                called[name] = None
                todo += NEEDS.get(name, ())
        return tuple(called)


def _pow(a: Mapping[str, Any], dtype: str) -> str:
    exponent = a["exponent"]
    if dtype not in FLOATS and _is_number(exponent) and exponent < 0:
        raise Unsupported("integers to negative integer powers: eager raises")
    # eager's CUDA kernel's own cases (rsqrt for -0.5: -0.0 gives -inf and -inf NaN, where
    # pow gives inf and 0)
    known = {2: "{self} * {self}", 3: "{self} * {self} * {self}", 1: "{self}",
             0.5: _sqrt(a, dtype), -0.5: "libdevice.rsqrt({self})", -1: "1.0 / {self}",
             -2: "1.0 / ({self} * {self})"}
    return known.get(exponent) or _libdevice_pow(a, dtype)


def _libdevice_pow(a: Mapping[str, Any], dtype: str) -> str:
    """libdevice's pow: floats of one type (a Python number is a float32 constant to
    Triton: an f64 base takes it as f64); integers declined (no integer pow there)."""
    if dtype not in FLOATS:
        raise Unsupported(f"an integer pow ({dtype}): libdevice has none")
    if dtype == "f64":  # (a number made an f64 constant: both of libdevice's pow f64;
        # one a float32 does not hold is one already, TritonSpelling.literal)
        base, exponent = ("tl.full([], {%s}, tl.float64)" % k
                          if _is_number(a.get(k)) and not f64_constant(a[k]) else "{%s}" % k
                          for k in ("self", "exponent"))
        return f"libdevice.pow({base}, {exponent})"
    return "libdevice.pow({self}, {exponent})"


#: the ``LOW`` argument of the helpers ``_low`` and ``_div_floor``: bf16 1, f16 2, else 0
_LOW = {"bf16": 1, "f16": 2}


def _div_mode(a: Mapping[str, Any], dtype: str) -> str:
    """Division with a rounding mode as eager's kernels divide (c10's div_floor_floating,
    Python's ``a // b``: ``1.0 // 0.1`` is 9, where ``floor(1.0 / 0.1)`` is 10), bf16/f16
    by a tensor in their own type: the quotient a trunc reads and every step of the floor
    division rounded to it (``_low``); by a Python number in f32 (eager's kernels divide
    by a CPU scalar in their accumulate type). Integers by a number other than 0 (Triton's
    ``//`` and ``%`` truncate, as C's); by a tensor, declined: eager raises
    ZeroDivisionError for a zero divisor, which a kernel cannot."""
    mode = a.get("rounding_mode")
    if dtype not in ("f32", "f64", "bf16", "f16") and mode is not None:
        other = a.get("other")
        if not _is_number(other) or other == 0:
            raise Unsupported(f"integer division with rounding mode {mode!r} by "
                              f"{'a tensor' if not _is_number(other) else 0}: eager raises "
                              f"for a zero divisor, a Triton kernel cannot")
        return {"trunc": "{self} // ({other})",
                "floor": "tl.where((({self} % ({other})) != 0) & (({self} < 0) != "
                         "({other} < 0)), {self} // ({other}) - 1, {self} // ({other}))"}[mode]
    low = _low_of(a, dtype)
    quotient = f"_low({{self}} / ({{other}}), {low})" if low else "{self} / ({other})"
    # (a Python int is an int32 constant to Triton, which libdevice's fmod does not take)
    divisor = "({other}) * 1.0" if _is_number(a.get("other")) else "{other}"
    return {None: "{self} / ({other})", "trunc": f"libdevice.trunc({quotient})",
            "floor": f"_div_floor({{self}}, {divisor}, {low})"}[a.get("rounding_mode")]


def _low_of(a: Mapping[str, Any], dtype: str) -> int:
    """The ``LOW`` a division of result dtype ``dtype`` rounds its steps with: 0 for f32
    and f64, and by a Python number (``other`` an attribute, not a tensor's InputRef)."""
    return 0 if _is_number(a.get("other")) else _LOW.get(dtype, 0)


def _is_number(other: Any) -> bool:
    """Whether a division's ``other`` is a Python number (an attribute; not a tensor's
    InputRef)."""
    return isinstance(other, (int, float)) and not isinstance(other, (bool, InputRef))


def _div_helpers(a: Mapping[str, Any], dtype: str) -> tuple[str, ...]:
    """The helpers :func:`_div_mode`'s template calls."""
    mode = a.get("rounding_mode")
    if mode == "floor" and dtype in ("f32", "f64", "bf16", "f16"):
        return ("_div_floor",)
    return ("_low",) if mode == "trunc" and _low_of(a, dtype) else ()


def _gelu(a: Mapping[str, Any]) -> str:
    if a.get("approximate", "none") == "tanh":
        return ("0.5 * {self} * (1.0 + libdevice.tanh(0.7978845608028654 * "
                "({self} + 0.044715 * {self} * {self} * {self})))")
    return "0.5 * {self} * (1.0 + tl.erf({self} * 0.7071067811865476))"


def _gelu_backward(a: Mapping[str, Any]) -> str:
    if a.get("approximate", "none") == "tanh":
        inner = "libdevice.tanh(0.7978845608028654 * ({self} + 0.044715 * {self} * {self} * {self}))"
        return ("{grad_output} * (0.5 * (1.0 + T) + 0.5 * {self} * (1.0 - T * T) * "
                "0.7978845608028654 * (1.0 + 0.134145 * {self} * {self}))").replace("T", inner)
    return ("{grad_output} * (0.5 * (1.0 + tl.erf({self} * 0.7071067811865476)) + "
            "{self} * tl.exp(-0.5 * {self} * {self}) * 0.3989422804014327)")


def _unary(expr: str) -> Pointwise:
    return Pointwise(expr.replace("X", "{self}"))


def _rounding(expr: str) -> Pointwise:
    """ceil, floor, round, trunc: of an integer (eager keeps its dtype) the value itself
    (Triton's float functions take no integers)."""
    return Pointwise(lambda a, dtype: expr.replace("X", "{self}") if dtype in FLOATS
                     else "{self}", typed=True)


def _sqrt(a: Mapping[str, Any], dtype: str) -> str:
    """tl.sqrt_rn takes f32 only; f64's sqrt is correctly rounded as it is."""
    return "tl.sqrt({self})" if dtype == "f64" else "tl.sqrt_rn({self})"


def _on_bools(template: Any, bools: str | None) -> Pointwise:
    """``template`` (of the attributes), or for a bool result eager's bool arithmetic:
    ``bools`` (add: or, mul: and), None where eager has none the kernel would match (a
    sum scaled by an ``alpha`` other than 1): declined; uint8 with a negative number too."""
    def typed(a: Mapping[str, Any], dtype: str) -> str:
        if _negative_with_uint8(a, dtype, ("other", "alpha")):
            raise Unsupported("uint8 arithmetic with a negative number (Triton refuses the "
                              "constant)")
        if dtype != "b8":
            return op_rows.OpRow.resolve(template, a)
        if bools is None or a.get("alpha", 1) != 1:
            raise Unsupported("bool arithmetic other than a sum or a product")
        return bools
    return Pointwise(typed, typed=True)


def _negative_with_uint8(a: Mapping[str, Any], dtype: str, names: tuple[str, ...]) -> bool:
    """Whether a uint8 op has a negative Python number among its arguments ``names``
    (Triton refuses a negative constant with an unsigned value)."""
    return dtype == "u8" and any(_is_number(a.get(k)) and a[k] < 0 for k in names)


def _unsigned_bounds(template: Any) -> Callable[[Mapping[str, Any], str], str]:
    """A clamp row, declined for a uint8 tensor with a negative bound (Triton takes no
    negative constant with an unsigned value)."""
    def typed(a: Mapping[str, Any], dtype: str) -> str:
        if _negative_with_uint8(a, dtype, ("min", "max")):
            raise Unsupported("a uint8 clamp with a negative bound")
        return op_rows.OpRow.resolve(template, a)
    return typed


def _addc(product: str) -> Callable[[Mapping[str, Any], str], str]:
    """addcmul / addcdiv (``product``: ``*`` or ``/``) in eager's orders, ``value * t1 * t2``
    and ``(value * t1) / t2``, the value left out at 1; of integers the value converted to
    the integer type first, as eager converts it (0.5 is 0)."""
    def template(a: Mapping[str, Any], dtype: str) -> str:
        value = a.get("value", 1)
        if isinstance(value, InputRef):  # (a value read at run time: the kernel's argument)
            return f"{{self}} + {{value}} * {{tensor1}} {product} {{tensor2}}"
        if dtype not in FLOATS and isinstance(value, float):
            value = int(value)  # (toward zero, as C converts)
        if dtype == "u8" and value < 0:  # (Triton takes no negative constant with it)
            raise Unsupported(f"uint8 addcmul/addcdiv by a negative value ({value})")
        if value == 1:
            return f"{{self}} + {{tensor1}} {product} {{tensor2}}"
        scale = "{value}" if dtype in FLOATS else str(value)
        return f"{{self}} + {scale} * {{tensor1}} {product} {{tensor2}}"
    return template


POINTWISE: dict[str, Pointwise] = {
    **{op: _on_bools(template, "({self}) | ({other})" if ".add." in op else None)
       for op, template in op_rows.alpha_rows("({other})").items()},
    "aten.mul.Tensor": _on_bools("{self} * ({other})", "({self}) & ({other})"),
    "aten.mul.Scalar": _on_bools("{self} * ({other})", "({self}) & ({other})"),
    "aten.div.Tensor": Pointwise("{self} / ({other})"),
    "aten.div.Scalar": Pointwise("{self} / ({other})"),
    "aten.true_divide.Tensor": Pointwise("{self} / ({other})"),  # div's alias
    "aten.div.Tensor_mode": Pointwise(_div_mode, helpers=_div_helpers, typed=True),
    "aten.neg.default": _unary("-X"),
    "aten.abs.default": _unary("tl.abs(X)"),
    "aten.exp.default": _unary("tl.exp(X)"),
    "aten.exp2.default": _unary("tl.exp2(X)"),
    "aten.expm1.default": _unary("libdevice.expm1(X)"),
    "aten.log.default": _unary("tl.log(X)"),
    "aten.log2.default": _unary("tl.log2(X)"),
    "aten.log1p.default": _unary("libdevice.log1p(X)"),
    "aten.sqrt.default": Pointwise(_sqrt, typed=True),
    "aten.rsqrt.default": _unary("libdevice.rsqrt(X)"),
    "aten.reciprocal.default": _unary("1.0 / X"),
    "aten.sin.default": _unary("tl.sin(X)"),
    "aten.cos.default": _unary("tl.cos(X)"),
    "aten.tanh.default": _unary("libdevice.tanh(X)"),
    "aten.erf.default": _unary("tl.erf(X)"),
    "aten.sigmoid.default": _unary("1.0 / (1.0 + tl.exp(-X))"),
    "aten.silu.default": _unary("X / (1.0 + tl.exp(-X))"),
    "aten.relu.default": _unary("tl.where(X < 0, 0, X)"),  # keeps NaN and -0.0 as eager
    "aten.gelu.default": Pointwise(_gelu),
    "aten.floor.default": _rounding("tl.floor(X)"),
    "aten.ceil.default": _rounding("tl.ceil(X)"),
    "aten.trunc.default": _rounding("libdevice.trunc(X)"),
    "aten.round.default": _rounding("libdevice.nearbyint(X)"),
    "aten.pow.Tensor_Scalar": Pointwise(_pow, typed=True),
    "aten.pow.Tensor_Tensor": Pointwise(_libdevice_pow, typed=True),
    "aten.pow.Scalar": Pointwise(_libdevice_pow, typed=True),
    "aten.addcmul.default": Pointwise(_addc("*"), typed=True),
    "aten.addcdiv.default": Pointwise(_addc("/"), typed=True),
    "aten.tanh_backward.default": Pointwise("{grad_output} * (1.0 - {output} * {output})"),
    "aten.sigmoid_backward.default": Pointwise(
        "{grad_output} * {output} * (1.0 - {output})"),
    "aten.threshold_backward.default": Pointwise(
        "tl.where({self} <= {threshold}, 0.0, {grad_output})"),
    "aten.gelu_backward.default": Pointwise(_gelu_backward),
    "aten.silu_backward.default": Pointwise(
        "{grad_output} * S_ * (1.0 + {self} * (1.0 - S_))".replace(
            "S_", "(1.0 / (1.0 + tl.exp(-{self})))")),
    "aten.maximum.default": Pointwise("_maximum({self}, {other})", helpers=("_maximum",)),
    "aten.minimum.default": Pointwise("_minimum({self}, {other})", helpers=("_minimum",)),
    **{op: Pointwise(_unsigned_bounds(template), typed=True)
       for op, template in op_rows.clamp_rows(
           lambda cond, a, b: f"tl.where({cond}, {a}, {b})").items()},
    "aten.where.self": Pointwise("tl.where({condition}, {self}, {other})", args="where"),
    **op_rows.comparisons(lambda sym: Pointwise(f"{{self}} {sym} ({{other}})", args="promote")),
    "aten.isnan.default": Pointwise("{self} != {self}", args="keep"),
    "aten.logical_not.default": Pointwise("{self} == 0", args="keep"),
    "aten.logical_and.default": Pointwise("({self} != 0) & ({other} != 0)", args="keep"),
    "aten.logical_or.default": Pointwise("({self} != 0) | ({other} != 0)", args="keep"),
    "aten.bitwise_and.Tensor": Pointwise("{self} & {other}", args="keep"),
    "aten.bitwise_or.Tensor": Pointwise("{self} | {other}", args="keep"),
    "aten.clone.default": Pointwise("{self}", args="keep"),
    # a block of the fill (a bare constant would be a scalar, not a block)
    "aten.full_like.default": Pointwise("tl.where({self} == {self}, {fill_value}, {fill_value})"),
    "aten.alias.default": Pointwise("{self}", args="keep"),
    "aten.detach.default": Pointwise("{self}", args="keep"),
    # a cast: the emitter converts (and rounds) to the result's dtype
    "aten._to_copy.default": Pointwise("{self}", args="cast"),
    "prims.convert_element_type.default": Pointwise("{a}", args="cast"),
}

#: the reduction kinds the writer takes
_KINDS = frozenset({"sum", "max", "min", "var", "argmax", "argmin"})
REDUCTIONS = reductions.reduction_table("tl.sqrt_rn({x})", kinds=_KINDS)
#: the same for f64 results: ``tl.sqrt_rn`` takes f32 only, f64's ``tl.sqrt`` rounds right
REDUCTIONS_F64 = reductions.reduction_table("tl.sqrt({x})", kinds=_KINDS)

#: per reduction kind: identity element (masked lanes), combine for the looped accumulator
IDENTITY = {"sum": "0.0", "max": 'float("-inf")', "min": 'float("inf")'}
#: each integer (and bool) compute dtype's (smallest, largest) value: the identities of max
#: and min over it (Triton checks a constant fits its type); an integer sum's is 0
INT_LIMITS = {"i64": ("-9223372036854775807 - 1", "9223372036854775807"),
              "i32": ("-2147483648", "2147483647"), "i16": ("-32768", "32767"),
              "i8": ("-128", "127"), "u8": ("0", "255"), "b8": ("0", "1")}
#: the generated module's helper a kind combines two values with (``combined``) and a block
#: with (``reduced_block``: ``tl.reduce`` with the module's own combine functions, not
#: ``tl.sum``, a library @jit function that the interpreter cannot call unless triton was
#: imported in interpreter mode); a writer asks for them (``Emitter.use``)
REDUCE_HELPERS = {"sum": ("_add",), "max": ("_maximum",), "min": ("_minimum",)}


def combined(kind: str, a: lanes.Operand, b: lanes.Operand) -> expr.Code:
    """``a`` and ``b`` combined by ``kind`` (``a + b``, ``_maximum(a, b)``, ...)."""
    if kind == "sum":
        return lanes.plus(a, b)
    return lanes.call(REDUCE_HELPERS[kind][0], a, b)


def reduced_block(kind: str, x: lanes.Operand, axis: int) -> expr.Code:
    """``tl.reduce(x, axis, <helper>, keep_dims=True)``: a block reduced by ``kind`` over
    ``axis``: 1 across a row's lanes, 0 across a column's."""
    return expr.Op(f"tl.reduce({{0}}, {axis}, {REDUCE_HELPERS[kind][0]}, keep_dims=True)",
                   expr.POSTFIX, (lanes.node(x),))

#: helpers a generated module may define, each as ``@triton.jit`` source, in module order:
#: NaN-propagating max/min, arg-reduction and Welford combines, bf16 rounding. A module
#: holds those its kernels' writers asked for (``Emitter.use``), nothing else.
HELPERS = {
    "_add": '''\
@triton.jit
def _add(a, b):
    return a + b
''',
    "_round_to_bf16": '''\
@triton.jit
def _round_to_bf16(x):
    # round to nearest even bfloat16, kept in float32 (bit-exact on GPU and interpreter)
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
''',
    "_low": '''\
@triton.jit
def _low(x, LOW: tl.constexpr):
    # x as eager computes in bfloat16 (LOW = 1) or float16 (LOW = 2): rounded, in float32
    y = x
    if LOW == 1:
        y = _round_to_bf16(x)
    if LOW == 2:
        y = x.to(tl.float16).to(tl.float32)
    return y
''',
    "_div_floor": '''\
@triton.jit
def _div_floor(a, b, LOW: tl.constexpr):
    # eager's div_floor_floating (Python's a // b), every step rounded as in eager's type
    mod = libdevice.fmod(a, b)
    div = _low(_low(a - mod, LOW) / b, LOW)
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), _low(div - 1.0, LOW), div)
    floordiv = tl.floor(div)
    floordiv = tl.where(_low(div - floordiv, LOW) > 0.5, _low(floordiv + 1.0, LOW), floordiv)
    quotient = _low(a / b, LOW)
    floordiv = tl.where(div == 0, libdevice.copysign(tl.cast(0.0, quotient.dtype), quotient),
                        floordiv)
    return tl.where(b == 0, quotient, floordiv)
''',
    "_welford_combine": '''\
@triton.jit
def _welford_combine(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    # Chan et al.: merge two (mean, sum of squared deviations, count) partial results
    n = n_a + n_b
    delta = mean_b - mean_a
    frac = tl.where(n == 0, 0.0, n_b / tl.where(n == 0, 1.0, n))
    return mean_a + delta * frac, m2_a + m2_b + delta * delta * n_a * frac, n
''',
    "_maximum": '''\
@triton.jit
def _maximum(a, b):
    return tl.where((a > b) | (a != a), a, b)
''',
    "_minimum": '''\
@triton.jit
def _minimum(a, b):
    return tl.where((a < b) | (a != a), a, b)
''',
    "_argmax_combine": '''\
@triton.jit
def _argmax_combine(va, ia, vb, ib):
    take_a = (va > vb) | ((va == vb) & (ia < ib)) | ((va != va) & ((vb == vb) | (ia < ib)))
    return tl.where(take_a, va, vb), tl.where(take_a, ia, ib)
''',
    "_argmin_combine": '''\
@triton.jit
def _argmin_combine(va, ia, vb, ib):
    take_a = (va < vb) | ((va == vb) & (ia < ib)) | ((va != va) & ((vb == vb) | (ia < ib)))
    return tl.where(take_a, va, vb), tl.where(take_a, ia, ib)
''',
}


#: helper -> the helpers its source calls (a module defining it defines them too)
NEEDS = {"_div_floor": ("_low",), "_low": ("_round_to_bf16",)}


def module_prelude(helpers: Iterable[str]) -> list[str]:
    """What a generated module starts with, after its header comment: the imports and
    the ``HELPERS`` named (in module order), each followed by two blank lines."""
    wanted = set(helpers)
    unknown = wanted - set(HELPERS)
    assert not unknown, f"no Triton helper named {sorted(unknown)}"
    lines = ["import triton", "import triton.language as tl",
             "from triton.language.extra import libdevice", "", ""]
    for name, source in HELPERS.items():
        if name in wanted:
            lines += [source, ""]
    return lines


class TritonSpelling(spelling.Spelling):
    """Triton as the triton codegen writes values: a number as Triton source (its type
    Triton's), an op its template rendered (:meth:`Pointwise.render`), the module helpers
    it calls told to the writer's emitter (``Emitter.use``). Element reads and stores are
    the writer's own (blocks of lanes, masks)."""

    name = "Triton"

    def literal(self, value: Any, compute: str) -> expr.Code:
        """A number as Triton source (a Literal: it takes the type it is used at); in an
        f64 computation a float that a float32 does not hold is an f64 constant made
        whole, ``tl.full([], v, tl.float64)`` (an Op: typed)."""
        if compute == "f64" and f64_constant(value):
            return expr.Op("tl.full([], {0}, tl.float64)", expr.POSTFIX, (literal(value),))
        return literal(value)

    def op(self, node: Node, spec: Any, named: dict[str, expr.Code], compute: str,
           ir_dtype: str, given: dict[str, Any], em: Any) -> expr.Code:
        em.use(*spec.helpers_for(given, ir_dtype))
        return spec.render(named, given, ir_dtype)


#: the triton codegen's spelling (it holds nothing: one for every writer)
SPELLING = TritonSpelling()
