"""CudaGraphRunner: recording, replay, output safety, re-recording.

Every runner scenario runs twice: on a real GPU (``cuda``-marked, skipped without one) and
on CPU against a simulated CUDA graph (``sim``), where capturing records the traced
function and its arguments and a replay runs it again writing into the recorded output
tensors, just as a real replay overwrites its static outputs. The simulation checks the
runner's bookkeeping on every CI run; the GPU run checks it against real captures.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torchloom.api import parse_graph
from torchloom.tools import Compiler
from torchloom_cudagraphs import CudaGraphRunner
from torchloom_cudagraphs import recorder, wrapper
from torchloom_cudagraphs.checks import skip_reasons as recorder_skip_reasons
from torchloom_cudagraphs.recorder import has_internal_overlap, signature

PIPELINE = """[pipeline]
name = "cudagraphs-gpu-test"
codegen = "eager"

[runtime.cudagraphs]
OPTIONS

[[pass]]
name = "dce"
"""


def _compiler(tmp_path, options: str = "") -> Compiler:
    path = tmp_path / "pipeline.toml"
    path.write_text(PIPELINE.replace("OPTIONS", options))
    return Compiler(str(path), cache_dir=tmp_path / "cache")


def _runners(compiler: Compiler) -> list[CudaGraphRunner]:
    return [c.fn for c in compiler.compilations if isinstance(c.fn, CudaGraphRunner)]


class _SimGraph:
    """Stands in for torch.cuda.CUDAGraph: replay re-runs what was captured."""

    capturing: "_SimGraph | None" = None

    def __init__(self):
        self.calls: list = []

    def replay(self):
        for fn, args, outputs in self.calls:
            for old, new in zip(outputs, fn.fn(*args)):
                if isinstance(old, torch.Tensor):
                    old.copy_(new)


class Traced:
    """A test function; under a simulated capture it tells the graph what to replay."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        outputs = self.fn(*args)
        if _SimGraph.capturing is not None:
            _SimGraph.capturing.calls.append((self, args, outputs))
        return outputs


@contextlib.contextmanager
def _sim_capture(graph, stream=None):
    _SimGraph.capturing = graph
    try:
        yield
    finally:
        _SimGraph.capturing = None


class _SimStream:
    def wait_stream(self, other):
        pass


@pytest.fixture(params=["sim", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request, monkeypatch) -> str:
    if request.param == "cuda":
        return "cuda"
    monkeypatch.setattr(recorder, "all_cuda", lambda args: True)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _SimGraph)
    monkeypatch.setattr(torch.cuda, "graph", _sim_capture)
    monkeypatch.setattr(torch.cuda, "Stream", _SimStream)
    monkeypatch.setattr(torch.cuda, "current_stream", _SimStream)
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: None)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    # through torch.compile: CPU graphs pass the device check, the compiled function is traced
    monkeypatch.setattr(wrapper, "cuda_available", lambda: True)
    monkeypatch.setattr(wrapper, "skip_reasons", lambda graph, registry: [
        r for r in recorder_skip_reasons(graph, registry) if "record only CUDA work" not in r])
    monkeypatch.setattr(wrapper, "CudaGraphRunner",
                        lambda fn, **options: CudaGraphRunner(Traced(fn), **options))
    return "cpu"


@Traced
def _layer(x, w, b):
    return (torch.nn.functional.gelu(x @ w + b), x.sum(dim=1))


def test_signature_is_none_off_cuda():
    assert signature((torch.randn(2, 3),)) is None
    assert signature((1.0,)) is None


@pytest.mark.cuda
def test_signature_is_the_layout():
    x = torch.randn(2, 3, device="cuda")
    assert signature((x, x.t())) == ((torch.Size([2, 3]), (3, 1), torch.float32, 0),
                                     (torch.Size([3, 2]), (1, 3), torch.float32, 0))


def test_internal_overlap_means_an_expanded_tensor():
    base = torch.randn(4, 1)
    assert has_internal_overlap(base.expand(4, 5))
    assert not has_internal_overlap(base)
    assert not has_internal_overlap(torch.randn(4, 5).t())
    assert not has_internal_overlap(torch.randn(1, 5).expand(1, 5))


@pytest.fixture
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_replay_equals_eager_over_100_calls(device, tmp_path, _fresh_dynamo):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 16)).to(device)
    compiler = _compiler(tmp_path)
    compiled = torch.compile(model, backend="torchloom", options={"compiler": compiler})
    with torch.no_grad():
        for _ in range(100):
            x = torch.randn(4, 32, device=device)
            torch.testing.assert_close(compiled(x), model(x))
    (runner,) = _runners(compiler)
    assert (runner.records, runner.replays, runner.plain_calls) == (1, 99, 1)
    ((copied, static),) = runner.recorded
    assert (len(copied), len(static)) == (1, 4)  # x is copied in; weights and biases are not


def test_training_steps_match_eager_gradients(device, tmp_path, _fresh_dynamo):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 1)).to(device)
    reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 1)).to(device)
    reference.load_state_dict(model.state_dict())
    compiler = _compiler(tmp_path)
    compiled = torch.compile(model, backend="torchloom", options={"compiler": compiler})
    for _ in range(6):
        x = torch.randn(8, 16, device=device)
        compiled(x).square().mean().backward()
        reference(x).square().mean().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad = q.grad = None
    runners = _runners(compiler)
    notes = [c.notes for c in compiler.compilations]
    assert len(runners) == 2, notes  # forward and backward
    assert [(r.records, r.replays) for r in runners] == [(1, 5), (1, 5)], notes


def test_a_held_output_is_unchanged_by_the_next_call(device):
    w = torch.randn(8, 8, device=device)
    b = torch.randn(8, device=device)
    runner = CudaGraphRunner(_layer)
    for _ in range(3):  # warm-up, record, replay
        runner(torch.randn(4, 8, device=device), w, b)
    x1, x2 = torch.randn(4, 8, device=device), torch.randn(4, 8, device=device)
    first = runner(x1, w, b)
    snapshot = [t.clone() for t in first]
    second = runner(x2, w, b)
    assert runner.replays == 4
    torch.testing.assert_close(list(first), snapshot)
    torch.testing.assert_close(list(first), list(_layer(x1, w, b)))
    torch.testing.assert_close(list(second), list(_layer(x2, w, b)))
    assert first[0].data_ptr() != second[0].data_ptr()


def test_reuse_outputs_trades_safety_for_a_copy(device):
    w = torch.randn(8, 8, device=device)
    b = torch.randn(8, device=device)
    runner = CudaGraphRunner(_layer, reuse_outputs=True)
    runner(torch.randn(4, 8, device=device), w, b)
    x1, x2 = torch.randn(4, 8, device=device), torch.randn(4, 8, device=device)
    first = runner(x1, w, b)
    second = runner(x2, w, b)
    assert runner.replays == 2
    # the documented trade: the second replay overwrote what the first call returned
    assert first[0] is second[0]
    torch.testing.assert_close(first[0], _layer(x2, w, b)[0])


def test_input_mutation_skips_and_still_writes_the_input(device, tmp_path):
    compiler = _compiler(tmp_path)
    graph = parse_graph("""graph @mutates(%x: f32[4] @cuda:0, %y: f32[4] @cuda:0) {
  %w = aten.add_.Tensor(%x, %y) : f32[4] @cuda:0
  %e = aten.exp.default(%w) : f32[4] @cuda:0
  return %e
}""")
    comp = compiler.compile_graph(graph)
    assert not isinstance(comp.fn, CudaGraphRunner)
    assert ("cudagraphs: @mutates runs without CUDA graphs: graph input %x is written in "
            "place by aten.add_.Tensor (%w)") in comp.notes
    for _ in range(3):
        x, y = torch.randn(4, device=device), torch.randn(4, device=device)
        want_x = x + y
        (e,) = comp.fn(x, y)
        torch.testing.assert_close(x, want_x)
        torch.testing.assert_close(e, want_x.exp())


def test_input_mutation_through_torch_compile_matches_eager(device, tmp_path, _fresh_dynamo):
    def step(state, delta):
        state.add_(delta)
        return state * 2

    compiled = torch.compile(step, backend="torchloom",
                             options={"compiler": _compiler(tmp_path)})
    state, ref = torch.zeros(5, device=device), torch.zeros(5, device=device)
    for _ in range(5):
        delta = torch.randn(5, device=device)
        torch.testing.assert_close(compiled(state, delta), step(ref, delta))
        torch.testing.assert_close(state, ref)


def test_a_new_shape_records_again_up_to_max_records(device):
    w = torch.randn(8, 8, device=device)
    b = torch.randn(8, device=device)
    runner = CudaGraphRunner(_layer, max_records=2, name="layer")
    for rows in (4, 4, 4, 2, 2, 2, 4, 2, 7, 7, 7):
        x = torch.randn(rows, 8, device=device)
        torch.testing.assert_close(list(runner(x, w, b)), list(_layer(x, w, b)))
    assert runner.records == 2
    assert sorted(copied for copied, _ in runner.recorded) == [(0,), (0,)]
    assert runner.stopped is not None and "max_records = 2" in runner.stopped
    assert runner.reasons == [runner.stopped]  # logged once for the three 7-row calls
    # 4 rows: record + 2 replays; 2 rows: record + 2 replays; 7 rows: plain
    assert (runner.replays, runner.plain_calls) == (6, 5)


def test_a_static_input_that_moves_is_demoted_and_recorded_again(device):
    w1 = torch.randn(8, 8, device=device)
    w2 = torch.randn(8, 8, device=device)
    b = torch.randn(8, device=device)
    runner = CudaGraphRunner(_layer)
    for w in (w1, w1, w1, w2, w2, w2, w1):
        x = torch.randn(4, 8, device=device)
        torch.testing.assert_close(list(runner(x, w, b)), list(_layer(x, w, b)))
    assert runner.records == 2
    assert runner.recorded == [((0, 1), (2,))]  # w is now copied in; b stays in place


def test_a_static_input_updated_in_place_is_read_by_the_replay(device):
    w = torch.randn(8, 8, device=device)
    b = torch.zeros(8, device=device)
    runner = CudaGraphRunner(_layer)
    for step in range(5):
        b.fill_(float(step))  # like an optimizer step on a parameter
        x = torch.randn(4, 8, device=device)
        torch.testing.assert_close(list(runner(x, w, b)), list(_layer(x, w, b)))
    assert runner.records == 1 and runner.recorded == [((0,), (1, 2))]


def test_an_expanded_input_runs_the_plain_path_with_a_reason(device):
    w = torch.randn(8, 8, device=device)
    b = torch.randn(8, device=device)
    runner = CudaGraphRunner(_layer, name="layer")
    for _ in range(4):
        x = torch.randn(1, 8, device=device).expand(4, 8)
        torch.testing.assert_close(list(runner(x, w, b)), list(_layer(x, w, b)))
    assert runner.records == 0
    assert runner.reasons == ["@layer: argument 0 is an expanded tensor (shared elements), "
                              "which cannot be copied into a static buffer"]


def test_outputs_aliasing_arguments_come_back_as_the_callers_tensors(device):
    @Traced
    def saves_inputs(x, w):
        return (x @ w, x[1:].t(), w)

    w = torch.randn(3, 3, device=device)
    runner = CudaGraphRunner(saves_inputs, aliases={1: 0, 2: 1})
    for _ in range(4):
        x = torch.randn(4, 3, device=device)
        prod, view, same = runner(x, w)
        torch.testing.assert_close(prod, x @ w)
        assert same is w
        assert view.data_ptr() == x[1:].data_ptr() and view.stride() == x[1:].t().stride()
        torch.testing.assert_close(view, x[1:].t())
        x.add_(1.0)  # the view follows the caller's tensor, as in eager
        torch.testing.assert_close(view, x[1:].t())
    assert runner.records == 1 and runner.replays == 3


def test_outputs_sharing_memory_still_share_it_after_the_copy(device):
    @Traced
    def forward(x):
        t = torch.tanh(x)
        return (t, t.detach(), t.view(-1)[2:], x.sum())

    runner = CudaGraphRunner(forward)
    held = None
    for _ in range(4):
        x = torch.randn(3, 4, device=device)
        t, d, v, s = runner(x)
        torch.testing.assert_close(t, torch.tanh(x))
        torch.testing.assert_close(s, x.sum())
        assert d.data_ptr() == t.data_ptr() and v.data_ptr() == t.view(-1)[2:].data_ptr()
        torch.testing.assert_close(v, t.view(-1)[2:])
        if held is not None:  # the previous call's results were not overwritten
            torch.testing.assert_close(held[0], held[1])
        held = (t, torch.tanh(x).clone())
    assert runner.records == 1 and runner.replays == 3


def test_outputs_sharing_memory_no_output_holds_stop_recording(device):
    @Traced
    def views(x):
        e = torch.exp(x)
        return (e.view(-1)[1:], e.t())

    runner = CudaGraphRunner(views, name="views")
    for _ in range(3):
        x = torch.randn(2, 3, device=device)
        a, b = runner(x)
        torch.testing.assert_close(a, torch.exp(x).view(-1)[1:])
        torch.testing.assert_close(b, torch.exp(x).t())
    assert runner.records == 0
    assert runner.stopped == ("@views: recording failed (Unrecordable: outputs [0, 1] share "
                              "memory that no one of them holds whole); running without CUDA "
                              "graphs")


def test_a_failed_capture_stops_recording_and_keeps_results_right(device):
    @Traced
    def syncs(x):
        if _SimGraph.capturing is not None:  # what a real capture says about .item()
            raise RuntimeError("operation not permitted when stream is capturing")
        return (x * float(x.sum().item()),)  # .item() cannot be captured

    runner = CudaGraphRunner(syncs, name="syncs")
    stream = torch.cuda.current_stream() if device == "cuda" else None
    for _ in range(4):
        x = torch.randn(4, device=device)
        torch.testing.assert_close(runner(x)[0], syncs(x)[0])
    assert runner.records == 0
    assert runner.stopped.startswith("@syncs: recording failed (")
    assert runner.reasons == [runner.stopped]
    if device == "cuda":
        assert torch.cuda.current_stream() == stream
