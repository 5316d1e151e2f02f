"""What the cpu codegen starts before a graph's passes run (``anticipate``, codegen/base.py):
the compiler probe, then the attention libraries the imported graph's calls will want,
building on threads while the passes and the plan run: the forward's for any causal f32
attention, the backward's too for a training forward (its logsumexp an output of the graph),
started only once the forward's has ended. Build threads run at a lower priority
(deferred.BUILD_NICENESS) and the probe's compilers run at once (toolchain._probe).
These tests build their own libraries (a fresh cache: they test the builds)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from torchloom.passes.manager import PassManager

from torchloom_codegen_cpu import toolchain
from torchloom_codegen_cpu.codegen import CpuCodegen
from torchloom_codegen_cpu.deferred import BUILD_NICENESS, Building

from conftest import compiled


class Causal(torch.nn.Module):
    def __init__(self, H=4, D=32):
        super().__init__()
        self.H, self.D = H, D
        self.qkv = torch.nn.Linear(128, 3 * H * D)

    def forward(self, x):
        B, L, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in
                   self.qkv(torch.relu(x)).view(B, L, 3, self.H, self.D).unbind(2))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.tanh(o.transpose(1, 2).reshape(B, L, -1))


class Recorded:
    """What was building ahead each time a pass manager started, and when each attention
    library's build began and ended (``direction -> (start, end, thread)``)."""

    def __init__(self, monkeypatch, compiler):
        self.compiler = compiler
        self.at_passes: list[list[str]] = []
        self.builds: dict[str, tuple[float, float, str]] = {}
        run, build = PassManager.run, CpuCodegen._build

        def passes(manager, graph, ctx):
            cpu = self.compiler.plugins.codegens["cpu"].obj
            self.at_passes.append(cpu._attention.started_ahead())
            return run(manager, graph, ctx)

        def timed(codegen, source):
            if codegen is not self.compiler.plugins.codegens["cpu"].obj:
                return build(codegen, source)  # (a build an earlier test's thread runs)
            start = time.monotonic()
            try:
                return build(codegen, source)
            finally:
                for direction in ("FORWARD", "BACKWARD"):
                    if f"#define TL_ATTN_{direction} 1" in source:
                        self.builds[direction.lower()] = (
                            start, time.monotonic(), threading.current_thread().name)
        monkeypatch.setattr(PassManager, "run", passes)
        monkeypatch.setattr(CpuCodegen, "_build", timed)


@pytest.fixture
def cold(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "cold"))
    return tmp_path


def run_inference(model, monkeypatch, cold, length):
    """One inference call of ``model`` compiled cold (eager's values), and what was
    building ahead when."""
    model.eval()
    compiler, fn = compiled(model, cold)
    seen = Recorded(monkeypatch, compiler)
    x = torch.randn(2, length, 128)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)
    return seen


def test_inference_starts_the_forward_s_library_before_the_passes(monkeypatch, cold):
    torch.manual_seed(0)
    seen = run_inference(Causal(), monkeypatch, cold, 200)
    assert seen.at_passes == [["forward"]]  # building before the first pass ran
    assert list(seen.builds) == ["forward"]  # no backward for an inference graph
    assert seen.builds["forward"][2] == "torchloom-attention-forward"


def test_a_training_forward_starts_the_backward_s_library_after_the_forward_s(monkeypatch,
                                                                              cold):
    torch.manual_seed(0)
    model, eager = Causal(), Causal()
    eager.load_state_dict(model.state_dict())
    compiler, fn = compiled(model, cold)
    seen = Recorded(monkeypatch, compiler)
    x = torch.randn(2, 200, 128)
    got, want = fn(x), eager(x)
    got.square().mean().backward()
    want.square().mean().backward()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5)
    # the forward graph's passes: both started; the backward graph's: nothing new to start
    assert seen.at_passes == [["backward", "forward"], ["backward", "forward"]]
    assert seen.builds["forward"][1] <= seen.builds["backward"][0]  # one after the other
    assert seen.builds["backward"][2] == "torchloom-attention-backward"


def test_an_attention_the_library_does_not_take_starts_nothing(monkeypatch, cold):
    """Neither causal nor masked: eager's op runs it, so no library is started."""
    class Plain(Causal):
        def forward(self, x):
            B, L, _ = x.shape
            q, k, v = (t.transpose(1, 2) for t in
                       self.qkv(x).view(B, L, 3, self.H, self.D).unbind(2))
            return F.scaled_dot_product_attention(q, k, v).sum(-1)
    torch.manual_seed(0)
    seen = run_inference(Plain(), monkeypatch, cold, 64)
    assert seen.at_passes == [[]] and seen.builds == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness: Linux")
def test_a_build_thread_and_its_compiler_run_at_a_lower_priority():
    base = os.getpriority(os.PRIO_PROCESS, 0)
    seen = {}

    def build():
        seen["thread"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        out = subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"],
                             capture_output=True, text=True, check=True)
        seen["child"] = int(out.stdout)
        return None
    building = Building("niceness")
    building.start(build)
    building.wait()
    want = min(base + BUILD_NICENESS, 19)
    assert seen == {"thread": want, "child": want}
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # this thread's is untouched


def test_the_probe_gives_what_each_check_gives_alone(tmp_path):
    """The probe's checks run at once; each flag is there exactly where its check, run
    alone, says so."""
    cc = toolchain.find_compiler()
    if cc is None:
        pytest.skip("no C compiler")
    tc = toolchain._probe(cc, tmp_path / "a", 60)
    features = toolchain.cpu_features()
    d = tmp_path / "b"
    d.mkdir()
    assert tc.version == toolchain._version(cc, 60)
    assert ("-DTL_PYENTRY" in tc.flags) == toolchain._compiles(
        cc, d, 60, toolchain.ENTRY_HEAD + "PyObject* f(PyObject* o) { return o; }\n", (),
        ("-DTL_PYENTRY",), load=True)
    width, tables = (toolchain._width_flags(cc, d, 60, features),
                     toolchain._table_flags(cc, d, 60, features))
    assert tc.flags == (*toolchain.FLAGS,
                        *(("-DTL_LIBMVEC",) if tc.vector_math else ()),
                        *(("-fveclib=libmvec",) if tc.vector_math and "clang" in tc.version
                          else ()),
                        *(("-DTL_PYENTRY",) if "-DTL_PYENTRY" in tc.flags else ()),
                        *width, *tables,
                        *(toolchain._pre_flags(cc, d, 60) if "clang" not in tc.version
                          else ()))
    assert tc.libs == (("-lmvec", "-lm") if tc.vector_math else ("-lm",))


def test_a_compiler_that_does_not_run_is_named(tmp_path):
    with pytest.raises(toolchain.BuildError, match="no-such-cc --version failed"):
        toolchain._probe(str(tmp_path / "no-such-cc"), tmp_path, 60)
