"""Value types of the IR: tensors (shape, dtype, device, strides) and scalars.

Dims are ints, symbols or size expressions (``str`` such as ``"s0"``, ``"2*s0"``: see
:mod:`torchloom.ir.symbols`) or ``None`` for unknown. ``strides`` is ``None`` when the
tensor is contiguous (the common case prints shortest), symbolic sizes included.
"""

from __future__ import annotations

import struct
from typing import Union

import attrs
import torch

from torchloom.ir.symbols import SymbolicDimError, is_symbol, parse_dim, symbolic_contiguous

Dim = Union[int, str, None]

#: short IR dtype name <-> torch dtype
DTYPES: dict[str, torch.dtype] = {
    "f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
    "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8,
    "u8": torch.uint8, "b8": torch.bool, "c64": torch.complex64, "c128": torch.complex128,
    "f8e4m3": torch.float8_e4m3fn, "f8e5m2": torch.float8_e5m2,
}
# newer or rarer dtypes, where this torch has them
for _name, _attr in (("u16", "uint16"), ("u32", "uint32"), ("u64", "uint64"),
                     ("c32", "complex32"), ("f8e4m3fnuz", "float8_e4m3fnuz"),
                     ("f8e5m2fnuz", "float8_e5m2fnuz"), ("f8e8m0", "float8_e8m0fnu"),
                     ("f4e2m1x2", "float4_e2m1fn_x2")):
    if hasattr(torch, _attr):
        DTYPES[_name] = getattr(torch, _attr)
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}

SCALAR_KINDS = ("int", "float", "bool", "str", "none", "any")


def contiguous_strides(shape: tuple[Dim, ...]) -> tuple[Dim, ...] | None:
    """Row-major strides of ``shape``, or None when a dim is not a known int."""
    strides, acc = [], 1
    for d in reversed(shape):
        if not isinstance(d, int):
            return None
        strides.append(acc)
        acc *= d if d > 1 else 1
    strides.reverse()
    return tuple(strides)


def _dims(value) -> tuple[Dim, ...]:
    return tuple(value)


@attrs.frozen(cache_hash=True)
class TensorType:
    """A tensor's metadata. Construct through :meth:`make` to normalise strides."""

    shape: tuple[Dim, ...] = attrs.field(converter=_dims)
    dtype: str = "f32"
    device: str = "cpu"
    strides: tuple[Dim, ...] | None = attrs.field(default=None,
                                                  converter=attrs.converters.optional(_dims))

    @classmethod
    def make(cls, shape, dtype="f32", device="cpu", strides=None) -> "TensorType":
        shape = tuple(shape)
        if isinstance(dtype, torch.dtype):
            dtype = DTYPE_NAMES[dtype]
        if strides is not None:
            strides = tuple(strides)
            if strides == contiguous_strides(shape) or _size1_equivalent(shape, strides) or (
                    not all(type(d) is int for d in shape + strides)
                    and symbolic_contiguous(shape, strides)):
                strides = None
        return cls(shape, dtype, str(device), strides)

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorType":
        """The type of a real or fake tensor; symbolic sizes become symbol names."""
        shape, strides = tuple(t.shape), t.stride()
        if all(type(d) is int for d in shape) and all(type(s) is int for s in strides):
            # fast path (FX import calls this for every node): static sizes
            if strides == contiguous_strides(shape) or _size1_equivalent(shape, strides):
                strides = None
            device = t.device
            return cls(shape, DTYPE_NAMES[t.dtype],
                       "cpu" if device.type == "cpu" else str(device), strides)
        return cls.make([_dim_of(d) for d in shape], t.dtype, t.device,
                        [_dim_of(s) for s in strides])

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape) and (
            self.strides is None or all(isinstance(s, int) for s in self.strides))

    def actual_strides(self) -> tuple[Dim, ...] | None:
        return self.strides if self.strides is not None else contiguous_strides(self.shape)

    @property
    def is_dense(self) -> bool:
        """Elements laid out row-major without gaps (strides None, or the contiguous ones
        up to size-1 dims, which may carry any stride)."""
        return self.strides is None or self.strides == contiguous_strides(self.shape) or \
            _size1_equivalent(self.shape, self.strides)

    def squeezed_shape(self) -> tuple[Dim, ...]:
        """The shape without its dims of size 1: two tensors whose squeezed shapes are
        equal (``[C]`` and ``[C, 1, 1]``) hold their elements at the same row-major index."""
        return tuple(d for d in self.shape if d != 1)

    def numel(self) -> int | None:
        n = 1
        for d in self.shape:
            if not isinstance(d, int):
                return None
            n *= d
        return n

    def nbytes(self) -> int | None:
        n = self.numel()
        return None if n is None else n * self.torch_dtype.itemsize

    def with_(self, **changes) -> "TensorType":
        return attrs.evolve(self, **changes)


@attrs.frozen(cache_hash=True)
class ScalarType:
    """A non-tensor value: ``int``, ``float``, ``bool``, ``str``, ``none`` or ``any``.

    ``size``: the size symbol an ``int`` is (``int[s4]``: a SymInt Dynamo passes a graph,
    the image height of whose ceiling half a tensor has a dim), so that a kernel needing
    the symbol can read it from the int (``fusion.size-carriers``); None when unknown."""

    kind: str = attrs.field(validator=attrs.validators.in_(SCALAR_KINDS))
    size: str | None = attrs.field(default=None, kw_only=True)

    @size.validator
    def _check_size(self, attribute, value) -> None:
        if value is not None and (self.kind != "int" or not is_symbol(value)):
            raise ValueError(f"only an int is a size, and a bare symbol ({value!r} for "
                             f"{self.kind})")


Type = Union[TensorType, ScalarType]


def _size1_equivalent(shape, strides) -> bool:
    """Strides only differ from contiguous ones in dims of size <= 1 (which never matter)."""
    ref = contiguous_strides(shape)
    if ref is None or len(ref) != len(strides):
        return False
    return all(d <= 1 or s == r for d, s, r in zip(shape, strides, ref))


def _dim_of(d) -> Dim:
    if isinstance(d, int):
        return d
    try:  # a SymInt: a plain int when it is backed by a constant
        expr = d.node.expr
    except AttributeError:
        return None
    if expr.is_number:
        return int(expr)
    text = str(expr).replace(" ", "")
    try:  # what the text form and the runtime can read back, else an unknown dim
        parse_dim(text)
    except SymbolicDimError:
        return None
    return text


def type_of(value) -> Type:
    """The IR type of an example value (tensor, SymInt or Python scalar)."""
    if isinstance(value, torch.Tensor):
        return TensorType.of(value)
    if isinstance(value, bool):
        return ScalarType("bool")
    if isinstance(value, torch.SymInt):
        size = _dim_of(value)
        return ScalarType("int", size=size if is_symbol(size) else None)
    if isinstance(value, int):
        return ScalarType("int")
    if isinstance(value, (float, torch.SymFloat)):
        return ScalarType("float")
    if isinstance(value, torch.SymBool):
        return ScalarType("bool")
    if isinstance(value, str):
        return ScalarType("str")
    if value is None:
        return ScalarType("none")
    return ScalarType("any")


class InputRef(int):
    """An attribute element that refers to the node's ``inputs[i]`` (printed ``$i``).

    Used for list arguments that hold tensors, e.g. ``aten.cat(%a, %b) {tensors = [$0, $1]}``.
    """

    def __repr__(self) -> str:
        return f"${int(self)}"


def attrs_key(attrs_: dict) -> tuple:
    """A hashable key of a node's attributes, equal only for attributes that compute the
    same: ``1``, ``1.0`` and ``True`` differ (they infer different dtypes), so do ``0.0``
    and ``-0.0`` (``x * -0.0`` is not ``x * 0.0``), which compare equal in Python; floats
    are keyed by their bits (a NaN equals the same NaN). Lists key as their items.
    Raises TypeError for an unhashable value (callers then treat the node as unique)."""
    return tuple(sorted((k, _value_key(v)) for k, v in attrs_.items()))


def float_key(v: float) -> tuple:
    """A float as a key equal only for the same bits: ``0.0`` and ``-0.0`` differ (they
    compute differently), a NaN equals the same NaN."""
    return ("float", struct.pack("<d", v))


def _value_key(v):
    if isinstance(v, float):
        return float_key(v)
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, tuple(_value_key(x) for x in v))
    hash(v)
    return (type(v).__name__, v)
