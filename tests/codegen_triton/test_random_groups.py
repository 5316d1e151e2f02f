"""Differential tests over random fusion groups (hypothesis): chains of pointwise ops over
broadcasting inputs (0-d ones among them, and groups whose values are all 0-d), optionally
ending in a last-dim reduction, plain or of a masked value (``where``), compiled by the
triton codegen (interpreter), compared with eager. 25 examples by default, 1,000 with
--fuzz."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import group_text

UNARY = ["aten.tanh.default", "aten.sigmoid.default", "aten.relu.default",
         "aten.neg.default", "aten.abs.default", "aten.gelu.default", "aten.exp.default"]
BINARY = ["aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.maximum.default",
          "aten.minimum.default"]
#: reduction -> (its ``dim`` attribute over the last dim, its result dtype or None: the input's)
REDUCE = {"aten.sum.dim_IntList": ("[-1]", None), "aten.amax.default": ("[-1]", None),
          "aten.amin.default": ("[-1]", None), "aten.mean.dim": ("[-1]", None),
          "aten.argmax.default": ("-1", "i64"), "aten.argmin.default": ("-1", "i64")}


def _type(shape, dtype: str = "f32") -> str:
    return f"{dtype}[{', '.join(map(str, shape))}]"


def broadcast_shape(a: tuple, b: tuple) -> tuple:
    """The shape ``a`` and ``b`` broadcast to (dims: ints or symbols)."""
    a, b = (1,) * (len(b) - len(a)) + a, (1,) * (len(a) - len(b)) + b
    return tuple(x if y == 1 else y for x, y in zip(a, b))


def pointwise_chain(draw, shapes: list, steps: int, unary=UNARY, binary=BINARY,
                    extra: tuple = ()):
    """``steps`` random unary and binary ops over inputs ``%a<i>`` of ``shapes``, the
    ``extra`` (name, shape) values and the results before them: (the IR lines, every
    value as (name, shape))."""
    values = [(f"%a{i}", s) for i, s in enumerate(shapes)] + list(extra)
    lines = []
    for k in range(steps):
        if draw(st.booleans()):
            name, shape = draw(st.sampled_from(values))
            op = draw(st.sampled_from(unary))
            lines.append(f"%v{k} = {op}({name}) : {_type(shape)}")
        else:
            (a, sa), (b, sb) = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            shape = broadcast_shape(sa, sb)
            lines.append(f"%v{k} = {draw(st.sampled_from(binary))}({a}, {b}) : {_type(shape)}")
        values.append((f"%v{k}", shape))
    return lines, values


@st.composite
def random_group(draw):
    rows, cols = draw(st.integers(1, 5)), draw(st.integers(1, 9))
    # a 0-d first input makes a group of 0-d values (reduced over dim -1: torch allows it)
    first = draw(st.sampled_from([(rows, cols)] * 3 + [()]))
    others = [()] if first == () else [(rows, cols), (cols,), (rows, 1), (1, cols), ()]
    shapes = draw(st.lists(st.sampled_from(others), min_size=1, max_size=3))
    shapes[0] = first
    lines, values = pointwise_chain(draw, shapes, draw(st.integers(1, 6)))
    last, shape = values[-1]
    results = [f"{last}: {_type(shape)}"]
    if draw(st.booleans()):
        op = draw(st.sampled_from(sorted(REDUCE)))
        dim, dtype = REDUCE[op]
        keep = draw(st.booleans())
        out = () if shape == () else (*shape[:-1], 1) if keep else shape[:-1]
        if draw(st.booleans()):  # masked: where(last > 0, last, fill)
            fills = [n for n, s in values if tuple(torch.broadcast_shapes(s, shape)) == shape]
            lines.append(f"%mask = aten.gt.Scalar({last}) {{other = 0.0}} : "
                         f"{_type(shape, 'b8')}")
            lines.append(f"%masked = aten.where.self(%mask, {last}, "
                         f"{draw(st.sampled_from(fills))}) : {_type(shape)}")
            last = "%masked"
        lines.append(f"%r = {op}({last}) {{dim = {dim}, keepdim = {str(keep).lower()}}} : "
                     f"{_type(out, dtype or 'f32')}")
        results.append(f"%r: {_type(out, dtype or 'f32')}")
    params = ", ".join(f"%a{i}: {_type(s)}" for i, s in enumerate(shapes))
    text = group_text(params, "\n".join(lines), ", ".join(results))
    seed = draw(st.integers(0, 2 ** 16))
    gen = torch.Generator().manual_seed(seed)
    return text, [torch.randn(s, generator=gen) for s in shapes]


def _check_random_groups(check, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(random_group())
    def run(case):
        text, inputs = case
        check(text, *inputs, rtol=1e-4, atol=1e-4)
    run()


def test_random_groups_match_eager(check, fuzz):
    _check_random_groups(check, 1000 if fuzz else 25)
