"""``aten.any`` / ``aten.all`` (dim, dims, default) as C reductions (bugs.md item 1: they
were declined, "has no C template", and ran on eager): max / min of the elements as bools,
NaN counting as nonzero, the result in the op's dtype (uint8 for uint8 inputs, as eager)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16,
          "i64": torch.int64, "i32": torch.int32, "u8": torch.uint8, "b8": torch.bool}


def values(shape, dtype: str, seed: int, special: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x = torch.where(torch.rand(shape, generator=g) < 0.6, torch.zeros(()), x)  # many zeros
    if special and dtype in ("f32", "f64", "bf16") and x.numel():
        flat = x.view(-1)
        flat[0], flat[-1] = float("nan"), -0.0  # NaN is nonzero, -0.0 is zero
        flat[len(flat) // 2] = float("-inf")
    if dtype == "b8":
        return x != 0
    return (x * 3).to(DTYPES[dtype])


def group(op: str, shape, dtype: str, dims, keepdim: bool) -> tuple[str, str]:
    rank = len(shape)
    reduced = sorted({d % rank for d in dims}) if dims is not None else list(range(rank))
    out = [1 if d in reduced else s for d, s in enumerate(shape)] if keepdim else \
        [s for d, s in enumerate(shape) if d not in reduced]
    out_dtype = "u8" if dtype == "u8" else "b8"
    result = f"{out_dtype}[{', '.join(map(str, out))}]"
    if dims is None:
        stmt = f"%r = aten.{op}.default(%a) : {result}"
    elif len(dims) == 1:
        stmt = f"%r = aten.{op}.dim(%a) {{dim = {dims[0]}, keepdim = {str(keepdim).lower()}}} : {result}"
    else:
        stmt = (f"%r = aten.{op}.dims(%a) {{dim = [{', '.join(map(str, dims))}], "
                f"keepdim = {str(keepdim).lower()}}} : {result}")
    tensor = f"{dtype}[{', '.join(map(str, shape))}]"
    text = (f"graph @g(%a: {tensor}) {{\n  %n = aten.neg.default(%a) : {tensor}\n"
            if dtype not in ("b8", "u8") else f"graph @g(%a: {tensor}) {{\n")
    source = "%n" if dtype not in ("b8", "u8") else "%a"
    text += f"  {stmt.replace('(%a)', f'({source})')}\n  return %r\n}}\n"
    return text, result


@pytest.mark.parametrize("op", ["any", "all"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_any_all_over_the_last_dim_match_eager(check, op, dtype):
    text, _ = group(op, (33, 70), dtype, [-1], False)
    got, _ = check(text, values((33, 70), dtype, 0, True), exact=True)
    assert got[0].dtype == (torch.uint8 if dtype == "u8" else torch.bool)


def test_rows_of_all_zeros_and_all_ones(check):
    x = torch.zeros(4, 50)
    x[1] = 1.0
    x[2, 7] = float("nan")
    x[3] = -0.0
    for op in ("any", "all"):
        got, _ = check(group(op, (4, 50), "f32", [1], True)[0], x, exact=True)
        expected = getattr(-x, op)(1, keepdim=True)
        assert torch.equal(got[0], expected)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(["any", "all"]), dtype=st.sampled_from(sorted(DTYPES)),
       shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
       keepdim=st.booleans(), form=st.sampled_from(["last", "all", "default"]),
       seed=st.integers(0, 2 ** 16), special=st.booleans())
def test_random_any_all_groups_match_eager(check, op, dtype, shape, keepdim, form, seed,
                                           special):
    rank = len(shape)
    dims = {"last": [-1], "all": list(range(rank)) if rank > 1 else [0],
            "default": None}[form]
    if form == "default":
        keepdim = False
    text, _ = group(op, tuple(shape), dtype, dims, keepdim)
    check(text, values(tuple(shape), dtype, seed, special), exact=True)


def test_any_under_torch_compile_runs_a_c_kernel():
    from torchloom.tools import Compiler
    from torchloom.backend import torchloom_backend

    compiler = Compiler("default", compile_cache=False, strict=True)
    torch._dynamo.reset()
    f = torch.compile(lambda x: ((x > 0).any(-1), x.abs().all(0)), backend=lambda gm, ex:
                      torchloom_backend(gm, ex, options={"compiler": compiler}))
    x = torch.randn(40, 64)
    x[3] = 0
    for got, want in zip(f(x), ((x > 0).any(-1), x.abs().all(0))):
        assert torch.equal(got, want)
    choices = [c for comp in compiler.compilations for c in comp.compiled.choices]
    assert choices and {c.codegen for c in choices} == {"cpu"}, [
        str(r) for c in choices for r in c.fallback_reasons]
    torch._dynamo.reset()
