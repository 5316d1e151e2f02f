"""Each kernel is written once per compile, and a warm start writes none (issue 17): the
cpu codegen's ``supports`` keeps the C function it wrote for ``prepare``/``generate`` of
the same group, and a later Compiler over the same cache directory loads every stored
kernel without asking ``supports`` (the codegen's ``available`` says the compiler is
there), from the one library the cold start built for the whole graph (named in each
kernel's stored metadata). Results match eager on both."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchloom.api import parse_graph
from torchloom.tools import Compiler

import torchloom_codegen_cpu.codegen as cpu_codegen

# two groups of different structure around a matmul: a softmax-like row reduction and a
# pointwise tail
GRAPH = """\
graph @g(%x: f32[64, 128], %w: f32[128], %y: f32[128, 128]) {
  %m = aten.mul.Tensor(%x, %w) : f32[64, 128]
  %t = aten.tanh.default(%m) : f32[64, 128]
  %e = aten.exp.default(%t) : f32[64, 128]
  %s = aten.sum.dim_IntList(%e) {dim = [-1], keepdim = true} : f32[64, 1]
  %d = aten.div.Tensor(%e, %s) : f32[64, 128]
  %mm = aten.mm.default(%d, %y) : f32[64, 128]
  %g = aten.gelu.default(%mm) : f32[64, 128]
  %a = aten.add.Tensor(%g, %x) : f32[64, 128]
  return %a, %d
}
"""


def eager(x, w, y):
    e = torch.exp(torch.tanh(x * w))
    d = e / e.sum(-1, keepdim=True)
    return torch.nn.functional.gelu(d @ y) + x, d


@pytest.fixture
def writes(monkeypatch):
    calls = []
    real = cpu_codegen.write_function

    def counted(group, registry):
        calls.append(group)
        return real(group, registry)
    monkeypatch.setattr(cpu_codegen, "write_function", counted)
    return calls


def run(compiled, x, w, y):
    return compiled.fn(x, w, y)


@pytest.mark.parametrize("graph_cache", [True, False])
def test_cold_writes_each_kernel_once_and_warm_writes_none(tmp_path, writes, graph_cache,
                                                           monkeypatch):
    torch.manual_seed(0)
    x, w, y = torch.randn(64, 128), torch.randn(128), torch.randn(128, 128)
    expected = eager(x, w, y)
    cold = Compiler("default", cache_dir=tmp_path, compile_cache=graph_cache,
                    strict=True).compile_graph(parse_graph(GRAPH))
    torch.testing.assert_close(run(cold, x, w, y), expected)
    kernels = [c for c in cold.compiled.choices if c.codegen == "cpu"]
    assert len(kernels) >= 2, [(c.codegen, c.fallback_reasons) for c in cold.compiled.choices]
    # every cpu group judged, batched into one library and compiled: written once each
    assert len(writes) == len(kernels), (len(writes), len(kernels))
    assert len({id(g) for g in writes}) == len(writes)
    writes.clear()
    built = []
    real_build = cpu_codegen.build
    # (a build in another directory is a thread an earlier test in this process left)
    monkeypatch.setattr(cpu_codegen, "build", lambda *a, **k: (
        Path(a[2]).is_relative_to(tmp_path) and built.append(a)) or real_build(*a, **k))
    warm = Compiler("default", cache_dir=tmp_path, compile_cache=graph_cache,
                    strict=True).compile_graph(parse_graph(GRAPH))
    # each kernel's stored metadata names the graph's library: no build, not even a lookup
    # by source (which would need the source of every group)
    assert built == []
    torch.testing.assert_close(run(warm, x, w, y), expected)
    assert [c.codegen for c in warm.compiled.choices] == [c.codegen for c in cold.compiled.choices]
    assert writes == []  # loaded from the cache directory: nothing judged or written
    assert warm.compiled.cache.disk_hits >= len(kernels)


def test_warm_start_without_a_compiler_declines_with_the_reason(tmp_path, writes,
                                                                 monkeypatch):
    torch.manual_seed(0)
    x, w, y = torch.randn(64, 128), torch.randn(128), torch.randn(128, 128)
    Compiler("default", cache_dir=tmp_path, strict=True).compile_graph(parse_graph(GRAPH))
    monkeypatch.setattr(cpu_codegen, "find_compiler", lambda: None)
    warm = Compiler("default", cache_dir=tmp_path, compile_cache=False,
                    strict=True).compile_graph(parse_graph(GRAPH))
    # a stored library is not loaded where ``available`` says the machine lacks a compiler:
    # the groups are judged again and run on eager, with the reason
    assert {c.codegen for c in warm.compiled.choices} == {"eager"}
    assert all("no C compiler" in str(r) for c in warm.compiled.choices
               for r in c.fallback_reasons if r.codegen == "cpu")
    torch.testing.assert_close(run(warm, x, w, y), eager(x, w, y))
