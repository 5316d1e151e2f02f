"""A reduction's numerics in the core's lowering. What it accumulates in
(``reductions.accumulator``, whose sum rule the cpu codegen asks too): a variance in
double, as eager's CPU Welford, and a sum or mean past ``F32_SUM_COUNT`` f32 values an
accumulator (a long row, a long column, the column sums a row nest carries, a symbolic
count) in double, so that a renderer's plain loop adding values one by one gives eager's
values (an f32 accumulator adding 2M values of about 0.1 was 2 % off, a variance of values
near 100 off by a factor of 10^7). A renderer that renders no f64 keeps a short variance
in f32 and declines the others, naming why. A variance's degrees of freedom are eager's
``max(0, n - correction)`` (a correction past the row's length gave a negative
variance). Each group runs on ``scalar_c`` and is compared with eager."""

from __future__ import annotations

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.api import DTYPES, Reason, RendererCodegen, parse_graph, reductions, stmt
from torchloom.testing.reductions import group_text, symbolic_sizes
from torchloom.testing.renderers import lowered_against_eager

#: row lengths around the accumulator's threshold and far past it
_LENGTHS = [1, 2, 127, 128, 129, 1000, 4096, 70000]


def _no_f64(cls):
    class NoF64(cls):
        capabilities = attrs.evolve(cls.capabilities,
                                    dtypes=cls.capabilities.dtypes - {"f64"})
    return NoF64()


def _accumulators(lowered) -> dict[str, str]:
    """Each accumulator the kernel declares (a ``Var``, or a scratch array of
    accumulators) -> its dtype."""
    found = {s.name: s.ctype for s in stmt.walk(list(lowered.body)) if isinstance(s, stmt.Var)}
    scratch = [p for p in lowered.launch.params if p.role == "scratch"]
    found.update({p.name: p.dtype for p in scratch if p.name.startswith("acc_")})
    return found


def _drifting(g: torch.Generator, shape, dtype: str) -> torch.Tensor:
    """Values near 0.1, all positive: the values an accumulator adding one by one drifts
    furthest on."""
    return (0.1 + torch.rand(shape, generator=g) * 1e-3).to(DTYPES[dtype])


@settings(max_examples=30, deadline=None)
@given(n=st.sampled_from(_LENGTHS), rows=st.integers(1, 3),
       op=st.sampled_from(["sum", "mean"]), dtype=st.sampled_from(["f32", "bf16"]))
def test_long_row_sums_match_eager(scalar_c, n, rows, op, dtype):
    cls, registry = scalar_c
    name = "aten.sum.dim_IntList" if op == "sum" else "aten.mean.dim"
    text = group_text(f"%a: {dtype}[{rows}, {n}]", f"""
        %s = {name}(%a) {{dim = [-1]}} : {dtype}[{rows}]""", f"%s: {dtype}[{rows}]")
    a = _drifting(torch.Generator().manual_seed(n + rows), (rows, n), dtype)
    tol = (1e-6, 0) if dtype == "f32" else (1e-2, 0)
    lowered = lowered_against_eager(cls(), registry, text, (a,), *tol)
    acc = reductions.accumulator("sum", "f32", n)
    assert acc == ("f64" if n > reductions.F32_SUM_COUNT else "f32")
    assert [d for k, d in _accumulators(lowered).items() if k.startswith("sum")] == [acc]


@settings(max_examples=20, deadline=None)
@given(n=st.sampled_from(_LENGTHS[:-1]), cols=st.integers(1, 5))
def test_long_column_sums_match_eager(scalar_c, n, cols):
    """A sum over the first dim walks the columns (the column form), each column's
    accumulator in a scratch array: of doubles past the threshold."""
    cls, registry = scalar_c
    text = group_text(f"%a: f32[{n}, {cols}]", f"""
        %s = aten.sum.dim_IntList(%a) {{dim = [0]}} : f32[{cols}]""", f"%s: f32[{cols}]")
    a = _drifting(torch.Generator().manual_seed(n * cols), (n, cols), "f32")
    lowered = lowered_against_eager(cls(), registry, text, (a,), 1e-6, 0)
    if n > 1:  # (one row: by rows)
        assert [d for k, d in _accumulators(lowered).items() if k.startswith("acc_sum")] == [
            "f64" if n > reductions.F32_SUM_COUNT else "f32"]


@pytest.mark.parametrize("n", [4, 129, 3000])
def test_column_sums_a_row_nest_carries_match_eager(scalar_c, n):
    """Row sums and column sums of one tensor: the row nest carries the column sums, each
    column adding its ``n`` rows into an array of doubles past the threshold."""
    cls, registry = scalar_c
    text = group_text(f"%a: f32[{n}, 6]", f"""
        %s = aten.sum.dim_IntList(%a) {{dim = [1]}} : f32[{n}]
        %c = aten.sum.dim_IntList(%a) {{dim = [0]}} : f32[6]""", f"%s: f32[{n}], %c: f32[6]")
    a = _drifting(torch.Generator().manual_seed(n), (n, 6), "f32")
    lowered = lowered_against_eager(cls(), registry, text, (a,), 1e-6, 0)
    carried = {p.name: p.dtype for p in lowered.launch.params
               if p.role == "scratch" and p.name.startswith("acc_colsum")}
    assert list(carried.values()) == ["f64" if n > reductions.F32_SUM_COUNT else "f32"]


_VARIANCES = {"var": "aten.var.correction", "std": "aten.std.correction",
              "var_mean": "aten.var_mean.correction"}


def _variance(op: str, dtype: str, rows: int, n: int, correction) -> str:
    out = f"{dtype}[{rows}]"
    lhs, types, outs = ("%v, %m", f"{out}, {out}", f"%v: {out}, %m: {out}") \
        if op == "var_mean" else ("%v", out, f"%v: {out}")
    return group_text(f"%a: {dtype}[{rows}, {n}]", f"""
        {lhs} = {_VARIANCES[op]}(%a) {{dim = [-1], correction = {correction}}} : {types}""",
        outs)


@settings(max_examples=25, deadline=None)
@given(n=st.sampled_from(_LENGTHS[1:]), op=st.sampled_from(sorted(_VARIANCES)),
       dtype=st.sampled_from(["f32", "f64", "bf16"]), correction=st.integers(0, 1))
def test_variances_in_double_match_eager(scalar_c, n, op, dtype, correction):
    """Values of mean 100 and spread 1e-3 (bf16: 8, which its spacing of 0.5 at 100 keeps):
    a variance computed in the input's dtype loses every digit; in double, eager's."""
    cls, registry = scalar_c
    text = _variance(op, dtype, 2, n, correction)
    g = torch.Generator().manual_seed(n)
    spread = 8 if dtype == "bf16" else 1e-3
    a = (100 + torch.rand(2, n, generator=g, dtype=torch.float64) * spread).to(DTYPES[dtype])
    assert a.var(-1).min() > 0  # (the values differ: there is a variance to get wrong)
    tol = {"f32": (1e-5, 1e-12), "f64": (1e-9, 1e-15), "bf16": (1.6e-2, 1e-6)}[dtype]
    lowered = lowered_against_eager(cls(), registry, text, (a,), *tol)
    assert {d for k, d in _accumulators(lowered).items()
            if k.startswith(("sum", "var"))} == {"f64"}


@pytest.mark.parametrize("op", ["aten.sum.dim_IntList", "aten.mean.dim"])
@pytest.mark.parametrize("shape", [(3, 100), (2, 5000)])
def test_a_symbolic_row_sums_in_double(scalar_c, shape, op):
    """A row whose length is known only at the call may be long: its sum (a mean's) takes
    the double accumulator at every length."""
    cls, registry = scalar_c
    text = symbolic_sizes(group_text(f"%a: f32[{shape[0]}, {shape[1]}]", f"""
        %s = {op}(%a) {{dim = [-1]}} : f32[{shape[0]}]""", f"%s: f32[{shape[0]}]"))
    a = _drifting(torch.Generator().manual_seed(shape[1]), shape, "f32")
    lowered = lowered_against_eager(cls(), registry, text, (a,), 1e-6, 0)
    assert [d for k, d in _accumulators(lowered).items() if k.startswith("sum")] == ["f64"]


_SUM = "aten.sum.dim_IntList"


@pytest.mark.parametrize("shape, body, out, why", [
    ([2, 4096], f"%s = {_SUM}(%a) {{dim = [-1]}} : f32[2]", "%s: f32[2]",
     "a sum of 4096 f32 values"),
    ([4096, 3], f"%s = {_SUM}(%a) {{dim = [0]}} : f32[3]", "%s: f32[3]",
     "a sum of 4096 f32 values"),
    ([4096, 6], f"""%s = {_SUM}(%a) {{dim = [1]}} : f32[4096]
        %c = {_SUM}(%a) {{dim = [0]}} : f32[6]""", "%s: f32[4096], %c: f32[6]",
     "a sum of 4096 f32 values"),
    ([2, "s5"], f"%s = {_SUM}(%a) {{dim = [-1]}} : f32[2]", "%s: f32[2]",
     "a sum of a symbolic count (s5) of f32 values"),
    ([2, 4096], "%s = aten.var.correction(%a) {dim = [-1]} : f32[2]", "%s: f32[2]",
     "a variance of 4096 f32 values"),
    ([2, 100], "%s = aten.var.correction(%a) {dim = [-1]} : f32[2]", "%s: f32[2]", None),
    ([2, 100], f"%s = {_SUM}(%a) {{dim = [-1]}} : f32[2]", "%s: f32[2]", None),
    ([4096, 2], f"%s = {_SUM}(%a) {{dim = [1]}} : f32[4096]", "%s: f32[4096]", None),
    ([2, 4096], "%s = aten.amax.default(%a) {dim = [-1]} : f32[2]", "%s: f32[2]", None)])
def test_a_renderer_without_f64_declines_what_needs_it(scalar_c, shape, body, out, why):
    """No f64 in a renderer's dtypes: a long sum (of a row, of columns, carried by a row
    nest, of a symbolic count) and a long variance are declined with the reason (their
    values would not be eager's); short sums, a short variance (in f32) and a maximum are
    rendered and match eager."""
    cls, registry = scalar_c
    text = group_text(f"%a: f32[{', '.join(map(str, shape))}]", body, out)
    group = next(parse_graph(text).nodes)
    reason = RendererCodegen(_no_f64(cls)).supports(group, registry)
    if why is not None:
        assert reason == Reason("scalar_c", f"{why} accumulates in f64 for eager's values; "
                                            f"the renderer renders no f64")
        return
    assert reason is None
    a = _drifting(torch.Generator().manual_seed(1), shape, "f32") * 1000
    lowered = lowered_against_eager(_no_f64(cls), registry, text, (a,), 1e-5, 0)
    assert "f64" not in _accumulators(lowered).values()


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), correction=st.sampled_from([0, 1, 2, 3, 5, 9, 0.5, 2.5]),
       op=st.sampled_from(sorted(_VARIANCES)), symbolic=st.booleans(),
       equal=st.booleans())
def test_degrees_of_freedom_are_eagers_at_any_correction(scalar_c, n, correction, op,
                                                         symbolic, equal):
    """``max(0, n - correction)``: a correction at or past the row's length divides by 0
    (inf; NaN where the row's values are equal), at static and symbolic lengths; a
    fractional correction at a symbolic length is declined, named."""
    cls, registry = scalar_c
    text = _variance(op, "f32", 3, n, correction)
    if symbolic:
        text = symbolic_sizes(text)
    g = torch.Generator().manual_seed(n)
    a = torch.full((3, n), 2.5) if equal else torch.randn(3, n, generator=g)
    if symbolic and n > 1 and correction != int(correction):  # (a dim of 1 stays static)
        group = next(parse_graph(text).nodes)
        reason = RendererCodegen(cls()).supports(group, registry)
        assert reason is not None and "fractional correction" in reason.message, reason
        return
    lowered_against_eager(cls(), registry, text, (a,), 1e-5, 1e-6)
