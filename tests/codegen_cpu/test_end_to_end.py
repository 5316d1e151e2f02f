"""The cpu codegen through torch.compile(backend="torchloom") and the default pipeline:
the example workloads (forward and backward) match eager and explain shows every group on
``cpu``; the kernel cache keeps the C source as text and a second compiler builds nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchloom.report.explain import explain, format_explain

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WORKLOADS = ["layer_norm", "softmax", "gelu_bookend", "bias_gelu", "lstm_cell", "mlp"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e-cache")


@pytest.mark.parametrize("name", WORKLOADS)
def test_example_runs_on_cpu_kernels_and_matches_eager(monkeypatch, cache_dir, name):
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(cache_dir))
    result = explain(EXAMPLES / f"{name}.py", pipeline="default")
    data = result.data
    assert data["max_abs_error"] is not None and data["max_abs_error"] <= 1e-4, data
    choices = [c for comp in result.compiler.compilations for c in comp.compiled.choices]
    assert choices and {c.codegen for c in choices} == {"cpu"}, [
        (c.codegen, [str(r) for r in c.fallback_reasons]) for c in choices]
    assert not data["fallbacks"]
    counts = [line.strip() for line in format_explain(result).splitlines()
              if "groups on codegens:" in line]
    assert counts and all(line.startswith("groups on codegens: cpu") and "eager" not in line
                          for line in counts), counts


def test_kernel_cache_keeps_c_source_and_libraries_are_reused(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path))
    explain(EXAMPLES / "layer_norm.py", pipeline="default")
    sources = list((tmp_path / "kernels").glob("*.src"))
    assert sources and all("#pragma omp simd" in p.read_text() for p in sources
                           if "torchloom cpu kernel" in p.read_text())
    libraries = sorted((tmp_path / "cpu").glob("*.so"))
    stamps = {p: p.stat().st_mtime_ns for p in libraries}
    assert libraries
    second = explain(EXAMPLES / "layer_norm.py", pipeline="default")
    assert second.data["max_abs_error"] <= 1e-4
    assert sorted((tmp_path / "cpu").glob("*.so")) == libraries
    assert {p: p.stat().st_mtime_ns for p in libraries} == stamps  # never rebuilt on a hit


def test_training_step_gradients_match_eager(monkeypatch, cache_dir):
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(cache_dir))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 128),
                                torch.nn.GELU(), torch.nn.Linear(128, 64))
    x = torch.randn(96, 64, requires_grad=True)
    compiled = torch.compile(model, backend="torchloom")
    torch._dynamo.reset()
    try:
        out = compiled(x)
        out.square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
        model.zero_grad()
        x.grad = None
        ref = model(x)
        ref.square().sum().backward()
        torch.testing.assert_close(out, ref)
        for got, want in zip(grads, [p.grad for p in model.parameters()] + [x.grad]):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    finally:
        torch._dynamo.reset()
