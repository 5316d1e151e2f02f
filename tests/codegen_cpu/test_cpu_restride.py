"""Views of the cpu codegen's kernel outputs are one strided view each (the launcher's
``exact_layouts``, ``codegen/restride.py``): attention's head split (``view``, ``split``,
``transpose``, ``permute`` of a fused kernel's result) over symbolic sequence lengths, the
plan's statements counted, the results and gradients compared with eager."""

from __future__ import annotations

import torch
from torchloom.codegen.restride import MOVED_START, SAME_START

from conftest import compiled


class Heads(torch.nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = torch.nn.functional.gelu(self.qkv(x)).split(d, -1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        return self.out(y).relu(), k.permute(0, 3, 1, 2)


def _view_calls(plan, registry) -> int:
    """How many of the plan's callables are view ops (their aten or public callables)."""
    views = {id(c) for name in SAME_START | MOVED_START
             for c in (registry.get(name).fn, registry.get(name).public_fn) if c is not None}
    return sum(id(v) in views for k, v in plan.fn.__globals__.items() if k[0] == "f")


def test_head_views_of_kernel_outputs_fold_at_symbolic_lengths(tmp_path):
    torch.manual_seed(0)
    model = Heads()
    compiler, fn = compiled(model, tmp_path, dynamic=True)
    for seq in (5, 9, 2, 17):
        x = torch.randn(2, seq, 16)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        got, want = fn(x1), model(x2)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            for n, a, e in zip(g.shape, g.stride(), w.stride()):
                assert n <= 1 or a == e, (g.stride(), w.stride())
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
        weights = [torch.randn(w.shape) for w in want]
        got_grads = torch.autograd.grad(sum((g * r).sum() for g, r in zip(got, weights)),
                                        [x1, *model.parameters()])
        want_grads = torch.autograd.grad(sum((w * r).sum() for w, r in zip(want, weights)),
                                         [x2, *model.parameters()])
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    plans = [comp.compiled.plan for comp in compiler.compilations]
    symbolic = [p for p in plans if "sym_" in p.source]
    assert len(symbolic) == 2, [p.source for p in plans]  # a forward and a backward
    for plan in plans:  # every view is of a kernel's output, a matmul's or an input
        assert _view_calls(plan, compiler.registry) == 0, plan.source
    # the q, k, v heads of the fused GELU's output: one view each, not view + transpose
    assert min(p.source.count("_restride(") for p in symbolic) >= 3
    for comp in compiler.compilations:
        assert comp.fallback_reason is None, comp.fallback_reason
