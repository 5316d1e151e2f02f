"""Factories only kernels read are made once, when the plan is built
(``codegen.constants.fold_constants``): an ``arange`` and the views of it that a kernel
reads become constants of the plan, never a buffer it reuses, so a kernel writing its
output in place of a dying input cannot change them for the next call. A factory whose
result the caller receives or another op reads is made on every call, as before."""

from __future__ import annotations

import pytest
import torch
from torchloom.api import parse_graph
from torchloom.runtime.cache import KernelCache
from torchloom.runtime.executor import CompiledGraph

ARANGE = ("aten.arange.default() {device = #cpu, dtype = none, end = 32, layout = none, "
          "pin_memory = false} : i64[32]")


def _graph(tail: str, outputs: str) -> str:
    return f"""\
graph @g(%x: f32[4, 32]) {{
  %r = {ARANGE}
  %v = aten.view.default(%r) {{size = [1, 32]}} : i64[1, 32]
  %y, %z = torchloom.fusion_group(%x, %v, %r) : f32[4, 32], i64[32] region @group0(%a: f32[4, 32], %b: i64[1, 32], %c: i64[32]) {{
    %lt = aten.lt.Scalar(%b) {{other = 16}} : b8[1, 32]
    %n = aten.neg.default(%a) : f32[4, 32]
    %w = aten.where.self(%lt, %n, %a) : f32[4, 32]
    %k = aten.add.Tensor(%c, %c) : i64[32]
    return %w, %k
  }}
{tail}  return {outputs}
}}
"""


def eager(x):
    r = torch.arange(32)
    return torch.where(r.view(1, 32) < 16, -x, x), r + r


def _compile(registry, codegen, text):
    return CompiledGraph(parse_graph(text), registry, [codegen], KernelCache(),
                         lambda *args: eager(*args))


def test_a_mask_s_arange_is_made_once_and_stays_what_it_was(registry, codegen):
    compiled = _compile(registry, codegen, _graph("", "%y, %z"))
    namespace = compiled.plan.fn.__globals__
    made = [v for v in namespace.values() if isinstance(v, torch.Tensor)]
    assert any(torch.equal(v, torch.arange(32)) for v in made)
    calls = [v for v in namespace.values() if callable(v)]
    assert torch.ops.aten.arange.default not in calls and torch.arange not in calls
    x = torch.randn(4, 32)
    for _ in range(3):  # a kernel writing in place of a dying input never gets the constant
        y, z = compiled(x)
        torch.testing.assert_close((y, z), eager(x))
    assert compiled.fallback_calls == 0


@pytest.mark.parametrize("tail, outputs", [
    ("", "%y, %r"),  # the caller receives it
    ("  %s = aten.add.Tensor(%r, %r) : i64[32]\n", "%y, %s"),  # an op outside kernels reads it
    ("  %m = aten.add_.Tensor(%r, %r) : i64[32]\n", "%y, %z"),  # written in place
])
def test_factories_read_outside_kernels_are_made_on_every_call(registry, codegen, tail,
                                                                outputs):
    compiled = _compile(registry, codegen, _graph(tail, outputs))
    namespace = compiled.plan.fn.__globals__
    made = [v for v in namespace.values() if isinstance(v, torch.Tensor)]
    assert not any(v.shape == (32,) and v.dtype == torch.int64 for v in made)
    calls = [v for v in namespace.values() if callable(v)]
    assert torch.ops.aten.arange.default in calls or torch.arange in calls
    x = torch.randn(4, 32)
    first = compiled(x)
    second = compiled(x)
    for a, b in zip(first, second):
        assert a is not b or not isinstance(a, torch.Tensor)
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("body, shape", [
    ("  return %p\n", "i64[32]"),
    ("  %o = aten.alias.default(%p) : i64[32]\n  return %o\n", "i64[32]"),
    ("  %o = aten.view.default(%p) {size = [4, 8]} : i64[4, 8]\n  return %o\n", "i64[4, 8]"),
])
def test_a_factory_a_shared_subgraph_reads_is_made_on_every_call(registry, codegen, body,
                                                                 shape):
    """A shared subgraph's call runs ops, which may hand its input back (hostile tester,
    session 29: the folded ``arange`` reached the caller, who changed the next call's
    result by writing it)."""
    text = f"""\
graph @main(%x: f32[32]) {{
  %r = {ARANGE}
  %a = torchloom.call_subgraph(%r) {{callee = "layer"}} : {shape}
  return %a
}}
graph @layer(%p: i64[32]) {{
{body}}}
"""
    compiled = CompiledGraph(parse_graph(text), registry, [codegen], KernelCache(), None)
    x = torch.randn(32)
    (first,) = compiled(x)
    first.mul_(0)  # the caller's tensor: the next call's is another
    (second,) = compiled(x)
    torch.testing.assert_close(second, torch.arange(32).view(second.shape))
