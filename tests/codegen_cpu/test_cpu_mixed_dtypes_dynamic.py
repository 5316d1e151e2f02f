"""Random programs over inputs of mixed dtypes (f32, bf16, f16, f64, int64, bool) through
torch.compile(dynamic=True) on the default pipeline (hypothesis): type promotion, casts
between every pair, comparisons into `where`, keepdim reductions, all over symbolic sizes,
run at several sizes (1 and 0 included) and compared with eager; no graph falls back.

Not asserted here: that every group runs on the cpu codegen (a group holding a row and a
column reduction of one input is still declined, see /work/notes/bugs.md); the last test
asserts it for groups of different symbolic sizes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchloom.compiler import Compiler

INPUTS = {  # name: (dtype, shape as (rows?, cols?))
    "x": (torch.float32, (True, True)), "y": (torch.bfloat16, (True, True)),
    "h": (torch.float16, (False, True)), "d": (torch.float64, (True, False)),
    "k": (torch.int64, (True, True)), "m": (torch.bool, (True, True)),
}
CASTS = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64]
UNARY = {"sin": torch.sin, "tanh": torch.tanh, "abs": torch.abs, "neg": torch.neg,
         "sigmoid": torch.sigmoid, "relu": torch.relu}
BINARY = {"add": torch.add, "mul": torch.mul, "sub": torch.sub, "maximum": torch.maximum,
          "minimum": torch.minimum}
SIZES = [(3, 5), (1, 7), (6, 1), (0, 4), (9, 17)]


def step(kind: str, arg: int, values: list):
    """One statement of a program: its operands are earlier values picked by ``arg``."""
    a, b = values[arg % len(values)], values[(arg * 7 + 3) % len(values)]
    if a.dtype == torch.bool and kind in UNARY:
        a = a.to(torch.float32)  # neg/abs of bool raise in eager too
    if kind in UNARY:
        return UNARY[kind](a)
    if kind in BINARY:
        if torch.bool in (a.dtype, b.dtype):
            a, b = a.to(torch.int32), b.to(torch.int32)  # bool - bool raises in eager
        return BINARY[kind](a, b)
    if kind.startswith("to_"):
        return a.to(CASTS[arg % len(CASTS)])
    if kind == "where":
        return torch.where(a > b, a, b)
    if kind == "sum_keep":
        return a.sum(-1, keepdim=True)
    if kind == "amax_cols":  # over the last dim: the first is 0 at one size (no identity)
        return a.amax(-1, keepdim=True)
    assert kind == "mean_keep"
    return a.float().mean(0, keepdim=True)


KINDS = [*UNARY, *BINARY, "to_", "to_", "where", "sum_keep", "amax_cols", "mean_keep"]


def program(steps):
    def fn(x, y, h, d, k, m):
        values = [x, y, h, d, k, m]
        for kind, arg in steps:
            values.append(step(kind, arg, values))
        return tuple(values[6:][-3:])
    return fn


def inputs(rows: int, cols: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for dtype, (has_rows, has_cols) in INPUTS.values():
        shape = (rows if has_rows else 1, cols if has_cols else 1)
        out.append((torch.randn(shape, generator=gen) * 3).to(dtype))
    return out


def tolerance(t: torch.Tensor) -> dict:
    # the cpu codegen keeps f32 between fused low-precision ops where eager rounds each one
    low = t.dtype in (torch.bfloat16, torch.float16)
    return {"rtol": 5e-2, "atol": 5e-2} if low else {"rtol": 1e-4, "atol": 1e-4}


@pytest.mark.slow
@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 50)),
                      min_size=1, max_size=10),
       seed=st.integers(0, 1000))
def test_mixed_dtype_programs_with_symbolic_sizes_match_eager(steps, seed):
    torch._dynamo.reset()
    fn = program(steps)
    compiler = Compiler("default", compile_cache=False)
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler},
                             dynamic=True)
    for rows, cols in SIZES:
        args = inputs(rows, cols, seed)
        for got, want in zip(compiled(*args), fn(*args), strict=True):
            torch.testing.assert_close(got, want, equal_nan=True, **tolerance(want))
    assert compiler.compilations
    for comp in compiler.compilations:
        assert comp.fallback_reason is None, comp.fallback_reason
    torch._dynamo.reset()



@pytest.mark.parametrize("fn", [
    lambda x, y, z: (x.sin(), y.cos()),
    lambda x, y, z: (x + y, y * 2),
    lambda x, y, z: (x.sum(0, keepdim=True), z.exp()),
], ids=["unrelated", "broadcast_output", "reduction_beside_column"])
def test_groups_of_different_symbolic_sizes_stay_apart_and_run_on_cpu(fn):
    """f32[s0, s1] and f32[1, s1] (or f32[s0, 1]) once had the same fusion domain (symbols
    counted as 1), so horizontal fusion merged them into a group the cpu codegen declines:
    it ran on the eager codegen."""
    torch._dynamo.reset()
    compiler = Compiler("default", compile_cache=False)
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler},
                             dynamic=True)
    args = (torch.randn(4, 6), torch.randn(1, 6), torch.randn(4, 1))
    torch.testing.assert_close(compiled(*args), fn(*args))
    (comp,) = compiler.compilations
    assert comp.compiled.choices
    assert all(c.codegen == "cpu" for c in comp.compiled.choices), [
        [str(r) for r in c.fallback_reasons] for c in comp.compiled.choices]
    torch._dynamo.reset()
