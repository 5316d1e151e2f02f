"""logit's gradient compiles on the cpu codegen (it ran on eager: "op
aten.logit_backward.default is not in its op table", found by an OpInfo sweep) and gives
eager's values: NaN outside [0, 1] without eps, 0 outside [eps, 1 - eps] with it, infinities
at 0 and 1, -0.0 and NaN inputs, f32, f64 and bf16."""

from __future__ import annotations

import pytest
import torch

from conftest import codegens, compiled

EDGES = [0.0, -0.0, 1.0, 0.5, 0.25, 1e-8, 1 - 1e-7, -0.1, 1.1, 0.2, 0.8, 0.19999, 0.80001,
         float("nan"), float("inf"), -float("inf"), 0.3, 0.7]


@pytest.mark.parametrize("eps", [None, 0.2, 1e-6, 0.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_logit_gradient_as_eager(tmp_path, dtype, eps):
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.tensor(EDGES, dtype=torch.float64),
                   torch.rand(1000, generator=g, dtype=torch.float64) * 1.2 - 0.1]).to(dtype)
    dy = torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype)
    dy[:3] = torch.tensor([0.0, -1.0, 2.0])

    def f(dy, x):
        return torch.ops.aten.logit_backward(dy, x, eps)
    compiler, fn = compiled(f, tmp_path)
    got, want = fn(dy, x), f(dy, x)
    assert set(codegens(compiler)) == {"cpu"}, codegens(compiler)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_logit_trains_on_the_cpu_codegen(tmp_path):
    """The whole step: logit forward and backward, both groups on cpu, gradients as eager's."""
    x = torch.rand(37, 11, dtype=torch.float32) * 1.1 - 0.05
    x.requires_grad_()
    compiler, fn = compiled(lambda x: torch.logit(x, 0.05).sum(), tmp_path)
    fn(x).backward()
    got, x.grad = x.grad, None
    torch.logit(x, 0.05).sum().backward()
    torch.testing.assert_close(got, x.grad, rtol=1e-6, atol=0)
    assert set(codegens(compiler)) == {"cpu"}, codegens(compiler)
