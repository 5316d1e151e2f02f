"""A training graph's backward compiled with its forward (``[runtime] backward = "ahead"``,
compiler/ahead.py) or at the first ``backward()`` ("lazy"): the same compilations, the
same gradients, and aot_autograd's lazy call handed only what it would compile."""

from __future__ import annotations

import pytest
import torch

from torchloom.compiler import Compiler
from torchloom.compiler.ahead import AheadBackward, backward_policy
from torchloom.errors import PipelineError

PIPELINE = """[pipeline]
name = "ahead"
codegen = "eager"
{runtime}
[[pass]]
name = "dce"
"""


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch):
    monkeypatch.delenv("TORCHLOOM_BACKWARD", raising=False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiler_for(tmp_path, runtime: str = "") -> Compiler:
    path = tmp_path / "p.toml"
    path.write_text(PIPELINE.format(runtime=runtime))
    return Compiler(str(path), cache_dir=tmp_path / "cache", compile_cache=False)


def mlp(seed: int = 0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.GELU(),
                               torch.nn.Linear(48, 24), torch.nn.Tanh())


def eager_grads(x, loss_of, seed: int = 0) -> list[torch.Tensor]:
    model = mlp(seed)
    loss_of(model(x)).backward()
    return [p.grad for p in model.parameters()]


def names(compiler: Compiler) -> list[str]:
    return [c.name for c in compiler.compilations]


@pytest.mark.parametrize("shape", [(8, 24), (1, 24), (3, 5, 24)])
def test_the_backward_compiles_with_the_forward(tmp_path, shape):
    compiler = compiler_for(tmp_path)
    model = mlp()
    f = torch.compile(model, backend="torchloom", options={"compiler": compiler})
    x = torch.randn(*shape)
    out = f(x)
    assert names(compiler) == ["graph0", "graph1"]  # before any backward
    assert all(c.fallback_reason is None for c in compiler.compilations)
    (out * out).sum().backward()
    assert names(compiler) == ["graph0", "graph1"]  # the lazy call took it
    for got, want in zip((p.grad for p in model.parameters()),
                         eager_grads(x, lambda y: (y * y).sum())):
        torch.testing.assert_close(got, want)


def test_lazy_compiles_the_backward_at_the_first_backward(tmp_path):
    compiler = compiler_for(tmp_path, '[runtime]\nbackward = "lazy"')
    assert compiler.backward == "lazy"
    f = torch.compile(mlp(), backend="torchloom", options={"compiler": compiler})
    out = f(torch.randn(8, 24))
    assert names(compiler) == ["graph0"]
    out.sum().backward()
    assert names(compiler) == ["graph0", "graph1"]


def test_inference_keeps_no_backward(tmp_path):
    compiler = compiler_for(tmp_path)
    f = torch.compile(mlp(), backend="torchloom", options={"compiler": compiler})
    with torch.no_grad():
        f(torch.randn(8, 24))
    assert names(compiler) == ["graph0"]


def test_a_first_backward_retaining_the_graph_compiles_without_donated_buffers(tmp_path):
    """Ahead, the backward is compiled with aot_autograd's donated saved activations; a
    first ``backward(retain_graph=True)`` donates none, so the lazy call compiles again
    (as it would have), and a second backward over the same graph still sees the saved
    activations whole."""
    compiler = compiler_for(tmp_path)
    model = mlp()
    f = torch.compile(model, backend="torchloom", options={"compiler": compiler})
    x = torch.randn(8, 24)
    loss = (f(x) ** 2).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    assert names(compiler) == ["graph0", "graph1", "graph2"]
    for got, want in zip((p.grad for p in model.parameters()),
                         eager_grads(x, lambda y: (y ** 2).sum())):
        torch.testing.assert_close(got, 2 * want)


def test_dynamic_shapes_compile_the_backward_once(tmp_path):
    """With symbolic sizes aot_autograd compiles the backward right after the forward
    itself: the one compiled ahead is what it gets, not a second compilation."""
    compiler = compiler_for(tmp_path)
    model = mlp()
    f = torch.compile(model, backend="torchloom", options={"compiler": compiler},
                      dynamic=True)
    for rows in (5, 9):
        x = torch.randn(rows, 24)
        model.zero_grad()
        f(x).sum().backward()
        for got, want in zip((p.grad for p in model.parameters()),
                             eager_grads(x, lambda y: y.sum())):
            torch.testing.assert_close(got, want)
    assert names(compiler) == ["graph0", "graph1"]


def test_the_backward_compiles_outside_the_tracers_fake_tensor_mode(tmp_path, monkeypatch):
    """The forward's compiler is called under aot_autograd's fake tensor mode; the
    backward compiled then must not be (the lazy call never is: constants are real)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    modes: list[int] = []
    real = Compiler.compile_fx

    def compile_fx(self, gm, inputs, **kwargs):
        modes.append(len(_get_current_dispatch_mode_stack()))
        return real(self, gm, inputs, **kwargs)
    monkeypatch.setattr(Compiler, "compile_fx", compile_fx)
    compiler = compiler_for(tmp_path)
    torch.compile(mlp(), backend="torchloom", options={"compiler": compiler})(
        torch.randn(4, 24))
    assert len(modes) == 2 and modes[0] >= 1 and modes[1] == 0


def test_a_backward_that_fails_ahead_compiles_at_the_first_backward(tmp_path, monkeypatch,
                                                                   caplog):
    """Whatever fails while compiling ahead (here the module's copy) costs the forward
    nothing: the lazy call compiles the backward as before."""
    import torchloom.compiler.ahead as ahead_module

    def broken(module):
        raise RuntimeError("cannot copy")
    monkeypatch.setattr(ahead_module, "deepcopy", broken)
    compiler = compiler_for(tmp_path)
    model = mlp()
    f = torch.compile(model, backend="torchloom", options={"compiler": compiler})
    x = torch.randn(6, 24)
    with caplog.at_level("INFO", logger="torchloom"):
        out = f(x)
    assert names(compiler) == ["graph0"]
    assert "not compiled ahead (RuntimeError: cannot copy)" in caplog.text
    monkeypatch.undo()
    out.sum().backward()
    assert names(compiler) == ["graph0", "graph1"]
    for got, want in zip((p.grad for p in model.parameters()),
                         eager_grads(x, lambda y: y.sum())):
        torch.testing.assert_close(got, want)


def test_take_hands_back_only_the_module_it_compiled():
    made = []
    ahead = AheadBackward(lambda gm, inputs, donated: made.append(donated) or (lambda a: a),
                          lambda inputs: [1])
    joint = torch.fx.symbolic_trace(lambda x, y: x + y)
    other = torch.fx.symbolic_trace(lambda x, y: x * y)
    ahead.partitioner(lambda j, i, **k: (j, joint))(None, None)
    ahead.compile()
    assert made == [(1,)]
    assert ahead.take(other, [1]) is None  # another graph: compiled anew
    assert ahead.take(joint, [1]) is None  # (taken or refused once: gone)
    ahead.partitioner(lambda j, i, **k: (j, joint))(None, None)
    ahead.compile()
    assert ahead.take(joint, []) is None  # other donated inputs
    ahead.partitioner(lambda j, i, **k: (j, joint))(None, None)
    ahead.compile()
    assert ahead.take(joint, (1,)) is not None
    ahead.compile()  # nothing kept: nothing compiled
    assert len(made) == 3


def test_the_policy_is_checked(tmp_path, monkeypatch):
    with pytest.raises(PipelineError, match=r"p\.toml:\d+: backward = 'soon' must be one "
                                            r"of ahead, lazy"):
        compiler_for(tmp_path, '[runtime]\nbackward = "soon"')
    monkeypatch.setenv("TORCHLOOM_BACKWARD", "lazy")
    assert compiler_for(tmp_path).backward == "lazy"
    assert backward_policy("ahead") == "lazy"
    monkeypatch.setenv("TORCHLOOM_BACKWARD", "later")
    with pytest.raises(ValueError, match="TORCHLOOM_BACKWARD is 'later'"):
        backward_policy(None)
    monkeypatch.delenv("TORCHLOOM_BACKWARD")
    assert backward_policy(None) == "ahead"


def test_compiling_collects_only_young_objects_and_leaves_the_heap_as_it_was(tmp_path,
                                                                            monkeypatch):
    """The backend freezes the heap it found while it compiles (the collector then
    traverses only what the compile made) and unfreezes it after, an error included; a
    program that froze objects itself, or turned the collector off, keeps its own."""
    import gc

    from torchloom.backend import young_collections
    seen: list[int] = []
    real = Compiler.compile_fx

    def compile_fx(self, gm, inputs, **kwargs):
        seen.append(gc.get_freeze_count())
        return real(self, gm, inputs, **kwargs)
    monkeypatch.setattr(Compiler, "compile_fx", compile_fx)
    compiler = compiler_for(tmp_path, '[runtime]\nbackward = "lazy"')
    f = torch.compile(mlp(), backend="torchloom", options={"compiler": compiler})
    assert gc.get_freeze_count() == 0
    f(torch.randn(4, 24)).sum().backward()  # the forward's compile, then the lazy backward's
    assert len(seen) == 2 and all(n > 0 for n in seen) and gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), young_collections():
        assert gc.get_freeze_count() > 0
        raise RuntimeError
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        # (a frozen object another thread drops meanwhile leaves the count: it may only
        # fall by the few such objects, never to 0 nor up by a new freeze)
        mine = gc.get_freeze_count()
        with young_collections():
            assert mine - 100 < gc.get_freeze_count() <= mine
        assert mine - 100 < gc.get_freeze_count() <= mine
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        with young_collections():
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()
