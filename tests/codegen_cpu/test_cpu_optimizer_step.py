"""A compiled optimizer step (``torch.compile(optimizer.step)``, PyTorch's compiled-optimizer
recipe) on the cpu codegen: the ``foreach`` ops decomposed per tensor, each parameter's whole
update one fused kernel (its step count's scalar arithmetic inside), the kernel writing the
parameter and its states in place of aot_autograd's ``copy_`` of the mutated inputs, and
values as eager's step gives (within an ulp or two: eager's CPU kernels contract
``a + b * c`` into FMAs where torchloom's C does, and differently)."""

from __future__ import annotations

import pytest
import torch

from conftest import codegens, compiled

#: (optimizer class, its options)
OPTIMIZERS = {
    "adamw": (torch.optim.AdamW, {"lr": 1e-2}),
    "adam_decay": (torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.1}),
    "adam_amsgrad": (torch.optim.Adam, {"lr": 1e-2, "amsgrad": True}),
    "sgd_nesterov": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True,
                                       "weight_decay": 0.01}),
    "rmsprop": (torch.optim.RMSprop, {"lr": 1e-2}),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.1}),
}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    # parameters of several shapes, one of them over the plan's buffer-reuse size
    return torch.nn.Sequential(torch.nn.Linear(300, 256), torch.nn.LayerNorm(256),
                               torch.nn.Linear(256, 7), torch.nn.Conv1d(7, 3, 5))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_optimizer_step(name, tmp_path):
    """Against the same compiled program run op by op (``aot_eager``: the step count a
    tensor, the bias corrections in f32): as close to that program run in f64 as it is
    (largest error per tensor within twice that program's: eager's CPU kernels use FMAs
    where torchloom's C does, and elsewhere, and steps compound the ulps); and against
    eager's step (bias corrections in Python floats) within what ``aot_eager`` differs."""
    cls, options = OPTIMIZERS[name]
    models = [_model() for _ in range(3)] + [_model().double()]  # eager, aot_eager, ours, f64
    opts = [cls(m.parameters(), foreach=True, **options) for m in models]
    compiler, step = compiled(opts[2].step, tmp_path)
    steps = [opts[0].step, torch.compile(opts[1].step, backend="aot_eager"), step,
             torch.compile(opts[3].step, backend="aot_eager")]
    params = list(models[2].parameters())
    for it in range(3):
        g = torch.Generator().manual_seed(it)
        for ps in zip(*(m.parameters() for m in models)):
            grad = torch.randn(ps[0].shape, generator=g)
            for p in ps:
                p.grad = grad.to(p.dtype)
        for s in steps:
            s()
        for eager, op_by_op, ours, exact in zip(*(m.parameters() for m in models)):
            ours_error = (ours.double() - exact).abs().max()
            ulp = torch.finfo(torch.float32).eps * exact.abs().max()
            assert ours_error <= 2 * (op_by_op.double() - exact).abs().max() + 2 * ulp
            torch.testing.assert_close(ours, eager, rtol=1e-5, atol=1e-6)
    for state, op_by_op in zip(opts[2].state.values(), opts[1].state.values()):
        for key, value in op_by_op.items():
            torch.testing.assert_close(state[key], value, rtol=1e-5, atol=1e-6)
    # structure: every group on cpu, no more kernels than parameters in any graph (SGD's
    # first step, which makes its momentum buffers, is a graph of its own)
    graphs = [c.compiled for c in compiler.compilations if c.compiled is not None]
    assert graphs and set(codegens(compiler)) == {"cpu"}
    assert all(len(g.choices) <= len(params) for g in graphs)
    # the steady step writes every parameter and state tensor from its kernel: no copy_
    states = [v for state in opts[2].state.values() for v in state.values() if torch.is_tensor(v)]
    assert len(graphs[-1].plan.reuse.elided) == len(params) + len(states)
