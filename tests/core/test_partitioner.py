"""The forward/backward split (backend.py): min-cut rematerialization by default,
aot_autograd's default partitioner on request (backend option or ``[runtime]
partitioner``); both give eager's results."""

from __future__ import annotations

import pytest
import torch

from torchloom.compiler import Compiler
from torchloom.errors import PipelineError
from torchloom.runtime.static import tensor_bytes

PIPELINE = """[pipeline]
name = "split"
codegen = "eager"
{runtime}
[[pass]]
name = "dce"
"""


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def layer_norm_gelu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(48), torch.nn.GELU())
    with torch.no_grad():
        model[0].weight.uniform_(0.5, 1.5)
        model[0].bias.uniform_(-0.5, 0.5)
    return model, torch.randn(16, 48)


def train_step(compiler: Compiler | None, **options):
    model, x = layer_norm_gelu()
    x.requires_grad_()
    fn = model if compiler is None else torch.compile(
        model, backend="torchloom", options={"compiler": compiler, **options})
    out = fn(x)
    out.sum().backward()
    return [out.detach(), x.grad, model[0].weight.grad, model[0].bias.grad]


def saved_bytes(compiler: Compiler) -> tuple[int, int]:
    """(tensors, bytes) the backward graph takes from the forward (all but the tangent)."""
    backward = compiler.compilations[1].graph
    saved = [v for v in backward.inputs if not v.name.startswith("tangents")]
    return len(saved), sum(tensor_bytes(v) for v in saved)


#: named in the file: kept although every group of these graphs runs on eager
MIN_CUT = '[runtime]\npartitioner = "min_cut"\n'


def compiler_with(tmp_path, runtime: str = "") -> Compiler:
    path = tmp_path / "split.toml"
    path.write_text(PIPELINE.format(runtime=runtime))
    return Compiler(str(path), cache_dir=tmp_path / "cache")


def test_min_cut_saves_less_for_backward_than_the_default_partitioner(tmp_path):
    want = train_step(None)
    min_cut = compiler_with(tmp_path, MIN_CUT)
    got = train_step(min_cut)
    torch._dynamo.reset()
    default = compiler_with(tmp_path, '[runtime]\npartitioner = "default"\n')
    got_default = train_step(default)
    for g, gd, w in zip(got, got_default, want):
        torch.testing.assert_close(g, w)
        torch.testing.assert_close(gd, w)
    n_min, b_min = saved_bytes(min_cut)
    n_default, b_default = saved_bytes(default)
    # the default saves the layer norm's output (16 x 48); min-cut recomputes it from x
    assert n_min < n_default and b_default - b_min >= 16 * 48 * 4
    assert min_cut.pipeline.partitioner == "min_cut" == compiler_with(tmp_path).pipeline.partitioner


def test_the_backend_option_overrides_the_pipeline(tmp_path):
    compiler = compiler_with(tmp_path, MIN_CUT)
    got = train_step(compiler, partitioner="default")
    for g, w in zip(got, train_step(None)):
        torch.testing.assert_close(g, w)
    n, _ = saved_bytes(compiler)
    torch._dynamo.reset()
    min_cut = compiler_with(tmp_path, MIN_CUT)
    train_step(min_cut)
    assert saved_bytes(min_cut)[0] < n


def test_an_unknown_partitioner_is_an_error_naming_the_line(tmp_path):
    with pytest.raises(PipelineError, match=r"split.toml:5: partitioner = 'greedy' must be "
                                            r"one of min_cut, default"):
        compiler_with(tmp_path, '[runtime]\npartitioner = "greedy"\n')
    compiler = compiler_with(tmp_path)
    f = torch.compile(lambda x: x + 1, backend="torchloom",
                      options={"compiler": compiler, "partitioner": "greedy"})
    with pytest.raises(Exception, match="partitioner 'greedy' must be one of min_cut, default"):
        f(torch.randn(2))


def test_graphs_only_eager_runs_get_the_default_partitioner(tmp_path):
    """No codegen but eager takes these groups: recomputing in the backward, or splitting
    layer norm before the split, would only add kernels to what eager runs. A partitioner
    the pipeline or the backend option names is kept."""
    implicit = compiler_with(tmp_path)
    for g, w in zip(train_step(implicit), train_step(None)):
        torch.testing.assert_close(g, w)
    forward = implicit.compilations[0].graph
    assert any(n.op == "aten.native_layer_norm.default" for n in forward.walk())
    torch._dynamo.reset()
    default = compiler_with(tmp_path, '[runtime]\npartitioner = "default"\n')
    train_step(default)
    assert saved_bytes(implicit) == saved_bytes(default)
    torch._dynamo.reset()
    named = compiler_with(tmp_path)
    train_step(named, partitioner="min_cut")
    assert saved_bytes(named)[0] < saved_bytes(default)[0]
