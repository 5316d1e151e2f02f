"""Differential tests over random fusion groups (hypothesis): chains of pointwise ops over
broadcasting inputs, optionally ending in a last-dim reduction, compiled by the triton
codegen (interpreter), compared with eager. 25 examples by default, 1,000 with --fuzz."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import group_text

UNARY = ["aten.tanh.default", "aten.sigmoid.default", "aten.relu.default",
         "aten.neg.default", "aten.abs.default", "aten.gelu.default", "aten.exp.default"]
BINARY = ["aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.maximum.default",
          "aten.minimum.default"]
REDUCE = ["aten.sum.dim_IntList", "aten.amax.default", "aten.mean.dim"]


def _type(shape) -> str:
    return f"f32[{', '.join(map(str, shape))}]"


@st.composite
def random_group(draw):
    rows, cols = draw(st.integers(1, 5)), draw(st.integers(1, 9))
    shapes = draw(st.lists(st.sampled_from([(rows, cols), (cols,), (rows, 1), (1, cols)]),
                           min_size=1, max_size=3))
    shapes[0] = (rows, cols)
    values = [(f"%a{i}", s) for i, s in enumerate(shapes)]
    lines = []
    for k in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            name, shape = draw(st.sampled_from(values))
            op = draw(st.sampled_from(UNARY))
            lines.append(f"%v{k} = {op}({name}) : {_type(shape)}")
        else:
            (a, sa), (b, sb) = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            shape = tuple(torch.broadcast_shapes(sa, sb))
            lines.append(f"%v{k} = {draw(st.sampled_from(BINARY))}({a}, {b}) : {_type(shape)}")
        values.append((f"%v{k}", shape))
    last, shape = values[-1]
    results = [f"{last}: {_type(shape)}"]
    if draw(st.booleans()):
        op = draw(st.sampled_from(REDUCE))
        keep = draw(st.booleans())
        out = (*shape[:-1], 1) if keep else shape[:-1]
        lines.append(f"%r = {op}({last}) {{dim = [-1], keepdim = {str(keep).lower()}}} : "
                     f"{_type(out)}")
        results.append(f"%r: {_type(out)}")
    params = ", ".join(f"%a{i}: {_type(s)}" for i, s in enumerate(shapes))
    text = group_text(params, "\n".join(lines), ", ".join(results))
    seed = draw(st.integers(0, 2 ** 16))
    gen = torch.Generator().manual_seed(seed)
    return text, [torch.randn(*s, generator=gen) for s in shapes]


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
