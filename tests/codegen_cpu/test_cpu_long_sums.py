"""Long f32 sums through the cpu codegen stay as accurate as eager's (the core's
``reductions.sum_dtype``).

An f32 accumulator adding k values drifts by up to ~k/2 ulp: SIMD lanes summing a row of
4M values of about 100 were 0.17% off (eager's cascade sum: 4e-8), and a column of 200k
rows more. Sums whose accumulators would add more than ``F32_SUM_COUNT`` values each (or a
symbolic count) are taken in double. Checked here end to end through ``torch.compile``
against the float64 sum of the same float32 values: full, row and column sums and means,
at static and symbolic sizes, on values of one sign and magnitude (the worst case for a
running sum) and on values that cancel; the kernel must be the cpu codegen's."""

from __future__ import annotations

import pytest
import torch

from conftest import codegens, compiled
from torchloom.api import reductions
from torchloom_codegen_cpu.reduction import ROW_LANES

F32_SUM_COUNT, sum_dtype = reductions.F32_SUM_COUNT, reductions.sum_dtype

CASES = {
    "full_sum": (lambda a: (a * 1.5).sum(), 4_000_000),
    "full_mean": (lambda a: (a + 1).mean(), 3_000_017),
    "row_sums": (lambda a: (a * 2).view(4, -1).sum(1), 4 * 300_001),
    "row_means_keepdim": (lambda a: (a - 3).view(8, -1).mean(1, keepdim=True), 8 * 40_000),
    "column_sums": (lambda a: (a * 1.5).view(-1, 16).sum(0), 16 * 100_003),
    "column_means_of_3d": (lambda a: (a + 0.5).view(-1, 4, 8).mean(0), 32 * 50_000),
    "short_rows_stay_f32": (lambda a: (a * 1.5).view(-1, 2048).sum(1), 64 * 2048),
}
DATA = {"one_sign": lambda g, n: torch.rand(n, generator=g) + 100,
        "cancelling": lambda g, n: torch.randn(n, generator=g) * 100}


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref).abs() / ref.abs().clamp_min(1e-30)).max().item()


@pytest.mark.parametrize("data", sorted(DATA))
@pytest.mark.parametrize("name", sorted(CASES))
def test_long_sum_as_accurate_as_eager(tmp_path, name, data):
    fn, n = CASES[name]
    a = DATA[data](torch.Generator().manual_seed(n), n)
    compiler, c = compiled(fn, tmp_path)
    got = c(a)
    ref = fn(a.double())  # the same f32 values, summed in double
    assert codegens(compiler) == ["cpu"]
    bound = max(4 * relative_error(fn(a), ref), 2.5e-7)  # eager's error, or 4 ulp of f32
    if data == "cancelling":  # a sum near 0: relative to the sum of magnitudes
        scale = fn(a.double().abs()).abs()
        err = ((got.double() - ref).abs() / scale).max().item()
        assert err <= 2.5e-7, err
    else:
        assert relative_error(got, ref) <= bound


@pytest.mark.parametrize("n", [5_000, 1_000_003])
def test_symbolic_length_sums_in_double(tmp_path, n):
    """A row of symbolic length may be long: summed in double at every length."""
    fn = lambda a: (a * 1.5).sum(-1)  # noqa: E731
    compiler, c = compiled(fn, tmp_path, dynamic=True)
    g = torch.Generator().manual_seed(n)
    for rows in (3, 5):
        a = torch.rand(rows, n, generator=g) + 100
        assert relative_error(c(a), fn(a.double())) <= 2.5e-7
    sources = "".join(compiler.kernel_source(ch).source for comp in compiler.compilations
                      for ch in comp.compiled.choices)
    assert "double acc_sum" in sources


def test_accumulator_rule():
    assert sum_dtype("f32", F32_SUM_COUNT * ROW_LANES, ROW_LANES) == "f32"
    assert sum_dtype("f32", F32_SUM_COUNT * ROW_LANES + 1, ROW_LANES) == "f64"
    assert sum_dtype("f32", F32_SUM_COUNT + 1, 1) == "f64"
    assert sum_dtype("f32", "s0", ROW_LANES) == "f64"  # symbolic: any length
    assert sum_dtype("f64", 10**9, 1) == "f64" and sum_dtype("i64", 10**9, 1) == "i64"
