"""``_foreach_*`` ops as one op per tensor (frontend/foreach.py): every overload in the
table gives the foreach op's own values, bit for bit, on lists of tensors of several
shapes with edge values; the optimizers' foreach steps are covered."""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from torchloom.frontend.foreach import foreach_decompositions

TABLE = foreach_decompositions()
SHAPES = [(3, 4), (5,), (), (2, 1, 3)]
EDGES = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-30, -2.5, 3.0]


def _tensor(shape, dtype, g: torch.Generator, positive: bool) -> torch.Tensor:
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=g, dtype=torch.float64)
        t = (t.abs() + 0.25 if positive else t).to(dtype)
        flat = t.view(-1)
        if flat.numel() > 1 and not positive:
            k = int(torch.randint(0, len(EDGES), (), generator=g))
            flat[0] = EDGES[k]  # one edge value per tensor
        return t
    return torch.randint(1 if positive else -5, 6, shape, generator=g, dtype=dtype)


def _arguments(op, dtype, g: torch.Generator):
    """Positional arguments for ``op`` from its schema: lists of tensors of SHAPES, numbers,
    per-tensor numbers, a 0-d tensor."""
    schema, args = op._schema, []
    name = schema.name
    positive = any(k in name for k in ("sqrt", "log", "div", "reciprocal", "pow", "acos",
                                       "asin", "lgamma", "rsqrt", "norm"))
    for a in schema.arguments:
        if a.kwarg_only:
            continue
        text = str(a.type)
        if text == "List[Tensor]":
            shapes = [(3, 3)] * len(SHAPES) if name.endswith("_mm") else SHAPES
            args.append([_tensor(s, dtype, g, positive) for s in shapes])
        elif text in ("List[number]", "List[float]"):
            args.append([0.5, 1.5, 2.0, -0.75][:len(SHAPES)])
        elif text == "number":
            args.append(0.75 if dtype.is_floating_point else 2)
        elif text == "Tensor":
            args.append(torch.tensor(0.75 if dtype.is_floating_point else 2, dtype=dtype))
        elif a.has_default_value():
            args.append(a.default_value)
        else:
            args.append(None)
    return args


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        torch.nan_to_num(a, nan=7.0, posinf=8.0, neginf=9.0) if a.is_floating_point() else a,
        torch.nan_to_num(b, nan=7.0, posinf=8.0, neginf=9.0) if b.is_floating_point() else b) \
        and (not a.is_floating_point() or torch.equal(a.isnan(), b.isnan()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("op", sorted(TABLE, key=str), ids=str)
def test_per_tensor_values_are_the_foreach_values(op, dtype):
    args = _arguments(op, dtype, torch.Generator().manual_seed(zlib.crc32(str(op).encode())))
    try:
        want = op(*args)
    except RuntimeError as e:  # an overload eager refuses for this dtype: so must we
        with pytest.raises(RuntimeError):
            TABLE[op](*args)
        assert str(e)
        return
    got = TABLE[op](*args)
    assert len(got) == len(want)
    for w, x in zip(want, got):
        assert _same(w, x), f"{op}: {w} vs {x}"


def test_lists_of_unequal_length_are_refused_as_eager_refuses_them():
    op = torch.ops.aten._foreach_add.List
    a, b = [torch.ones(2), torch.ones(3)], [torch.ones(2)]
    with pytest.raises(RuntimeError):
        op(a, b)
    with pytest.raises(RuntimeError, match="differ in length"):
        TABLE[op](a, b)


def test_the_optimizers_foreach_ops_are_in_the_table():
    aten = torch.ops.aten
    used = [aten._foreach_add.Scalar, aten._foreach_add.List, aten._foreach_mul.Scalar,
            aten._foreach_mul.Tensor, aten._foreach_sub.List, aten._foreach_div.List,
            aten._foreach_div.Scalar, aten._foreach_addcmul.Scalar, aten._foreach_addcdiv.Scalar,
            aten._foreach_addcdiv.ScalarList, aten._foreach_sqrt.default,
            aten._foreach_lerp.Scalar, aten._foreach_pow.ScalarAndTensor, aten._foreach_neg.default,
            aten._foreach_reciprocal.default, aten._foreach_maximum.List,
            aten._foreach_norm.Scalar, aten._foreach_copy.default, aten._foreach_zero.default]
    assert not [str(op) for op in used if op not in TABLE]
    # per-tensor scalars given as one tensor are read on the host by eager: left whole
    assert aten._foreach_addcmul.Tensor not in TABLE
    assert not [op for op in TABLE if str(op).endswith("_")]  # in-place ones: functionalized


def test_off_the_cpu_the_ops_stay_whole():
    """On another device the decomposition answers NotImplemented (the tracer then keeps
    the foreach op: a GPU runs it in one launch)."""
    op = torch.ops.aten._foreach_mul.Scalar
    on_meta = [torch.empty(3, device="meta"), torch.empty(2, 2, device="meta")]
    assert TABLE[op](on_meta, 0.5) is NotImplemented
    assert len(TABLE[op]([torch.ones(3), torch.ones(2, 2)], 0.5)) == 2
