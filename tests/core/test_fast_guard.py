"""The plan's first guard is one C check of the static inputs (``guards.FastGuard``), learnt
from a call that passed the exact guard expressions; it is never looser than them: a
call it refuses takes the expressions, and only their verdict sends a call to the
fallback."""

from __future__ import annotations

import pytest
import torch
from torchloom.api import parse_graph
from torchloom.codegen import guards
from torchloom.runtime.cache import KernelCache
from torchloom.runtime.executor import CompiledGraph
from torchloom.codegen.eager import EagerCodegen
from torchloom.ops.aten import default_registry

GRAPH = """\
graph @g(%x: f32[4, 8], %t: f32[1, 8, 4] strided[32, 1, 8]) {
  %a = aten.mul.Tensor(%x, %x) : f32[4, 8]
  %b = aten.sum.default(%t) : f32[]
  %c = aten.add.Tensor(%a, %b) : f32[4, 8]
  return %c
}
"""


@pytest.fixture(scope="module")
def registry():
    return default_registry()


def eager(x, t):
    return (x * x + t.sum(),)


def _compiled(registry):
    return CompiledGraph(parse_graph(GRAPH), registry, [EagerCodegen()], KernelCache(),
                         lambda *args: eager(*args))


def _inputs():
    return torch.randn(4, 8), torch.randn(1, 4, 8).transpose(1, 2)


def test_without_torch_s_check_the_expressions_guard_alone(registry, monkeypatch):
    monkeypatch.setattr(guards, "_tensor_guards", lambda: None)
    compiled = _compiled(registry)
    assert "_fast" not in compiled.plan.source
    x, t = _inputs()
    torch.testing.assert_close(compiled(x, t), eager(x, t))
    compiled(x.double(), t)
    assert compiled.fallback_calls == 1


def test_calls_it_refuses_still_run_compiled_when_their_types_match(registry):
    compiled = _compiled(registry)
    fast = compiled.plan.fn.__globals__["_fast"]
    x, t = _inputs()
    compiled(x, t)
    assert fast.check(x, t)
    # other dispatch keys or requires_grad: the C check refuses, the expressions pass
    rx = x.clone().requires_grad_()
    assert not fast.check(rx, t)
    with torch.no_grad():
        torch.testing.assert_close(compiled(rx, t), eager(x, t))
    with torch.inference_mode():
        ix, it = x.clone(), t.clone().transpose(1, 2).contiguous().transpose(1, 2)
        assert ix.is_inference() and not fast.check(ix, it)
        torch.testing.assert_close(compiled(ix, it), eager(ix, it))
    assert compiled.fallback_calls == 0
    # a wrong layout: refused by both, so the fallback
    compiled(x, t.contiguous())
    assert compiled.fallback_calls == 1


def test_it_learns_a_bounded_number_of_times(registry):
    compiled = _compiled(registry)
    fast = compiled.plan.fn.__globals__["_fast"]
    x, t = _inputs()
    for k in range(2 * guards.FastGuard.LEARNS):  # alternating kinds of inputs
        a = x.clone().requires_grad_(k % 2 == 1)
        with torch.no_grad():
            torch.testing.assert_close(compiled(a, t), eager(x, t))
    assert fast._learnt == guards.FastGuard.LEARNS and compiled.fallback_calls == 0


@pytest.mark.parametrize("shape, strides", [((4, 1, 8), (8, 8, 1)), ((4, 1, 8), (8, 99, 1)),
                                            ((0, 8), (8, 1)), ((1, 1), (5, 7))])
def test_strides_of_size_1_dims_never_matter(registry, shape, strides):
    text = f"graph @g(%x: f32[{', '.join(map(str, shape))}]) {{\n" \
           f"  %y = aten.neg.default(%x) : f32[{', '.join(map(str, shape))}]\n  return %y\n}}\n"
    compiled = CompiledGraph(parse_graph(text), registry, [EagerCodegen()], KernelCache(),
                             lambda x: (-x,))
    x = torch.empty_strided(shape, strides).normal_() if 0 not in shape else torch.empty(shape)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), (-x,))
    assert compiled.fallback_calls == 0
