"""Tensor constants of a model (``torch.tensor(...)`` in its forward) reach torchloom as
graph inputs copied by ``aten.lift_fresh_copy`` on every call; ``canonicalize`` folds the
copies that are only read (tests/golden/builtin/canonicalize_lifted_constant.ir), so the
constant is not copied per call, and keeps the ones a caller could write to."""

from __future__ import annotations

import pytest
import torch

from torchloom.compiler import Compiler


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled(fn, compiler):
    return torch.compile(fn, backend="torchloom", options={"compiler": compiler})


def _ops(compiler) -> list[str]:
    ops = []
    for comp in compiler.compilations:
        assert comp.graph is not None, "the graph fell back to eager"
        ops += [node.op for node in comp.graph.walk()]
    return ops


def _before(compiler) -> str:
    return "\n".join(comp.before_ir or "" for comp in compiler.compilations)


def test_a_constant_only_read_is_not_copied_per_call():
    def f(x):
        scale = torch.tensor([0.5, -2.0, 3.0, float("inf")])
        return (x * scale).relu() + torch.tensor(1.5)

    compiler = Compiler(keep_ir=True)
    g = _compiled(f, compiler)
    for _ in range(3):
        x = torch.randn(5, 4)
        torch.testing.assert_close(g(x), f(x), equal_nan=True)
    assert "lift_fresh_copy" in _before(compiler)  # what aot_autograd hands over
    assert "aten.lift_fresh_copy.default" not in _ops(compiler)


def test_a_returned_constant_stays_a_copy_the_caller_may_write():
    def f(x):
        c = torch.tensor([1.0, 2.0, 3.0])
        return c, x + c

    compiler = Compiler(keep_ir=True)
    g = _compiled(f, compiler)
    c, y = g(torch.zeros(3))
    c.add_(100.0)  # the caller's copy; the next call must not see it
    c2, y2 = g(torch.zeros(3))
    torch.testing.assert_close(c2, torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(y2, torch.tensor([1.0, 2.0, 3.0]))
    assert c2.data_ptr() != c.data_ptr()


def test_a_constant_written_in_place_keeps_its_copy():
    def f(x):
        c = torch.tensor([1.0, 2.0, 3.0])
        c.mul_(2.0)
        return x + c

    compiler = Compiler(keep_ir=True)
    g = _compiled(f, compiler)
    for _ in range(3):  # each call starts from the constant, not from the last call's c
        torch.testing.assert_close(g(torch.zeros(3)), torch.tensor([2.0, 4.0, 6.0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_constants_of_other_dtypes_under_autograd(dtype):
    lin = torch.nn.Linear(4, 4)

    def f(x):
        k = torch.tensor([3, 1, 2, 5], dtype=dtype)
        return (lin(x) * k.to(x.dtype)).sum()

    compiler = Compiler(keep_ir=True)
    g = _compiled(f, compiler)
    x = torch.randn(3, 4, requires_grad=True)
    out = g(x)
    out.backward()
    grad = x.grad.clone()
    x.grad = None
    lin.zero_grad()
    ref = f(x)
    ref.backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(grad, x.grad)
    assert "aten.lift_fresh_copy.default" not in _ops(compiler)
