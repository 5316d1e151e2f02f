"""Transcendentals in the cpu codegen: vectorized (the library calls libmvec's SIMD
variants, or the prelude's inline versions, never one scalar libm call per element) and
within their documented error bounds against float64: libmvec's functions within 4 ulp
(glibc's bound), the prelude's f32 exp within 1.03 ulp (measured over every float), its
f32 tanh within 4.9 ulp (measured over every float: ``BOUND``), the rational erf used by
GELU within 3.5e-7 absolute (prelude.py), GELU itself within 4 ulp + 2e-7 * |x|."""

from __future__ import annotations

import subprocess

import pytest
import torch
from torchloom.api import parse_graph, stmt

from conftest import group_text
from torchloom_codegen_cpu import libmvec, ops
from torchloom_codegen_cpu.toolchain import build

N = 1 << 16
UNARY = ["exp", "log", "tanh", "erf", "sigmoid", "sin", "cos", "expm1", "log1p", "log2",
         "exp2"]
#: ulp bounds other than libmvec's 4: the prelude's rational tanh (4.9 over every float)
BOUND = {"tanh": 4.9}


def _inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    dense = torch.linspace(-12, 12, N // 2)
    wide = torch.randn(N // 2, generator=g) * torch.exp(torch.randn(N // 2, generator=g) * 3)
    return torch.cat([dense, wide])


def _ulp(ref: torch.Tensor) -> torch.Tensor:
    r = ref.float().abs()
    return (torch.nextafter(r, torch.tensor(float("inf"))) - r).double()


@pytest.fixture(scope="module")
def results(registry, codegen):
    """Every op as its own kernel (its own loop), all in one library: one compiler call."""
    kernels = []
    for op in [*UNARY, "gelu"]:
        text = group_text(f"%a: f32[{N}]", f"%o = aten.{op}.default(%a) : f32[{N}]",
                          f"%o: f32[{N}]")
        node = next(parse_graph(text).nodes)
        assert codegen.supports(node, registry) is None
        kernels.append(codegen.generate(node, registry))
    x = _inputs()
    launchers = codegen.load_many(kernels, registry)
    got = {op: launcher(x)[0] for op, launcher in zip([*UNARY, "gelu"], launchers)}
    return x, got, kernels


@pytest.mark.parametrize("op", UNARY)
def test_libm_functions_within_4_ulp(results, op):
    x, got, _ = results
    fn = {"sigmoid": torch.sigmoid}.get(op) or getattr(torch, op)
    ref = fn(x.double())
    ok = torch.isfinite(ref.float()) & (ref.abs() > 1e-30)
    err = (got[op].double() - ref).abs()[ok] / _ulp(ref)[ok]
    assert err.max().item() <= BOUND.get(op, 4.0), (op, err.max().item())
    both_nan = torch.isnan(got[op]) == torch.isnan(ref.float())
    assert both_nan.all(), op


def test_inline_exp_within_its_bound(registry, codegen):
    """``tl_exp`` (f32 exp, sigmoid, silu, GELU's gradient) on a dense sweep of [-104, 89],
    where results run from 0 through subnormals to overflow: within 1.03 ulp of exp in
    float64 (its exhaustively measured bound), exactly 0 or inf where those are the rounded
    result, NaN for NaN, and 0 / inf at -inf / inf."""
    n = 1 << 18
    x = torch.cat([torch.linspace(-104, 89, n), torch.tensor(
        [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-45, -1e-45, 88.72283,
         88.72284, -87.33655, -103.28, -103.97, -104.5, 89.5])])
    text = group_text(f"%a: f32[{len(x)}]", f"%o = aten.exp.default(%a) : f32[{len(x)}]",
                      f"%o: f32[{len(x)}]")
    node = next(parse_graph(text).nodes)
    (got,) = codegen.load_many([codegen.generate(node, registry)], registry)[0](x)
    ref = torch.exp(x.double())
    rounded = ref.float()
    special = ~torch.isfinite(rounded) | (rounded == 0)
    torch.testing.assert_close(got[special], rounded[special], rtol=0, atol=0, equal_nan=True)
    err = (got.double() - ref).abs()[~special] / _ulp(ref)[~special]
    assert err.max().item() <= 1.03, err.max().item()


def test_gelu_error_bound(results):
    x, got, _ = results
    xd = x.double()
    ref = 0.5 * xd * (1 + torch.erf(xd / 2 ** 0.5))
    err = (got["gelu"].double() - ref).abs()
    bound = 4 * _ulp(ref) + 2e-7 * xd.abs()
    assert (err <= bound).all(), (err - bound).max().item()


@pytest.mark.parametrize("form", ops.GELU_FORMS)
def test_every_gelu_form_within_the_bound(registry, codegen, monkeypatch, form):
    """Each of the prelude's GELUs (a kernel calls the one eager's vectorized kernel is on
    the CPU it is built for: ``ops.eager_gelu_form``) within 4 ulp + 2e-7 |x| of x Phi(x)
    on every finite input, whichever form this CPU's eager has."""
    monkeypatch.setattr(ops, "eager_gelu_form", lambda dtype: form)
    text = group_text(f"%a: f32[{N}]", f"%o = aten.gelu.default(%a) : f32[{N}]",
                      f"%o: f32[{N}]")
    kernel = codegen.generate(next(parse_graph(text).nodes), registry)
    assert f"{form}(" in kernel.source
    x = _inputs()
    (got,) = codegen.load_many([kernel], registry)[0](x)
    xd = x.double()
    ref = 0.5 * xd * (1 + torch.erf(xd / 2 ** 0.5))
    err = (got.double() - ref).abs()
    bound = 4 * _ulp(ref) + 2e-7 * xd.abs()
    assert (err <= bound).all(), (form, (err - bound).max().item())


def test_transcendentals_call_vector_variants(results, codegen):
    _, _, kernels = results
    head = kernels[0].source[:kernels[0].source.index("/* torchloom cpu kernel")]
    source = head + "".join(sorted(k.source[len(head):] for k in kernels))
    path = build(source, codegen.toolchain(), codegen.cache_dir, codegen.timeout)
    assert path.exists()  # the library load_many built: a cache hit, no compiler call
    if not codegen.toolchain().vector_math:
        pytest.skip("this C library has no libmvec")  # glibc on x86-64 has it
    symbols = subprocess.run(["nm", "-D", str(path)], capture_output=True, text=True).stdout
    undefined = {line.split()[-1].split("@")[0] for line in symbols.splitlines()
                 if line.split()[:1] == ["U"]}
    if "clang" in codegen.toolchain().version:  # -fveclib=libmvec's table (clang 14)
        for fn in ("logf", "sinf", "cosf"):
            assert any(u.startswith("_ZGV") and u.endswith(f"v_{fn}") for u in undefined), fn
        return
    # gcc: one double variant per function (libmvec.py), its clone called by the loops,
    # f32 through it; no scalar libm symbol
    variants = {u.split("v_", 1)[1] for u in undefined if u.startswith("_ZGV")}
    # (cos in f32 through the double variant)
    assert {*libmvec.VECTOR_MATH, *(f + "f" for f in libmvec.VECTOR_MATH)} - {"cosf"} == variants
    assert len({u[4] for u in undefined if u.startswith("_ZGV")}) == 1, undefined  # one ISA
    assert not undefined & {*libmvec.VECTOR_MATH, *(f + "f" for f in libmvec.VECTOR_MATH)}
    code = subprocess.run(["objdump", "-d", str(path)], capture_output=True, text=True).stdout
    for fn in ("logf", "sinf", "cos", "log1pf", "expm1f"):
        assert f"v_tl_m_{fn}>" in code, fn  # (the clone called by an f32 loop)
    # f32 exp (and sigmoid, which uses it) and tanh are the prelude's inline tl_exp and
    # tl_tanh: no libm call
    kernels_text = stmt.lexed(source[len(head):]).calls
    assert not kernels_text & {"exp", "expf", "tanh", "tanhf"}, kernels_text


def test_tanh_never_exceeds_its_argument(registry, codegen):
    """Small arguments: libmvec's tanhf is 1 ulp off there (tanhf(-3.0450031e-4) is
    x + 1 ulp where eager's is x), so sqrt(x - tanh(x)) was NaN where eager gives 0 (found
    by the 10,000-group fuzz run). Over small arguments of both signs and the edge values:
    |tanh(x)| <= |x|, x's sign, eager's bits (correctly rounded there), and no NaN."""
    g = torch.Generator().manual_seed(0)
    small = torch.cat([torch.linspace(1e-7, 5e-3, 1 << 17),
                       torch.randn(1 << 17, generator=g).abs() * 1e-3])
    x = torch.cat([small, -small, torch.tensor([0.0, -0.0, float("nan"), float("inf"),
                                                float("-inf"), 1e-45, -1e-45])])
    n = len(x)
    text = group_text(f"%a: f32[{n}]", f"%t = aten.tanh.default(%a) : f32[{n}]\n"
                      f"%d = aten.sub.Tensor(%a, %t) : f32[{n}]\n"
                      f"%o = aten.sqrt.default(%d) : f32[{n}]", f"%t: f32[{n}], %o: f32[{n}]")
    node = next(parse_graph(text).nodes)
    tanh, root = codegen.load_many([codegen.generate(node, registry)], registry)[0](x)
    assert (tanh.abs() <= x.abs()).sum() == n - 1  # all but NaN
    torch.testing.assert_close(tanh[-7:], torch.tanh(x[-7:]), rtol=0, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(tanh[:n - 7]), torch.signbit(x[:n - 7]))
    assert not torch.isnan(root[:len(small)]).any()  # x - tanh(x) >= 0 for x > 0
    below = x.abs() < 2 ** -8  # the series: correctly rounded (ties aside), as eager here
    rounded = torch.tanh(x.double()).float()
    assert (tanh[below] == rounded[below]).float().mean() > 0.999
    assert (tanh[below] == torch.tanh(x[below])).float().mean() > 0.999


def test_tanh_within_its_bound_over_a_dense_sweep_of_floats(registry, codegen):
    """tl_tanh (prelude.py) over every 97th float from 0 to 9 (past the clamp, 8 at most,
    where the result is 1) and their negatives: within BOUND["tanh"] ulp of tanh in
    double, odd (x's sign, -0.0 included), never above |x| nor 1, and the edge values as
    eager gives them."""
    bits = torch.arange(0, 0x41100000, 97, dtype=torch.int64).to(torch.int32)
    pos = bits.view(torch.float32)
    x = torch.cat([pos, -pos, torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0,
                                            1e-45, 3e38])])
    n = len(x)
    text = group_text(f"%a: f32[{n}]", f"%o = aten.tanh.default(%a) : f32[{n}]",
                      f"%o: f32[{n}]")
    node = next(parse_graph(text).nodes)
    got = codegen.load_many([codegen.generate(node, registry)], registry)[0](x)[0]
    ref = torch.tanh(x.double())
    finite = torch.isfinite(x) & (ref.abs() > 1e-30)
    err = (got.double() - ref).abs()[finite] / _ulp(ref)[finite]
    assert err.max().item() <= BOUND["tanh"], err.max().item()
    assert torch.equal(torch.signbit(got[~x.isnan()]), torch.signbit(x[~x.isnan()]))
    assert (got.abs() <= x.abs()).sum() == n - 1 and (got.abs() <= 1).sum() == n - 1
    assert (got[x.abs() >= 8].abs() == 1).all()  # past the clamp: exactly 1, as eager
    torch.testing.assert_close(got[-6:], torch.tanh(x[-6:]), rtol=0, atol=0, equal_nan=True)
