"""Two wrong results the recorded groups showed in the interpreter against eager:

- Triton makes a Python float constant that meets no tensor first a float32 (``tl.where(x
  == x, 0.1, 0.1)``, f64 ``full_like``; a number beside a tensor takes its type), so an
  f64 ``full_like(x, 0.1) * y`` was 3e-10 off: in an f64 computation a float that float32
  does not hold is an f64 constant made whole (``tl.full([], v, tl.float64)``) wherever
  it stands; one it holds (0.5) stays a plain number.
- ``pow(x, -0.5)`` is eager's rsqrt (CUDA and CPU alike: ``-0.0`` gives ``-inf`` and
  ``-inf`` NaN, where libdevice's pow gives ``inf`` and 0), ``pow(x, -2)`` its
  ``1 / (x * x)``.

Run in the Triton interpreter against eager; the kernels also built for sm_90 here."""

from __future__ import annotations

import pytest
import torch

from conftest import group_text, on_device

EDGES = [0.0, -0.0, 1.0, -1.0, 0.25, 4.0, 1e-30, 1e30, float("inf"), float("-inf"),
         float("nan"), 3.0]


def _values(dtype: torch.dtype, n: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(n, generator=g, dtype=torch.float64) * 7).to(dtype)
    x[:len(EDGES)] = torch.tensor(EDGES, dtype=torch.float64).to(dtype)
    return x


@pytest.mark.parametrize("body", [
    "%o = aten.mul.Tensor(%a) {other = 0.1} : f64[64]",
    "%o = aten.add.Tensor(%a) {other = 0.3333333333333333} : f64[64]",
    "%o = aten.mul.Tensor(%a) {other = 1e-300} : f64[64]",  # (0 as float32)
    "%o = aten.mul.Tensor(%a) {other = 1e+300} : f64[64]",  # (inf as float32)
    "%t = aten.full_like.default(%a) {fill_value = 0.1, pin_memory = false} : f64[64]\n"
    "%o = aten.addcmul.default(%a, %t, %a) : f64[64]",
    "%o = aten.clamp.default(%a) {max = 2.2, min = -0.1} : f64[64]",
    "%o = aten.mul.Tensor(%a) {other = 0.5} : f64[64]",
])
def test_f64_constants_are_whole(check, body):
    """Within an f64 ulp (eager's CPU addcmul fuses its multiply-add): a float32 constant
    was 3e-10 off."""
    result = body.split("\n")[-1].split(" = ")[0]
    check(group_text("%a: f64[64]", body, f"{result}: f64[64]"), _values(torch.float64),
          rtol=1e-15, atol=0)


def test_only_a_float32_does_not_hold_is_an_f64_constant(codegen, registry):
    from torchloom.api import parse_graph
    text = group_text("%a: f64[64]", "%t = aten.mul.Tensor(%a) {other = 0.1} : f64[64]\n"
                      "%o = aten.mul.Tensor(%t) {other = 0.5} : f64[64]", "%o: f64[64]")
    source = codegen.generate(next(parse_graph(text).nodes), registry).source
    assert "tl.full([], 0.1, tl.float64)" in source and "(0.5)" in source
    assert "tl.full([], 0.5" not in source
    single = group_text("%a: f32[64]", "%o = aten.mul.Tensor(%a) {other = 0.1} : f32[64]",
                        "%o: f32[64]")  # (an f32 computation takes the float32 it wants)
    assert "tl.float64" not in codegen.generate(next(parse_graph(single).nodes),
                                                registry).source


@pytest.mark.parametrize("exponent", [-0.5, -2, 0.5, -1, 2, 3])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_powers_eager_computes_its_own_way(check, dtype, exponent):
    torch_dtype = {"f32": torch.float32, "f64": torch.float64}[dtype]
    text = group_text(f"%a: {dtype}[64]", f"%o = aten.pow.Tensor_Scalar(%a) "
                      f"{{exponent = {exponent}}} : {dtype}[64]", f"%o: {dtype}[64]")
    x = _values(torch_dtype)
    got, _ = check(text, x, rtol=4e-7 if dtype == "f32" else 1e-15, atol=0)
    if exponent == -0.5:  # rsqrt's, not pow's, at -0.0 and -inf
        assert got[0][1] == float("-inf") and got[0][9].isnan()


@pytest.mark.parametrize("body", [
    "%o = aten.pow.Tensor_Scalar(%a) {exponent = -0.5} : f64[64]",
    "%o = aten.pow.Tensor_Scalar(%a) {exponent = -0.5} : f16[64]",
    "%o = aten.pow.Tensor_Scalar(%a) {exponent = -2} : f64[64]",
    "%o = aten.pow.Tensor_Scalar(%a) {exponent = 0.1} : f64[64]",
    "%o = aten.pow.Tensor_Scalar(%a) {exponent = 2.5} : f64[64]",
    "%o = aten.mul.Tensor(%a) {other = 0.1} : f64[64]",
    "%t = aten.full_like.default(%a) {fill_value = 0.1, pin_memory = false} : f64[64]\n"
    "%o = aten.addcmul.default(%a, %t, %a) : f64[64]",
])
def test_the_kernels_build_for_sm90(tmp_path, registry, body):
    """Built for an H100 ahead of time, here on the CPU, as ``explain --target sm_90``
    builds them (Triton's front end refuses some constants only when it builds)."""
    from torchloom.api import parse_graph
    from torchloom_codegen_triton import TritonCodegen
    dtype = body.rsplit(": ", 1)[1].split("[")[0]
    group = next(on_device(parse_graph(group_text(
        f"%a: {dtype}[64]", body, f"%o: {dtype}[64]")), "cuda").nodes)
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False, target="sm_90")
    usage = codegen.compile_for_target(codegen.generate(group, registry))
    assert usage["registers"] > 0 and usage["spills"] == 0


@pytest.mark.parametrize("exponent", [-1, -2])
def test_a_negative_power_of_an_integer_is_declined(tmp_path, codegen, registry, exponent):
    """Eager raises (``Integers to negative integer powers are not allowed``): a CPU group
    is declined with eager's error (``rejected_by_eager``), a CUDA group, which that check
    does not run, by the template; it computed ``1.0 / x`` before."""
    from torchloom.api import parse_graph
    from torchloom_codegen_triton import TritonCodegen
    text = group_text("%a: i64[64]", f"%o = aten.pow.Tensor_Scalar(%a) "
                      f"{{exponent = {exponent}}} : i64[64]", "%o: i64[64]")
    reason = codegen.supports(next(parse_graph(text).nodes), registry)
    assert reason is not None and "Integers to negative integer powers" in str(reason)
    on_gpu = TritonCodegen(cache_dir=tmp_path, autotune=False, target="sm_90")
    reason = on_gpu.supports(next(on_device(parse_graph(text), "cuda").nodes), registry)
    assert reason is not None and "integers to negative integer powers" in str(reason)
