"""Training steps (forward and backward) through torch.compile on the Triton interpreter
against eager: the kernel forms of issue 15 end to end -- the row + column backward of
RMSNorm, and rows longer than a program holds (looped: online softmax, Welford) with
their backward."""

from __future__ import annotations

import pytest
import torch
from torchloom.tools import Compiler


def step(model, x, compiler=None):
    fn = model if compiler is None else torch.compile(
        model, backend="torchloom", options={"compiler": compiler})
    x = x.detach().clone().requires_grad_()
    out = fn(x)
    (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    grads = [x.grad] + [p.grad.clone() for p in getattr(model, "parameters", lambda: [])()]
    if hasattr(model, "zero_grad"):
        model.zero_grad()
    return [out.detach(), *grads]


@pytest.mark.slow
@pytest.mark.parametrize("name,make,shape", [
    ("rms_norm", lambda n: torch.nn.RMSNorm(n), (29, 40)),
    ("softmax_long_rows", lambda n: torch.nn.Softmax(dim=-1), (3, 5000)),
    ("layer_norm_long_rows", lambda n: torch.nn.LayerNorm(n), (3, 5000))])
def test_training_step_matches_eager(tmp_path, monkeypatch, name, make, shape):
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = make(shape[-1])
    for p in model.parameters():
        torch.nn.init.uniform_(p, 0.5, 1.5)
    x = torch.randn(*shape) * 3
    want = step(model, x)
    compiler = Compiler("default", cache_dir=tmp_path)
    torch._dynamo.reset()
    try:
        got = step(model, x, compiler)
    finally:
        torch._dynamo.reset()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-5)
    choices = [c.codegen for comp in compiler.compilations for c in comp.compiled.choices]
    assert choices and set(choices) == {"triton"}, choices
