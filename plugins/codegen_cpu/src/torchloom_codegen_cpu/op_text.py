"""A pointwise op of a group as C text, computed as eager's CPU kernels compute it: a
scalar operand of a bf16/f16 op converted to the tensor's type or kept in f32 as ATen
does, softmax's exp of ``x - max(x)`` with the prelude's cheaper exp, and ops of one bf16
input read from a table of their results (tables.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchloom.api import InputRef, Node, TensorType, Value, expr, schedule

from torchloom_codegen_cpu import tables
from torchloom_codegen_cpu.ops import FLOATS, round_to
from torchloom_codegen_cpu.tensors import Unsupported, tensor_type

#: ops eager's CPU kernels run with a one-element second operand as an f32 scalar
SCALAR_DIVISORS = frozenset({"aten.mul.Tensor", "aten.div.Tensor", "aten.div.Tensor_mode",
                             "aten.true_divide.Tensor"})


#: op -> its Python-number arguments eager converts to a bf16/f16 tensor's type
ROUNDED_SCALARS = {
    **{f"aten.{op}.{overload}": ("other", "alpha") for op in ("add", "sub", "rsub")
       for overload in ("Tensor", "Scalar")},
    "aten.fmod.Scalar": ("other",), "aten.remainder.Scalar": ("other",),
    **{f"aten.{op}.Scalar": ("other",) for op in ("eq", "ne", "lt", "le", "gt", "ge")},
}

EXP = "aten.exp.default"

#: ops combining two truth values with a C operator (logical ones compare to 0 first)
BOOL_OPERATORS = {"aten.bitwise_and.Tensor": "&", "aten.bitwise_or.Tensor": "|",
                  "aten.bitwise_xor.Tensor": "^", "aten.logical_and.default": "&",
                  "aten.logical_or.default": "|", "aten.logical_xor.default": "^"}


def _one_element(v: Value) -> bool:
    return isinstance(v.type, TensorType) and all(d == 1 for d in v.type.shape)


def op_text(node: Node, spec, named: dict[str, expr.Code], compute: str, ir_dtype: str,
            given: dict[str, Any]) -> tuple[expr.Code, tuple[str, str] | None]:
    """(the C expression of ``node``'s result, the table it reads as (function,
    definition) or None): its template from ``spec`` chosen by ``given`` (attributes, and
    arguments that are inputs as ``InputRef``), filled with the operands ``named``."""
    # a scalar divisor (a one-element tensor or a Python number): eager's kernel
    # divides in f32 (no rounded quotient to trunc)
    scalar = keeps_operand(node, 1) or (node.op in SCALAR_DIVISORS and len(node.inputs) == 1)
    # softmax's exp(x - max(x)): every argument <= 0 (or NaN), the prelude's cheaper exp
    nonpositive = node.op == EXP and compute == "f32" and minus_max(node.inputs[0])
    template = spec.template_for(given, compute,
                                 "f32" if scalar and compute in ("f32", "f64") else ir_dtype,
                                 exp="tl_exp_nonpos" if nonpositive else "tl_exp")
    if template is None:
        raise Unsupported(f"{node.op} on {compute} has no C template")
    try:
        code = expr.fill(template, named)
    except KeyError as exc:  # an argument that is no number: a symbolic size, say
        raise Unsupported(f"{node.op}: argument {exc.args[0]} = "
                          f"{node.attrs.get(exc.args[0])!r} has no C value") from None
    if nonpositive:  # (computing this exp costs about what a table read does: no table)
        return code, None
    return _tabulated(node, template, named, compute, ir_dtype, given) or (code, None)


def lane_masks(node: Node, named: dict[str, expr.Code], ir_dtype: str,
               is_inner: Callable[[expr.Code], bool]
               ) -> tuple[str, expr.Code, expr.Code] | None:
    """(operator, the 32-bit mask of the operand computed once per row, that of the
    operand computed in the SIMD loop) for a :data:`BOOL_OPERATORS` op with a bool result
    whose operands are one of each (``is_inner``); None for any other op (see
    :func:`combined`). gcc 12 builds the vector mask of a ``_Bool`` computed before the
    loop bit by bit, 16 shifts and ors a mask (``m & (a[j] > b[j])``: ~45 scalar
    instructions per vector); a mask made once per row as an int of all ones or zeros is
    one broadcast, and the loop combines it with the lane's condition as ints. A max
    pool's window masks (9 a pixel, ResNet's stem) alone: 292 -> 251 us (RESULTS.md,
    session 71)."""
    symbol = BOOL_OPERATORS.get(node.op)
    a, b = named.get("self"), named.get("other")
    if symbol is None or ir_dtype != "b8" or a is None or b is None or \
            is_inner(a) == is_inner(b):
        return None
    outer, inner = (b, a) if is_inner(a) else (a, b)
    logical = node.op.startswith("aten.logical_")
    return symbol, _int_mask(outer, logical), _int_mask(inner, logical)


def combined(symbol: str, a: expr.Code, b: expr.Code) -> expr.Code:
    """``(a symbol b) != 0`` over two :func:`lane_masks` masks: ``-x & -y`` is non-zero
    exactly where ``x & y`` holds (``|`` and ``^`` alike)."""
    return expr.compare("!=", expr.Op(f"({{0}} {symbol} {{1}})", expr.ATOM, (a, b)),
                        expr.Literal("0", 0))


def _int_mask(e: expr.Code, logical: bool) -> expr.Code:
    """``-(int32_t)e``: all ones where ``e`` holds, else 0 (``e != 0`` first if
    ``logical``: its operand may be a number)."""
    truth = expr.compare("!=", e, expr.Literal("0", 0)) if logical else e
    return expr.Op("-(int32_t){0}", expr.POSTFIX, (expr.paren(truth),))


def scalar_operand(node: Node, name: str, value):
    """A Python number added to, subtracted from, compared with or taken the remainder
    by a bf16/f16 tensor is converted to the tensor's type first by eager's kernels
    (x + 1.0001 in bf16 adds 1.0); mul, div and the activations' parameters are not."""
    dtype = tensor_type(node.inputs[0]).dtype if node.inputs and isinstance(
        node.inputs[0].type, TensorType) else None
    if (dtype in ("bf16", "f16") and name in ROUNDED_SCALARS.get(node.op, ())
            and not isinstance(value, bool) and isinstance(value, (int, float))):
        return round_to(float(value), dtype)
    return value


def keeps_operand(node: Node, k: int) -> bool:
    """Eager's CPU mul and div of a bf16/f16 tensor by a scalar (an operand broadcast
    everywhere: one element) compute in f32 with the scalar's own value, a 0-d f32 or
    int tensor unrounded (ATen's ``original_scalar_value``, BinaryOpsKernel.cpp)."""
    return (k == 1 and node.op in SCALAR_DIVISORS and len(node.inputs) > 1
            and _one_element(node.inputs[1]))


def _tabulated(node: Node, template: str, named: dict[str, expr.Code], compute: str,
               ir_dtype: str, given: dict[str, Any]
               ) -> tuple[expr.Code, tuple[str, str]] | None:
    """(the read of a table of the op's results, (its function, its definition)) when
    its one tensor input and its result are bf16, else None."""
    tensors = [name for name, value in given.items() if isinstance(value, InputRef)]
    if (compute != "f32" or len(tensors) != 1 or len(node.inputs) != 1
            or not isinstance(node.inputs[0].type, TensorType)
            or tensor_type(node.inputs[0]).dtype != ir_dtype):
        return None
    found = tables.table(node.op, template.format(**{**named, tensors[0]: "x"}), ir_dtype)
    if found is None:
        return None
    definition, function = found
    read = expr.Op(f"{function}({{0}})", expr.POSTFIX, (named[tensors[0]],))
    return read, (function, definition)


def minus_max(v: Value) -> bool:
    """Whether ``v`` is ``a - max(a)`` over some dims with keepdim (softmax's shift, the
    core's :func:`schedule.max_shift`), so every element is <= 0 or NaN, of ``a``'s shape
    (a transposed or squeezed maximum would pair elements with another row's maximum).
    Floats only: an integer difference wraps (int8: -128 - 127 is 1)."""
    if schedule.max_shift(v) is None:
        return False
    a = v.producer.inputs[0]
    return tensor_type(v).shape == tensor_type(a).shape and tensor_type(v).dtype in FLOATS
