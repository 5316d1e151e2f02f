"""Reductions whose row loop is one chain of dependent vector operations are walked as
``SPLIT`` contiguous parts side by side, each with its own accumulators, combined after the
loop (emitter.py ``end_reduction_phase``): the results match eager for every kind and
dtype, with NaN, inf and -0.0 at the first and last element of each part (the flags and
the combine), and only whole-block rows long enough are split."""

from __future__ import annotations

import pytest
import torch
from torchloom.api import parse_graph

from torchloom_codegen_cpu.emitter import SPLIT, TAIL

from conftest import group_text

SPLIT_LENGTHS = [4 * SPLIT * TAIL, 5 * SPLIT * TAIL, 1024, 4096]
WHOLE_LENGTHS = [4 * SPLIT * TAIL - SPLIT * TAIL, 1000, 4 * SPLIT * TAIL + TAIL]
DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16,
          "i32": torch.int32, "i64": torch.int64}


def _text(n: int, dtype: str) -> str:
    t, r = f"{dtype}[4, {n}]", f"{dtype}[4]"
    total = "i64[4]" if dtype.startswith("i") else r  # (integer sums are int64)
    body = [f"%m = aten.amax.default(%a) {{dim = [1]}} : {r}",
            f"%n = aten.amin.default(%a) {{dim = [1]}} : {r}",
            f"%s = aten.sum.dim_IntList(%a) {{dim = [1]}} : {total}",
            f"%y = aten.any.dim(%a) {{dim = 1}} : b8[4]",
            f"%l = aten.all.dim(%a) {{dim = 1}} : b8[4]"]
    results = [f"%m: {r}", f"%n: {r}", f"%s: {total}", "%y: b8[4]", "%l: b8[4]"]
    if dtype.startswith("f") or dtype == "bf16":
        body += [f"%u = aten.mean.dim(%a) {{dim = [1]}} : {r}",
                 f"%q = aten.mul.Tensor(%a, %a) : {t}",
                 f"%w = aten.sum.dim_IntList(%q) {{dim = [1]}} : {r}"]
        results += [f"%u: {r}", f"%w: {r}"]
    if dtype.startswith("f"):  # (eager's bf16 prod rounds every step: 5-10% off here,
        # where the kernel's f32 product is within 0.3% of float64)
        body.append(f"%p = aten.prod.dim_int(%a) {{dim = 1}} : {r}")
        results.append(f"%p: {r}")
    return group_text(f"%a: {t}", "\n".join(body), ", ".join(results))


def _rows(n: int, dtype: str, special: str | None, at: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.startswith("i"):
        a = torch.randint(-2**30, 2**30, (4, n), generator=g)  # (sums past i32's range)
        a[1] = torch.randint(0, 3, (n,), generator=g)  # zeros for all()
        return a.to(DTYPES[dtype])
    a = torch.rand(4, n, generator=g, dtype=torch.float64) * 0.4 + 0.8  # products stay finite
    a[2, :n // 2] = 0.0
    if special is not None:
        a[seed % 4, at] = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"),
                           "-0": -0.0}[special]
    return a.to(DTYPES[dtype])


def _tolerance(dtype: str) -> dict:
    return {"f32": dict(rtol=2e-6, atol=1e-5), "f64": dict(rtol=1e-12, atol=1e-12),
            "bf16": dict(rtol=1.6e-2, atol=1e-2)}.get(dtype, dict(rtol=0, atol=0))


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("n", SPLIT_LENGTHS + WHOLE_LENGTHS)
def test_split_rows_match_eager(check, n, dtype):
    text = _text(n, dtype)
    _, compiled = check(text, _rows(n, dtype, None, 0, 0), **_tolerance(dtype))
    source = check.codegen.generate(compiled.choices[0].node, check.registry).source
    assert ("r_part" in source) == (n in SPLIT_LENGTHS), n
    if dtype.startswith("i"):
        return
    part = n // SPLIT
    places = sorted({k * part for k in range(SPLIT)} | {k * part - 1 for k in range(1, SPLIT + 1)})
    for special in ("nan", "inf", "-inf", "-0"):
        for seed, at in enumerate(places, 1):
            check(text, _rows(n, dtype, special, at, seed), **_tolerance(dtype))


def test_long_bodies_keep_one_walk(codegen, registry):
    """softmax's sum of exp(x - max) computes enough per element to fill the vector units:
    its loop is not split; the max before it is."""
    n = 1024
    text = group_text(f"%a: f32[4, {n}]", f"""
        %m = aten.amax.default(%a) {{dim = [1], keepdim = true}} : f32[4, 1]
        %d = aten.sub.Tensor(%a, %m) : f32[4, {n}]
        %e = aten.exp.default(%d) : f32[4, {n}]
        %s = aten.sum.dim_IntList(%e) {{dim = [1], keepdim = true}} : f32[4, 1]
        %y = aten.div.Tensor(%e, %s) : f32[4, {n}]""", f"%y: f32[4, {n}]")
    node = next(parse_graph(text).nodes)
    assert codegen.supports(node, registry) is None
    source = codegen.generate(node, registry).source
    assert source.count("for (int64_t r_part") == 1
    assert "reduction(max:acc_max1, acc_max1_1" in source.replace("\n", " ")
