"""The compiler around the cpu codegen (toolchain.py, codegen.py): registration, no
compiler, a failing or hanging compiler, a damaged cached library, concurrent builds, and
the flags and CPU features in the library's cache key."""

from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path

import pytest
import torch
from torchloom.api import parse_graph
from torchloom.tools import EagerCodegen, load_plugins
from torchloom.report.explain import explain, format_explain
from torchloom.runtime.executor import CompiledGraph

from conftest import group_text
from cpu_children import build_and_load
from torchloom_codegen_cpu import CpuCodegen
from torchloom_codegen_cpu.toolchain import build, cached_library, library_path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TEXT = group_text("%a: f32[8, 16]", """
    %e = aten.exp.default(%a) : f32[8, 16]
    %s = aten.sum.dim_IntList(%e) {dim = [1], keepdim = true} : f32[8, 1]
    %y = aten.div.Tensor(%e, %s) : f32[8, 16]""", "%y: f32[8, 16]")


def _fake_cc(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fakecc"
    path.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo fakecc 1.0; exit 0; fi\n"
                    f"{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _run(codegen: CpuCodegen, registry):
    compiled = CompiledGraph(parse_graph(TEXT), registry, [codegen, EagerCodegen()])
    a = torch.randn(8, 16)
    (y,) = compiled(a)
    torch.testing.assert_close(y, torch.softmax(a, -1))
    return compiled.choices[0]


def test_registered_through_the_plugin_hook():
    plugins = load_plugins()
    entry = plugins.codegens["cpu"]
    assert isinstance(entry.obj, CpuCodegen)
    assert entry.distribution == "torchloom-codegen-cpu"
    assert [c.name for c in plugins.codegen_chain(["triton", "cpu"])] == ["triton", "cpu",
                                                                          "eager"]


def test_gpu_groups_are_declined(registry, codegen):
    text = TEXT.replace("f32[8, 16]", "f32[8, 16] @cuda:0").replace(
        "f32[8, 1]", "f32[8, 1] @cuda:0")
    reason = codegen.supports(next(parse_graph(text).nodes), registry)
    # declined through its capabilities (devices: cpu)
    assert reason is not None and reason.message == "renders no device cuda"


def test_no_compiler_runs_groups_on_eager(monkeypatch, registry, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    codegen = CpuCodegen(cache_dir=tmp_path)
    choice = _run(codegen, registry)
    assert choice.codegen == "eager"
    assert "no C compiler" in str(choice.fallback_reasons[0])


def test_explain_says_why_once_without_a_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path))
    result = explain(EXAMPLES / "layer_norm.py", pipeline="default")
    text = format_explain(result)
    groups = sum(len(c.compiled.choices) for c in result.compiler.compilations)
    assert groups >= 2 and text.count("no C compiler") == 1, text
    assert result.data["max_abs_error"] <= 1e-4


def test_compiler_error_keeps_the_source_and_runs_on_eager(registry, tmp_path, monkeypatch,
                                                          caplog):
    cc = _fake_cc(tmp_path, 'echo "fakecc: internal compiler error" >&2; exit 1')
    monkeypatch.setenv("CC", str(cc))
    codegen = CpuCodegen(cache_dir=tmp_path)
    choice = _run(codegen, registry)
    assert choice.codegen == "eager"
    message = str(choice.fallback_reasons[0])
    assert "internal error" in message and "internal compiler error" in message
    kept = message.split("source kept at ")[1].split(":")[0]
    assert Path(kept).exists() and "void fused_" in Path(kept).read_text()


@pytest.mark.slow
def test_a_hanging_compiler_is_stopped(registry, tmp_path, monkeypatch):
    cc = _fake_cc(tmp_path, "sleep 60")
    monkeypatch.setenv("CC", str(cc))
    codegen = CpuCodegen(cache_dir=tmp_path, timeout=1.0)
    choice = _run(codegen, registry)
    assert choice.codegen == "eager"
    assert "did not finish within 1 s" in str(choice.fallback_reasons[0])


def test_a_damaged_library_is_rebuilt(registry, tmp_path, caplog):
    codegen = CpuCodegen(cache_dir=tmp_path)
    kernel = codegen.generate(next(parse_graph(TEXT).nodes), registry)
    source = codegen.translation_unit([kernel])  # what loading the kernel builds
    # built, not loaded: a library this process has mapped is never rewritten
    path = build(source, codegen.toolchain(), codegen.cache_dir, 60)
    assert path == library_path(codegen.cache_dir, source, codegen.toolchain())
    assert cached_library(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert not cached_library(path)
    fresh = CpuCodegen(cache_dir=tmp_path)
    assert _run(fresh, registry).codegen == "cpu"
    assert cached_library(path)
    assert "does not match its checksum" in caplog.text


def test_the_cache_key_covers_flags_and_cpu(registry, codegen):
    import attrs
    kernel = codegen.generate(next(parse_graph(TEXT).nodes), registry)
    tc = codegen.toolchain()
    other_cpu = attrs.evolve(tc, cpu=tc.cpu + ",imaginary_isa")
    other_flags = attrs.evolve(tc, flags=(*tc.flags, "-O1"))
    paths = {library_path(codegen.cache_dir, kernel.source, t) for t in (tc, other_cpu,
                                                                         other_flags)}
    assert len(paths) == 3
    assert "-march=native" in tc.flags and "-ffast-math" not in tc.flags


def test_concurrent_builds_of_one_library_are_safe(registry, tmp_path):
    codegen = CpuCodegen(cache_dir=tmp_path)
    source = codegen.generate(next(parse_graph(TEXT).nodes), registry).source
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        # a child that cannot start would leave map() waiting forever: bounded
        paths = pool.map_async(build_and_load, [(source, str(tmp_path))] * 3).get(timeout=300)
    assert len(set(paths)) == 1 and cached_library(Path(paths[0]))
    leftovers = [p for p in os.listdir(tmp_path / "cpu") if p.endswith(".tmp") or
                 p.startswith(".")]
    assert not leftovers


MLP_BLOCK = """
import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 32)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


def workload(device="cpu"):
    torch.manual_seed(0)
    return Block(), [torch.randn(48, 32, requires_grad=True)]
"""


def test_a_graphs_groups_are_one_library(monkeypatch, tmp_path):
    """The runtime hands the codegen every group of a graph first (prepare): an MLP block's
    training step (LayerNorm, Linear, GELU, Linear, residual: three groups per graph) builds
    one library per graph, one compiler call each."""
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path))
    workload = tmp_path / "block.py"
    workload.write_text(MLP_BLOCK)
    result = explain(workload, pipeline="default")
    comps = result.compiler.compilations
    groups = [len(c.compiled.choices) for c in comps]
    assert all(n >= 2 for n in groups) and result.data["max_abs_error"] <= 1e-4
    libraries = list((tmp_path / "cpu").glob("*.so"))
    assert len(libraries) == len(comps)
    for lib in libraries:
        assert lib.with_suffix(".c").read_text().count("\nvoid fused_") >= 2
