"""The ``cudagraphs`` runtime wrapper on CPU: enabling it where it cannot apply skips with a
plain reason (noted and logged once) and results still equal eager; its options are
checked by the pipeline reader."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torchloom import errors
from torchloom.api import PassContext, parse_graph
from torchloom.tools import Compiler, load_plugins
from torchloom_cudagraphs import CudaGraphRunner, CudaGraphs, CudaGraphsOptions

PIPELINE = """[pipeline]
name = "cudagraphs-test"
codegen = "eager"

[runtime]
cudagraphs = true

[[pass]]
name = "dce"
"""


def _pipeline(tmp_path, text: str = PIPELINE):
    path = tmp_path / "pipeline.toml"
    path.write_text(text)
    return str(path)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_cpu_tensors_skip_with_the_reason_and_match_eager(tmp_path, caplog):
    model = _mlp()
    compiled = torch.compile(model, backend="torchloom",
                             options={"pipeline": _pipeline(tmp_path)})
    with caplog.at_level(logging.WARNING, logger="torchloom"), torch.no_grad():
        for step in range(3):
            x = torch.randn(2, 8)
            torch.testing.assert_close(compiled(x), model(x))
    skips = [r.getMessage() for r in caplog.records if "CUDA graphs" in r.getMessage()]
    assert len(skips) == 1  # one compiled graph, logged once however many calls
    assert "runs without CUDA graphs" in skips[0]
    assert "is on cpu; CUDA graphs record only CUDA work" in skips[0]


def test_training_on_cpu_skips_forward_and_backward_with_equal_gradients(tmp_path):
    model = _mlp()
    compiler = Compiler(_pipeline(tmp_path), cache_dir=tmp_path / "cache")
    compiled = torch.compile(model, backend="torchloom", options={"compiler": compiler})
    x = torch.randn(3, 8)
    compiled(x).pow(2).sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).pow(2).sum().backward()
    for g, want in zip(got, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(g, want)
    compiled_graphs = [c for c in compiler.compilations if c.fallback_reason is None]
    assert len(compiled_graphs) == 2  # forward and backward
    for comp in compiled_graphs:
        assert not isinstance(comp.fn, CudaGraphRunner)
        notes = [n for n in comp.notes if n.startswith("cudagraphs:")]
        assert len(notes) == 1
        assert notes[0].startswith(f"cudagraphs: @{comp.graph.name} runs without CUDA graphs: ")
        assert "is on cpu; CUDA graphs record only CUDA work" in notes[0]


def test_pipeline_options_reach_the_wrapper(tmp_path):
    text = PIPELINE.replace("[runtime]\ncudagraphs = true\n",
                            "[runtime.cudagraphs]\nreuse_outputs = true\nmax_records = 3\n"
                            "warmup = 2\n")
    compiler = Compiler(_pipeline(tmp_path, text), cache_dir=tmp_path / "cache")
    assert compiler.pipeline.runtime == {
        "cudagraphs": CudaGraphsOptions(reuse_outputs=True, max_records=3, warmup=2)}
    off = PIPELINE.replace("cudagraphs = true", "cudagraphs = { enabled = false }")
    assert Compiler(_pipeline(tmp_path, off), cache_dir=tmp_path / "c").pipeline.runtime == {}


@pytest.mark.parametrize("option, message", [
    ("max_records = 0", "max_records"),
    ("warmup = 0", "warmup"),
    ("reuse_outputs = 1", "reuse_outputs"),
    ("reuse_output = true", "did you mean"),
])
def test_bad_options_are_pipeline_errors_naming_the_line(tmp_path, option, message):
    text = PIPELINE.replace("[runtime]\ncudagraphs = true\n", f"[runtime.cudagraphs]\n{option}\n")
    with pytest.raises(errors.PipelineError) as info:
        Compiler(_pipeline(tmp_path, text), cache_dir=tmp_path / "cache")
    assert message in str(info.value)
    assert "pipeline.toml:" in str(info.value)


def _ctx():
    return PassContext(registry=load_plugins().registry)


class _Compiled:
    def __init__(self, graph):
        self.graph = graph


CUDA_GRAPH = """graph @g(%x: f32[4] @cuda:0) {
  %e = aten.exp.default(%x) : f32[4] @cuda:0
  return %e
}"""


def test_wrap_declines_without_cuda_and_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ctx = _ctx()

    def fn(x):
        return (x.exp(),)

    wrapped = CudaGraphs().wrap(fn, CudaGraphsOptions(), ctx, _Compiled(parse_graph(CUDA_GRAPH)))
    assert wrapped is fn
    assert ctx.notes == ["cudagraphs: @g runs without CUDA graphs: CUDA is not available on "
                         "this machine"]


def test_wrap_notes_every_failing_check():
    ctx = _ctx()
    graph = parse_graph("""graph @g(%x: f32[4]) {
  %w = aten.add_.Tensor(%x, %x) : f32[4]
  return %w
}""")
    fn = CudaGraphs().wrap(lambda x: (x,), CudaGraphsOptions(), ctx, _Compiled(graph))
    assert ctx.notes == ["cudagraphs: @g runs without CUDA graphs: graph input %x is on cpu; "
                         "CUDA graphs record only CUDA work; graph input %x is written in place "
                         "by aten.add_.Tensor (%w)"]
    assert not isinstance(fn, CudaGraphRunner)


def test_runner_called_with_cpu_tensors_runs_the_plain_path_and_logs_once(caplog):
    notes: list[str] = []
    runner = CudaGraphRunner(lambda x, w: (x @ w, x.sum()), name="g", note=notes.append)
    w = torch.randn(4, 3)
    with caplog.at_level(logging.WARNING, logger="torchloom.cudagraphs"):
        for _ in range(3):
            x = torch.randn(2, 4)
            out = runner(x, w)
            torch.testing.assert_close(out, (x @ w, x.sum()))
    assert (runner.records, runner.replays, runner.plain_calls) == (0, 0, 3)
    assert runner.reasons == ["@g was called with an argument that is not a CUDA tensor"]
    assert notes == ["cudagraphs: @g was called with an argument that is not a CUDA tensor"]
    assert len([r for r in caplog.records if r.name == "torchloom.cudagraphs"]) == 1


def test_explain_shows_the_skip_reason(tmp_path):
    from torchloom.report.explain import explain, format_explain
    workload = Path(__file__).resolve().parents[2] / "examples" / "mlp.py"
    result = explain(workload, pipeline=_pipeline(tmp_path))
    assert result.data["max_abs_error"] <= 1e-5
    skips = [n for n in result.data["notes"] if n.startswith("cudagraphs:")]
    assert len(skips) == 2  # the forward and the backward graph, each once
    assert all("runs without CUDA graphs: graph input" in n and "is on cpu" in n for n in skips)
    assert f"note: {skips[0]}" in format_explain(result)
