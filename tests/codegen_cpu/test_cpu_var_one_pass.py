"""var / std / var_mean of f32 (and narrower) rows in one pass (reduction.py
``shifted_moments``): the sums of the deviations from the row's first value, in double.

Checked against eager and against float64 on the rows that break a careless one-pass
variance: a large common offset, the first value an outlier holding all the variance (the
bound's worst case), constant and near-constant rows (never negative, so std is not NaN),
infinities before, at and after the first value and last, NaN, signed zeros, subnormals; in
f32, bf16 and f16, with correction 0 and 1, at row lengths around the SIMD block, and at the
longest row that takes one pass (8192) against the shortest that keeps two (8193).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from torchloom.testing.reductions import group_text

from torchloom_codegen_cpu.reduction import MEMORY_BARRIER, ONE_PASS_ROW

from conftest import compiled

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
INF, NAN = float("inf"), float("nan")


def _row(kind: str, n: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(n, generator=g, dtype=torch.float64)
    if kind == "offset":
        return 1e4 + x
    if kind == "outlier_first":  # x0 carries the whole variance: (mean - x0)^2 ~ n var
        y = x * 1e-3
        y[0] = 1e3
        return y
    if kind == "outlier_last":
        y = x * 1e-3
        y[-1] = 1e3
        return y
    if kind == "constant":
        return torch.full((n,), 3.25, dtype=torch.float64)
    if kind == "near_constant":
        return 1.0 + x * 1e-7
    if kind == "tiny":
        return x * 1e-40  # subnormal in f32
    if kind == "signed_zeros":
        return torch.where(x > 0, 0.0, -0.0)
    special = {"inf_first": (0, INF), "inf_middle": (n // 2, -INF), "inf_last": (n - 1, INF),
               "nan": (n // 3, NAN)}
    if kind in special:
        at, value = special[kind]
        x[at] = value
        return x
    if kind == "both_infs":
        x[0], x[-1] = INF, -INF
        return x
    return x


KINDS = ("randn", "offset", "outlier_first", "outlier_last", "constant", "near_constant",
         "tiny", "signed_zeros", "inf_first", "inf_middle", "inf_last", "nan", "both_infs")


def _inputs(n: int, dtype: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([_row(k, n, g) for k in KINDS]).to(DTYPES[dtype])


def _var_mean_text(n: int, dtype: str, correction: int) -> str:
    rows = len(KINDS)
    return group_text(f"%a: {dtype}[{rows}, {n}]", f"""
        %v, %m = aten.var_mean.correction(%a) {{dim = [1], correction = {correction}}} : {dtype}[{rows}], {dtype}[{rows}]
        %s = aten.std.correction(%a) {{dim = [1], correction = {correction}}} : {dtype}[{rows}]""",
        f"%v: {dtype}[{rows}], %m: {dtype}[{rows}], %s: {dtype}[{rows}]")


def _check_against_float64(got, x: torch.Tensor, correction: int) -> None:
    """Within 2 ulp of the float64 results rounded to the output type (relative, or below
    the type's smallest normal value), NaN and inf where those have them."""
    var, mean = torch.var_mean(x.double(), dim=1, correction=correction)
    wants = [t.to(x.dtype).double() for t in (var, mean, var.sqrt())]
    ulp, tiny = torch.finfo(x.dtype).eps, torch.finfo(x.dtype).tiny
    for g, want in zip(got, wants[:len(got)], strict=True):
        g = g.double()
        finite = torch.isfinite(want)
        assert torch.equal(torch.isnan(g), torch.isnan(want)), (g, want)
        assert torch.equal(g[~finite & ~torch.isnan(want)], want[~finite & ~torch.isnan(want)])
        err = (g - want).abs()[finite]
        assert (err <= 2 * ulp * want.abs()[finite] + tiny).all(), (g, want)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("n", [2, 3, 15, 16, 17, 33, 1000, ONE_PASS_ROW])
@pytest.mark.parametrize("correction", [0, 1])
def test_one_pass_var_matches_eager_and_float64(check, dtype, n, correction):
    x = _inputs(n, dtype)
    got, compiled = check(_var_mean_text(n, dtype, correction), x, exact=dtype != "f32",
                          rtol=2.5e-7, atol=0)
    source = check.codegen.generate(compiled.choices[0].node, check.registry).source
    assert "acc_sq" in source  # the one-pass form: sum of d and of d * d in one loop
    _check_against_float64(got, x, correction)
    assert (got[0][KINDS.index("constant")] == 0).all()
    assert (got[2][KINDS.index("near_constant")] >= 0).all()


@pytest.mark.parametrize("dtype,n", [("f32", ONE_PASS_ROW + 1), ("f64", 64)])
def test_long_rows_and_double_rows_keep_two_passes(check, dtype, n):
    """Past ONE_PASS_ROW (the error bound) and for f64 values (whose error it would not
    keep under half an ulp) var is the mean, then the sum of squared deviations."""
    torch_dtype = torch.float64 if dtype == "f64" else torch.float32
    x = _inputs(n, "f32").to(torch_dtype)
    text = _var_mean_text(n, dtype, 1)
    # f64: eager's Welford and the two passes differ by 2e-10 (relative) on the
    # near-constant row, whose condition number is ~1e14
    got, compiled = check(text, x, rtol=2.5e-7 if dtype == "f32" else 1e-9, atol=0)
    source = check.codegen.generate(compiled.choices[0].node, check.registry).source
    assert "acc_sq" not in source and source.count("reduction(+:") >= 2


def test_the_common_row_pays_no_infinity_check(check):
    """var_mean's flag for an infinite value before the last (eager's Welford mean is then
    NaN) is set by a walk that runs only on rows whose sum is not finite."""
    text = _var_mean_text(1024, "f32", 0)
    _, compiled = check(text, _inputs(1024, "f32"), rtol=2.5e-7, atol=0)
    source = check.codegen.generate(compiled.choices[0].node, check.registry).source
    # the row's blocks (their lanes combined as a tree, lanes.py): sums only
    simd = source.split("for (int64_t rb = 0;")[1].split("}")[0]
    assert "acc_sum" in simd and "INFINITY" not in simd
    assert "(isfinite(acc_sum" in source


def test_a_branching_first_value_is_fenced_from_the_row_loop(check, tmp_path):
    """The shift (the row's first value) is computed in a loop of its own, then a compiler
    barrier, then the row's SIMD loop: gcc 12 otherwise carried the first element into that
    loop and, GELU branching on ``x == INFINITY``, threaded it and ran it scalar (BERT's
    head: 316 against 59 us a call; benchmarks/RESULTS.md, session 59)."""
    def head(x, g, b):
        return torch.nn.functional.layer_norm(torch.nn.functional.gelu(x), (256,), g, b)
    compiler, fn = compiled(head, tmp_path)
    x, g, b = torch.randn(8, 256), torch.randn(256), torch.randn(256)
    x[1, 0], x[2, 5] = INF, -INF  # (GELU's branch: NaN at +inf, -0.0 at -inf)
    torch.testing.assert_close(fn(x, g, b), head(x, g, b), equal_nan=True)
    (source,) = [s for s in check.sources(compiler) if "tl_gelu" in s]
    shift = source.index("shift")
    assert shift < source.index(MEMORY_BARRIER, shift) < source.index("for (int64_t rb = 0;")


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(n=st.integers(2, 300), dtype=st.sampled_from(sorted(DTYPES)),
       offset=st.sampled_from([0.0, 1.0, -300.0, 1e5]),
       scale=st.sampled_from([1e-6, 1e-3, 1.0, 1e3]), seed=st.integers(0, 2**16))
def test_random_rows(check, n, dtype, offset, scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = (offset + scale * torch.randn(4, n, generator=g, dtype=torch.float64))
    x = x.to(DTYPES[dtype])
    rows = 4
    text = group_text(f"%a: {dtype}[{rows}, {n}]", f"""
        %v, %m = aten.var_mean.correction(%a) {{dim = [1], correction = 0}} : {dtype}[{rows}], {dtype}[{rows}]""",
        f"%v: {dtype}[{rows}], %m: {dtype}[{rows}]")
    got, _ = check(text, x, exact=dtype != "f32", rtol=2.5e-7, atol=0)
    _check_against_float64(got, x, 0)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("shape,dim", [((2, 1), 0), ((5, 40), 1), ((3, 300), -1), ((40, 7), 0)])
def test_a_kept_value_the_variance_reads_is_stored_whole(check, dtype, shape, dim):
    """tanh(x) is both an output and var's input: kept in a row buffer by the row's first
    loop for the loops after it. The shift's walk (r = 0 only) must not be that loop (a
    random group found its buffer filled at one element: the output read 0 elsewhere)."""
    t = f"{dtype}[{', '.join(map(str, shape))}]"
    kept = [n for d, n in enumerate(shape) if d != dim % len(shape)]
    r = f"{dtype}[{', '.join(map(str, kept))}]"
    text = group_text(f"%a: {t}", f"""
        %h = aten.tanh.default(%a) : {t}
        %v = aten.var.correction(%h) {{dim = [{dim}], keepdim = false}} : {r}
        %e = aten.exp.default(%a) : {t}
        %s, %m = aten.var_mean.correction(%e) {{dim = [{dim}], correction = 0}} : {r}, {r}""",
        f"%h: {t}, %v: {r}, %e: {t}, %s: {r}, %m: {r}")
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3)).to(DTYPES[dtype])
    check(text, x, exact=dtype != "f32", rtol=2.5e-6, atol=1e-6)
