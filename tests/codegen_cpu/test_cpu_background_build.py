"""The graph's library builds on a thread from ``prepare`` on (deferred.py): the plan is made
while the compiler runs; the first call waits for it (``first_calls = "wait"``) or runs the
groups op by op until it ends (``"eager"``: eager's values, the kernels' layouts); a library
that fails to build leaves each group to build alone, as before. These tests hold the
compiler back (the build waits for a gate) to see each state; they build their own
libraries (a fresh cache: they test the build)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from torchloom.api import parse_graph, verify
from torchloom.tools import EagerCodegen
from torchloom.runtime.cache import KernelCache
from torchloom.runtime.executor import CompiledGraph

import torchloom_codegen_cpu.codegen as cpu_codegen
from torchloom_codegen_cpu import CpuCodegen
from torchloom_codegen_cpu.deferred import Deferred

TEXT = """\
graph @g(%x: f32[64, 96], %y: f32[96, 64]) {
  %a = torchloom.fusion_group(%x) : f32[64, 96] region @g_a(%x0: f32[64, 96]) {
    %e = aten.exp.default(%x0) : f32[64, 96]
    %m = aten.mul.Tensor(%e) {other = 0.5} : f32[64, 96]
    return %m
  }
  %s = torchloom.fusion_group(%a) : f32[64, 1] region @g_s(%a0: f32[64, 96]) {
    %r = aten.sum.dim_IntList(%a0) {dim = [1], keepdim = true} : f32[64, 1]
    return %r
  }
  %t = torchloom.fusion_group(%y) : f32[96, 64] region @g_t(%y0: f32[96, 64]) {
    %h = aten.tanh.default(%y0) : f32[96, 64]
    %n = aten.neg.default(%h) : f32[96, 64]
    return %n
  }
  return %a, %s, %t
}
"""


def reference(x, y):
    a = x.exp() * 0.5
    return a, a.sum(1, keepdim=True), -y.tanh()


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(64, 96, generator=g), torch.randn(96, 64, generator=g)


class Held:
    """The codegen's ``build`` held back until ``gate`` is set for libraries built in
    ``directory`` (the test's cache); ``fail`` raises instead for the first build (the graph's
    library). A build elsewhere (a thread an earlier test in this process left building)
    runs as it would, uncounted."""

    def __init__(self, monkeypatch, directory: Path, fail: bool = False):
        self.real, self.directory = cpu_codegen.build, directory
        self.gate, self.started = threading.Event(), threading.Event()
        self.fail, self.builds = fail, 0
        monkeypatch.setattr(cpu_codegen, "build", self)

    def __call__(self, source, toolchain, directory, *args, **kwargs):
        if not Path(directory).is_relative_to(self.directory):
            return self.real(source, toolchain, directory, *args, **kwargs)
        self.builds += 1
        self.started.set()
        assert self.gate.wait(120)
        if self.fail and self.builds == 1:
            raise RuntimeError("cc: internal compiler error (held)")
        return self.real(source, toolchain, directory, *args, **kwargs)


def compiled(registry, tmp_path, first_calls):
    graph = parse_graph(TEXT)
    verify(graph, registry)
    return CompiledGraph(graph, registry, [CpuCodegen(cache_dir=tmp_path), EagerCodegen()],
                         KernelCache(), first_calls=first_calls)


def check(got, x, y):
    want = reference(x, y)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.contiguous().stride()
        torch.testing.assert_close(g, w)


def settle(c, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not all(t.native.ready() for t in c.tiered):
        assert time.monotonic() < deadline, "the library never finished building"
        time.sleep(0.01)


def test_the_plan_is_made_while_the_library_builds(registry, tmp_path, monkeypatch, inputs):
    held = Held(monkeypatch, tmp_path)
    c = compiled(registry, tmp_path, "eager")
    assert held.started.wait(60)  # made while the compiler is held back
    assert len(c.tiered) == 3 and all(isinstance(t.native, Deferred) for t in c.tiered)
    assert not any(t.native.ready() for t in c.tiered)
    x, y = inputs
    for _ in range(2):  # op by op: eager's values, the kernels' layouts
        check(c(x, y), x, y)
    assert not any(t.native_now for t in c.tiered)
    held.gate.set()
    settle(c)
    check(c(x, y), x, y)
    assert all(t.native_now for t in c.tiered)
    assert [ch.codegen for ch in c.choices] == ["cpu"] * 3
    assert held.builds == 1  # one library for the graph


def test_the_first_call_waits_for_the_library(registry, tmp_path, monkeypatch, inputs):
    held = Held(monkeypatch, tmp_path)
    c = compiled(registry, tmp_path, "wait")
    x, y = inputs
    got = []
    call = threading.Thread(target=lambda: got.append(c(x, y)))
    call.start()
    call.join(0.5)
    assert call.is_alive() and not got  # waiting for the compiler
    held.gate.set()
    call.join(120)
    check(got[0], x, y)
    assert all(t.native_now for t in c.tiered)


@pytest.mark.parametrize("first_calls", ["wait", "eager"])
def test_a_library_that_fails_leaves_each_group_to_build_alone(registry, tmp_path,
                                                               monkeypatch, inputs, caplog,
                                                               first_calls):
    held = Held(monkeypatch, tmp_path, fail=True)
    held.gate.set()
    with caplog.at_level(logging.WARNING, logger="torchloom.codegen_cpu"):
        c = compiled(registry, tmp_path, first_calls)
        x, y = inputs
        settle(c)
        for _ in range(2):
            check(c(x, y), x, y)
    assert all(t.native_now for t in c.tiered)  # each built alone
    assert [ch.codegen for ch in c.choices] == ["cpu"] * 3
    told = [r.getMessage() for r in caplog.records if "did not build" in r.getMessage()]
    assert len(told) == 1 and "internal compiler error (held)" in told[0]
    assert held.builds == 4  # the graph's (failed), then one per group


def test_training_steps_while_the_libraries_build_match_eager(tmp_path, monkeypatch):
    """Under torch.compile, a training step whose forward and backward libraries are both
    still building (held) runs their groups op by op; the steps after the builds run the
    kernels; every step's loss and gradients are eager's (within rounding)."""
    from torchloom.backend import torchloom_backend
    from torchloom.tools import Compiler
    held = Held(monkeypatch, tmp_path)
    monkeypatch.setenv("TORCHLOOM_FIRST_CALLS", "eager")
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path))
    compiler = Compiler("default", cache_dir=tmp_path, compile_cache=False)

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128),
                                   torch.nn.GELU(), torch.nn.Linear(128, 64))
    eager, model = make(), make()
    fn = torch.compile(model, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(32, 64, generator=g) for _ in range(3)]
    for step, x in enumerate(batches):
        if step == 1:  # the first step ran op by op, its libraries held back
            assert len(compiler.compilations) == 2  # forward and backward, each building
            assert all(c.compiled.tiered for c in compiler.compilations)
            assert not any(t.native_now for c in compiler.compilations
                           for t in c.compiled.tiered)
            held.gate.set()
            for c in compiler.compilations:
                settle(c.compiled)
        want = (eager(x).tanh() ** 2).sum()
        got = (fn(x).tanh() ** 2).sum()
        want.backward()
        got.backward()
        torch.testing.assert_close(got, want)
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad, q.grad = None, None
    assert all(t.native_now for c in compiler.compilations for t in c.compiled.tiered)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_process_forked_while_the_library_builds_builds_it_itself(registry, tmp_path,
                                                                    monkeypatch, inputs):
    """A child forked while the library builds (a data loader's worker) has no thread
    building it: its first call builds the library itself instead of waiting forever."""
    held = Held(monkeypatch, tmp_path)
    c = compiled(registry, tmp_path, "wait")
    assert held.started.wait(60)
    x, y = inputs
    pid = os.fork()
    if pid == 0:  # the child
        code = 3
        try:
            torch.set_num_threads(1)
            held.gate.set()  # (the child's own gate: its build is not held)
            got, want = c(x, y), reference(x, y)
            code = 0 if all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want)) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child waited for a build no thread of it runs")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    held.gate.set()
    check(c(x, y), x, y)
