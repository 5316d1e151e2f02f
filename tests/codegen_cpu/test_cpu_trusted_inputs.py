"""The plan's guards checked the graph's inputs, so the kernels they reach unchanged skip
their own layout checks (``Launcher.trusting``): one C check of every static input first
(``guards.FastGuard``), the guard expressions only when it fails, the kernel's stride
checks left out. Whatever the inputs' layouts, dtypes and ``requires_grad``, a call falls
back exactly when an input breaks its type, and its results are eager's."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torchloom.api import parse_graph
from torchloom.codegen.plan import _trusted
from torchloom.runtime.executor import CompiledGraph
from torchloom.runtime.cache import KernelCache
from torchloom.runtime.tiered import Tiered

from torchloom_codegen_cpu.launcher import _Trusting

GRAPH = """\
graph @g(%x: f32[4, 8], %t: f32[4, 8] strided[1, 4], %u: f32[1, 8], %v: f32[4, 8]) {
  %o0 = torchloom.fusion_group(%x, %t, %u) : f32[4, 8] region @group0(%a: f32[4, 8], %b: f32[4, 8] strided[1, 4], %c: f32[1, 8]) {
    %s = aten.add.Tensor(%a, %b) : f32[4, 8]
    %m = aten.mul.Tensor(%s, %c) : f32[4, 8]
    return %m
  }
  %o1 = torchloom.fusion_group(%o0, %v) : f32[4, 8] region @group1(%d: f32[4, 8], %e: f32[4, 8]) {
    %q = aten.sub.Tensor(%d, %e) : f32[4, 8]
    %r = aten.exp.default(%q) : f32[4, 8]
    return %r
  }
  return %o1
}
"""


def eager(x, t, u, v):
    return (torch.exp((x + t) * u - v),)


@pytest.fixture
def compiled(registry, codegen):
    calls = []

    def fallback(*args):
        calls.append(args)
        return eager(*args)
    return CompiledGraph(parse_graph(GRAPH), registry, [codegen], KernelCache(), fallback), calls


def _kernels(fn):
    """The kernels a plan's generated function calls, in the order of their nodes (a
    kernel whose library was still building when the plan was made, as it is built)."""
    namespace = fn.__globals__
    return [_built(namespace[k]) for k in sorted(namespace) if k[:1] == "f" and k[1:].isdigit()]


def _built(kernel):
    return kernel.native.resolve() if isinstance(kernel, Tiered) else kernel


def test_kernels_given_guarded_inputs_leave_their_checks_out(compiled):
    graph, _ = compiled
    first, second = _kernels(graph.plan.fn)
    assert isinstance(first, _Trusting) and isinstance(second, _Trusting)
    # the first takes three guarded inputs: no stride check is left
    assert ".stride()" not in first.source and "_fix" not in first.source
    # the second's first input is the first kernel's output: still checked
    assert "a0.stride()" in second.source and "a1.stride()" not in second.source
    fast = graph.plan.fn.__globals__["_fast"]
    x, t, u, v = (torch.empty_strided(shape, typed).normal_() for shape, typed in SHAPES)
    assert not fast.check(x, t, u, v)  # nothing learnt yet
    torch.testing.assert_close(graph(x, t, u, v), eager(x, t, u, v))
    assert fast.check(x, t, u, v)  # the C check passes these from now on
    assert not fast.check(x, t.contiguous(), u, v)


#: how a call's input is made: with its type's layout (``typed``), its dims of size > 1
#: laid out otherwise, a size-1 dim of another stride, another dtype, needing gradients,
#: at an offset inside a larger buffer
LAYOUTS = ("typed", "other", "size1", "f64", "grad", "offset")
#: the graph's inputs: shape and the strides of their types
SHAPES = [((4, 8), (8, 1)), ((4, 8), (1, 4)), ((1, 8), (8, 1)), ((4, 8), (8, 1))]


def _make(layout: str, shape, typed, g: torch.Generator) -> torch.Tensor:
    values = torch.randn(*shape, generator=g)
    if layout == "f64":
        return values.double()
    if layout == "other" and shape[0] > 1:
        return torch.empty_strided(shape, (1, 4) if typed == (8, 1) else (8, 1)).copy_(values)
    if layout == "other":  # [1, 8] with its 8 elements 2 apart
        return torch.randn(16, generator=g)[::2].unsqueeze(0)
    if layout == "size1" and shape[0] == 1:
        return torch.empty_strided(shape, (3, 1)).copy_(values)
    if layout == "offset":
        return torch.randn(7 + 32, generator=g)[7:].as_strided(shape, typed).copy_(values)
    tensor = torch.empty_strided(shape, typed).copy_(values)
    return tensor.requires_grad_() if layout == "grad" else tensor


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(*[st.sampled_from(LAYOUTS)] * 4), min_size=1, max_size=6),
       st.integers(0, 2**31))
def test_a_call_falls_back_exactly_when_an_input_breaks_its_type(registry, codegen,
                                                                 sequence, seed):
    graph = CompiledGraph(parse_graph(GRAPH), registry, [codegen], KernelCache(),
                          lambda *args: eager(*args))
    g = torch.Generator().manual_seed(seed)
    for layouts in sequence:
        args = [_make(k, shape, typed, g) for k, (shape, typed) in zip(layouts, SHAPES)]
        breaks = "other" in layouts or "f64" in layouts
        before = graph.fallback_calls
        with torch.no_grad():
            (got,) = graph(*args)
        assert graph.fallback_calls - before == int(breaks), layouts
        (want,) = eager(*[a.detach() for a in args])
        torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-6, atol=1e-6)


def test_inputs_reshaped_in_place_are_not_trusted(registry):
    graph = parse_graph("""\
graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
  %a = aten.t_.default(%x) : f32[8, 4]
  %b = aten.exp.default(%y) : f32[4, 8]
  return %a, %b
}
""")
    x, y = graph.inputs
    assert _trusted(graph, [x, y]) == frozenset({y})


def test_only_the_c_checked_path_hands_tensors_whole(compiled):
    """A call the C check passed hands the guarded inputs to the kernels whole (their data
    pointers read in C); a call it refused runs the checked plan, which hands over
    ``data_ptr()`` ints, so a tensor without storage raises instead of aborting."""
    graph, _ = compiled
    first = _kernels(graph.plan.fn)[0]
    assert "_fn(a0, a1, a2," in first.source  # whole
    plain = _kernels(graph.plan.fn.__globals__["_checked"])[0]
    assert isinstance(plain, _Trusting) and "a0.data_ptr()" in plain.source
    x, t, u, v = (torch.empty_strided(shape, typed).normal_() for shape, typed in SHAPES)
    torch.testing.assert_close(graph(x, t, u, v), eager(x, t, u, v))  # learnt
    xs = torch.stack([x, x + 1])
    with pytest.raises(RuntimeError, match="storage"):  # vmap's batched tensors
        torch.func.vmap(lambda a: graph(a, t, u, v)[0])(xs)
    torch.testing.assert_close(graph(x, t, u, v), eager(x, t, u, v))
