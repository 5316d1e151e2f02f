"""The column form split by rows (columns.py, ``split_by_rows``): long sums in double over
few columns walk the threads' shares of rows into partials added after the loop. The
values match eager at every thread count (NaN and inf where eager has them), on one
thread they are bitwise the unsplit column walk's (the same double sums in the same
order), and the groups the rule leaves out keep the blocks of columns."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import thread_count
from torchloom.testing.reductions import group_text, randn
from torchloom_codegen_cpu import columns

_DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16}


def _gelu_grad_and_bias_grad(shape: tuple, dtype: str = "f32", mean: bool = False) -> str:
    """GELU's gradient of ``shape`` and its sum (or mean) over every dim but the last, as
    the backward of a linear layer has them; also the sum of the incoming gradient."""
    rows = 1
    for d in shape[:-1]:
        rows *= d
    n = shape[-1]
    t = f"{dtype}[{', '.join(map(str, shape))}]"
    dims = ", ".join(str(d) for d in range(len(shape) - 1))
    op = "aten.mean.dim" if mean else "aten.sum.dim_IntList"
    return group_text(f"%g: {t}, %x: {t}", f"""
        %d = aten.gelu_backward.default(%g, %x) : {t}
        %s = {op}(%d) {{dim = [{dims}]}} : {dtype}[{n}]
        %b = aten.sum.dim_IntList(%g) {{dim = [{dims}]}} : {dtype}[{n}]""",
                      f"%d: {t}, %s: {dtype}[{n}], %b: {dtype}[{n}]")


def _split(check, text: str) -> bool:
    source = check.source(text)
    return "r0; r < r1" in source and "free(parts)" in source


def _inputs(shape, dtype: str, seed: int, specials=()) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ins = [randn(g, *shape, dtype=_DTYPES[dtype]) for _ in range(2)]
    for pos, value in specials:
        ins[0].view(-1)[pos % ins[0].numel()] = value
    return ins


@pytest.mark.parametrize("shape, dtype, mean", [
    ((394, 256), "f32", False), ((2, 197, 1024), "f32", False), ((512, 8192), "f32", False),
    ((130, 48), "f64", False), ((3, 70, 17), "f32", True), ((200, 100), "bf16", False)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_split_by_rows_matches_eager(check, shape, dtype, mean, threads):
    text = _gelu_grad_and_bias_grad(shape, dtype, mean)
    assert _split(check, text)
    tolerance = {"bf16": dict(atol=2e-2, rtol=2e-2)}.get(dtype, dict(atol=1e-4, rtol=1e-5))
    with thread_count(threads):
        check(text, *_inputs(shape, dtype, seed=threads), **tolerance)


@pytest.mark.parametrize("threads", [1, 2])
def test_one_thread_is_bitwise_the_column_walk(check, monkeypatch, threads):
    """On one thread the split walk is the column walk (one share, its partials the
    block's accumulators); on two the partials' sum agrees to rounding."""
    shape = (300, 512)
    text = _gelu_grad_and_bias_grad(shape)
    ins = _inputs(shape, "f32", seed=5, specials=[(7, float("nan")), (900, float("inf"))])
    with thread_count(threads):
        split, _ = check(text, *ins, atol=1e-4, rtol=1e-5)
        monkeypatch.setattr(columns, "SPLIT_ROWS", 10 ** 9)
        assert not _split(check, text)
        blocks, _ = check(text, *ins, atol=1e-4, rtol=1e-5)
    for a, b in zip(split, blocks):
        if threads == 1:
            assert torch.equal(a.nan_to_num(), b.nan_to_num())
        else:
            torch.testing.assert_close(a, b, rtol=2e-7, atol=1e-6, equal_nan=True)


_AMAX = """
        %m = aten.amax.default(%a) {dim = [0]} : f32[64]"""
_SOFTMAX_SUM = """
        %m = aten.amax.default(%a) {dim = [0], keepdim = true} : f32[1, 64]
        %d = aten.sub.Tensor(%a, %m) : f32[300, 64]
        %e = aten.exp.default(%d) : f32[300, 64]
        %s = aten.sum.dim_IntList(%e) {dim = [0]} : f32[64]"""


@pytest.mark.parametrize("text, shapes", [
    (_gelu_grad_and_bias_grad((63, 256)), [(63, 256)] * 2),  # too few rows
    (_gelu_grad_and_bias_grad((200, 8200)), [(200, 8200)] * 2),  # too many columns
    (_gelu_grad_and_bias_grad((100, 48)), [(100, 48)] * 2),  # summed in f32, not double
    (group_text("%a: f32[300, 64]", _AMAX, "%m: f32[64]"), [(300, 64)]),  # not a sum
    (group_text("%a: f32[300, 64]", _SOFTMAX_SUM, "%s: f32[64]"), [(300, 64)]),  # two walks
])
def test_other_groups_keep_the_blocks_of_columns(check, text, shapes):
    assert not _split(check, text)
    g = torch.Generator().manual_seed(0)
    with thread_count(2):
        check(text, *[randn(g, *s) for s in shapes], atol=1e-4, rtol=1e-5)


@settings(max_examples=20, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(lead=st.lists(st.integers(1, 40), min_size=1, max_size=2).filter(
           lambda d: d[0] * (d[1] if len(d) > 1 else 1) >= 129),
       n=st.integers(1, 600), dtype=st.sampled_from(["f32", "f64"]),
       threads=st.sampled_from([1, 2, 4]),
       specials=st.lists(st.tuples(st.integers(0, 10 ** 6), st.sampled_from(
           [float("nan"), float("inf"), -float("inf"), -0.0, 1e-40])), max_size=3))
def test_random_shapes_match_eager(check, lead, n, dtype, threads, specials):
    shape = (*lead, n)
    text = _gelu_grad_and_bias_grad(shape, dtype)
    assert _split(check, text)
    with thread_count(threads):
        check(text, *_inputs(shape, dtype, seed=n, specials=specials), atol=1e-4, rtol=1e-5)
