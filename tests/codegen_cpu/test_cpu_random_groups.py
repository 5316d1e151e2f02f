"""Differential tests over random fusion groups (hypothesis): chains of pointwise ops over
broadcasting inputs of a random dtype, optionally ending in a reduction over the last or
the first dim, compiled by the cpu codegen, compared with eager. Each hypothesis example is
a batch of groups built into one library (one compiler call), so the suite checks 320
groups in 16 compiler calls; ``--fuzz`` checks 10,000."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchloom.api import parse_graph

from conftest import as_accurate_as_eager, compare, group_text, reduction_statement

UNARY = ["aten.tanh.default", "aten.sigmoid.default", "aten.relu.default",
         "aten.neg.default", "aten.abs.default", "aten.gelu.default", "aten.exp.default",
         "aten.erf.default", "aten.sqrt.default"]
# log1p is left out: after erf or tanh near -1 it turns libmvec's 4-ulp bound into an
# infinite difference (libmvec's erff(-3.8) is -1.0, eager's -0.99999994; see the plugin's
# README); test_ops checks log1p on its own
BINARY = ["aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.maximum.default",
          "aten.minimum.default", "aten.div.Tensor"]
REDUCE = ["aten.sum.dim_IntList", "aten.amax.default", "aten.amin.default", "aten.mean.dim",
          "aten.var.correction", "aten.std.correction"]
#: ops whose results near zero carry an absolute error, so that no value computed from them
#: is a divisor here (the division would turn it into any relative error: gelu(x) / gelu(x)
#: at x = -5.34 in bf16 is 1 in eager, 0 / 0 = NaN in the codegen, whose GELU is within
#: 4 ulp + 2e-7 |x| of x Phi(x) (test_vector_math.py) and gives -0.0 there, where eager's
#: vectorized and scalar bf16 GELU themselves give -1.6e-7 and -3.2e-7, the truth -2.5e-7)
NEVER_DIVISORS = {"aten.gelu.default", "aten.erf.default"}
DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16}
PER_EXAMPLE = 20


def _type(dtype: str, shape) -> str:
    return f"{dtype}[{', '.join(map(str, shape))}]"


@st.composite
def random_group(draw):
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    # (long rows too: whole SIMD blocks and masked tails past one vector, one-pass var)
    rows, cols = draw(st.integers(1, 40)), draw(st.one_of(st.integers(1, 70),
                                                          st.sampled_from([256, 320, 1024])))
    shapes = draw(st.lists(st.sampled_from([(rows, cols), (cols,), (rows, 1), (1, cols)]),
                           min_size=1, max_size=3))
    shapes[0] = (rows, cols)
    values = [(f"%a{i}", s) for i, s in enumerate(shapes)]
    lines = []
    near_zero_error = set()  # values computed from a gelu or erf (see NEVER_DIVISORS)
    for k in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            name, shape = draw(st.sampled_from(values))
            op = draw(st.sampled_from(UNARY))
            lines.append(f"%v{k} = {op}({name}) : {_type(dtype, shape)}")
            if op in NEVER_DIVISORS or name in near_zero_error:
                near_zero_error.add(f"%v{k}")
        else:
            (a, sa), (b, sb) = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            shape = tuple(torch.broadcast_shapes(sa, sb))
            op = draw(st.sampled_from(BINARY))
            if op == "aten.div.Tensor" and b in near_zero_error:
                op = "aten.mul.Tensor"
            lines.append(f"%v{k} = {op}({a}, {b}) : {_type(dtype, shape)}")
            if near_zero_error.intersection((a, b)):
                near_zero_error.add(f"%v{k}")
        values.append((f"%v{k}", shape))
    last, shape = values[-1]
    results = [f"{last}: {_type(dtype, shape)}"]
    if draw(st.booleans()) and len(shape) == 2:
        line, result = reduction_statement(draw(st.sampled_from(REDUCE)), last, shape, dtype,
                                           draw(st.sampled_from([0, -1])), draw(st.booleans()))
        lines.append(line)
        results.append(result)
    params = ", ".join(f"%a{i}: {_type(dtype, s)}" for i, s in enumerate(shapes))
    text = group_text(params, "\n".join(lines), ", ".join(results))
    seed = draw(st.integers(0, 2 ** 16))
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(*s, generator=gen).to(DTYPES[dtype]) for s in shapes]
    if draw(st.booleans()):  # some edge values
        flat = inputs[0].view(-1)
        specials = torch.tensor([float("nan"), float("inf"), -0.0, float("-inf")])
        for i in draw(st.lists(st.integers(0, flat.numel() - 1), max_size=3)):
            flat[i] = specials[i % 4].to(flat.dtype)
    return text, inputs


def _check_batches(check, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(random_group(), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
    def run(cases):
        codegen, registry = check.codegen, check.registry
        nodes = [next(parse_graph(text).nodes) for text, _ in cases]
        supported = []
        for case, node in zip(cases, nodes):
            reason = codegen.supports(node, registry)
            # the one decline a random group meets: var/std (two dependent reductions)
            # over dim 0 of a long row, whose rows are strided columns (run on eager;
            # reduction.check_row_stride)
            assert reason is None or "with a stride of" in reason.message, reason
            if reason is None:
                supported.append((case, node))
        cases, nodes = [c for c, _ in supported], [n for _, n in supported]
        kernels = codegen.load_many([codegen.generate(n, registry) for n in nodes], registry)
        for (text, inputs), kernel in zip(cases, kernels):
            got = kernel(*inputs)
            want = check.reference(text, *inputs)
            low = inputs[0].dtype == torch.bfloat16
            try:
                compare(got, want, rtol=2e-2 if low else 1e-4, atol=2e-2 if low else 1e-4)
            except AssertionError:
                if low or inputs[0].dtype != torch.float32:
                    raise
                as_accurate_as_eager(check, text, inputs, got, want)
    run()


@pytest.mark.slow
def test_random_groups_match_eager(check, fuzz):
    _check_batches(check, 500 if fuzz else 16)
