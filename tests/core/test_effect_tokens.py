"""Effect tokens (aot_autograd threads one through ``with_effects`` calls, e.g. the error
check after ``linalg.solve``): traced as empty tensors, called with None. The graph takes
them untyped (no guard reads a None's shape); found by an OpInfo sweep (``linalg.eigvals``'s
backward solves)."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("grad", [False, True])
def test_a_solve_with_its_error_check_compiles_both_ways(grad):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 4, generator=g) + 4 * torch.eye(4)
    b = torch.randn(4, 2, generator=g)
    fn = torch.compile(lambda a, b: torch.linalg.solve(a, b) * 2, backend="torchloom")
    x, y = (t.clone().requires_grad_(grad) for t in (a, b))
    got = fn(x, y)
    want = torch.linalg.solve(a.clone().requires_grad_(grad), b) * 2
    torch.testing.assert_close(got, want)
    if grad:
        got.sum().backward()
        ref = a.clone().requires_grad_()
        (torch.linalg.solve(ref, b) * 2).sum().backward()
        torch.testing.assert_close(x.grad, ref.grad)


def test_eigvals_backward_takes_its_token():
    torch._dynamo.reset()
    x = torch.randn(3, 3, generator=torch.Generator().manual_seed(1), requires_grad=True)
    fn = torch.compile(lambda x: torch.linalg.eigvals(x), backend="torchloom")
    torch.view_as_real(fn(x)).sum().backward()
    got = x.grad
    x.grad = None
    torch.view_as_real(torch.linalg.eigvals(x)).sum().backward()
    torch.testing.assert_close(got, x.grad, rtol=1e-4, atol=1e-5)
