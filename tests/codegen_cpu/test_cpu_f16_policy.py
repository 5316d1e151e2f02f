"""When f16 groups compile (codegen.py): with a compiler whose f16 conversions vectorize
(clang), or always with ``TORCHLOOM_CPU_F16=compile``; elsewhere (gcc) they run on eager
with a reason naming the compiler, since the bit-arithmetic conversions made every f16
group measured slower than eager; bf16, f32 and the rest are untouched."""

from __future__ import annotations

import pytest
import torch

from torchloom.api import parse_graph
from torchloom.tools import Compiler
from torchloom.backend import torchloom_backend
from torchloom.testing.reductions import group_text

import torchloom_codegen_cpu.codegen as cpu_codegen
from torchloom_codegen_cpu import CpuCodegen


def _group(dtype: str):
    text = group_text(f"%a: {dtype}[4, 32], %b: {dtype}[4, 32]", f"""
        %m = aten.mul.Tensor(%a, %b) : {dtype}[4, 32]
        %s = aten.add.Tensor(%m, %a) : {dtype}[4, 32]""", f"%s: {dtype}[4, 32]")
    return next(parse_graph(text).nodes)


def _mixed_group():
    """f32 in and out, an f16 value inside (a cast down and back up)."""
    text = group_text("%a: f32[4, 32]", """
        %h = prims.convert_element_type.default(%a) {dtype = #f16} : f16[4, 32]
        %f = prims.convert_element_type.default(%h) {dtype = #f32} : f32[4, 32]""",
        "%f: f32[4, 32]")
    return next(parse_graph(text).nodes)


@pytest.mark.parametrize("native", [False, True])
def test_auto_leaves_f16_to_eager_where_conversions_do_not_vectorize(
        monkeypatch, tmp_path, registry, native):
    monkeypatch.setattr(cpu_codegen, "native_f16", lambda cc: native)
    codegen = CpuCodegen(cache_dir=tmp_path, f16="auto")
    for group in (_group("f16"), _mixed_group()):
        reason = codegen.supports(group, registry)
        if native:
            assert reason is None, reason
        else:
            assert reason is not None and reason.codegen == "cpu"
            assert "f16 values run on eager" in reason.message
            assert "does not vectorize f16 conversions" in reason.message
            assert "TORCHLOOM_CPU_F16=compile" in reason.message
    for dtype in ("bf16", "f32", "f64"):
        assert codegen.supports(_group(dtype), registry) is None


def test_compile_and_eager_override_the_compiler(monkeypatch, tmp_path, registry):
    monkeypatch.setattr(cpu_codegen, "native_f16", lambda cc: False)
    assert CpuCodegen(cache_dir=tmp_path, f16="compile").supports(_group("f16"), registry) \
        is None
    monkeypatch.setattr(cpu_codegen, "native_f16", lambda cc: True)
    reason = CpuCodegen(cache_dir=tmp_path, f16="eager").supports(_group("f16"), registry)
    assert reason is not None and "TORCHLOOM_CPU_F16=eager" in reason.message


def test_the_environment_chooses_and_copies_keep_the_choice(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHLOOM_CPU_F16", "eager")
    codegen = CpuCodegen(cache_dir=tmp_path)
    assert codegen.f16 == "eager"
    assert codegen.with_artifacts(None).f16 == "eager"
    monkeypatch.setenv("TORCHLOOM_CPU_F16", "sometimes")
    with pytest.raises(ValueError, match="TORCHLOOM_CPU_F16.*'sometimes'.*auto, compile, eager"):
        CpuCodegen(cache_dir=tmp_path)


def test_the_machines_compiler_is_judged_by_the_file_it_resolves_to(tmp_path):
    gcc = tmp_path / "x86_64-linux-gnu-gcc-12"
    clang = tmp_path / "clang-17"
    for f in (gcc, clang):
        f.write_text("")
    cc = tmp_path / "cc"
    cc.symlink_to(clang)
    assert cpu_codegen.native_f16(str(cc)) and not cpu_codegen.native_f16(str(gcc))


@pytest.mark.parametrize("fn", [lambda x: torch.softmax(x, -1),
                                lambda x: torch.nn.functional.layer_norm(x * 2 + 1, (48,))],
                         ids=["softmax", "layer_norm"])
def test_f16_models_left_to_eager_match_it_bit_for_bit(monkeypatch, tmp_path, fn):
    """Through torch.compile: the groups run on eager with their composites whole, so the
    results are eager's own, and the reason is on every choice."""
    monkeypatch.setenv("TORCHLOOM_CPU_F16", "auto")
    monkeypatch.setattr(cpu_codegen, "native_f16", lambda cc: False)
    compiler = Compiler("default", cache_dir=tmp_path, compile_cache=False)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(fn, backend=lambda gm, ex: torchloom_backend(
            gm, ex, options={"compiler": compiler}))
        xs = [torch.randn(16, 48, dtype=torch.float16,
                          generator=torch.Generator().manual_seed(seed)) * 3 for seed in range(12)]
        got = [compiled(x) for x in xs]
    finally:
        torch._dynamo.reset()
    # (an inference graph keeps its norms whole before the split, so the groups left to
    # eager run the composite: eager's own bits; a pre-split decomposition had no
    # provenance and ran primitives, off by an f16 ulp on ~1 input in 5)
    assert all(torch.equal(g, fn(x)) for g, x in zip(got, xs))
    choices = [c for comp in compiler.compilations for c in comp.compiled.choices]
    assert choices and all(c.codegen == "eager" for c in choices)
    assert all(any("f16 values run on eager" in str(r) for r in c.fallback_reasons)
               for c in choices)
