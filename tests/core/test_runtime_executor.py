"""The runtime: generated Python plans, guards with a logged-once fallback, region kernels."""

from __future__ import annotations

import logging

import pytest
import torch
from functorch.compile import aot_function, make_boxed_func

from torchloom.codegen.eager import EagerCodegen
from torchloom.compiler import Compiler
from torchloom.ir import parse_graph
from torchloom.ops.aten import default_registry
from torchloom.runtime.cache import KernelCache
from torchloom.runtime.executor import CompiledGraph, build_function


@pytest.fixture(scope="module")
def registry():
    return default_registry()


CHAIN = """\
graph @chain(%x: f32[4, 8], %y: f32[8]) {
  %a = aten.add.Tensor(%x, %y) : f32[4, 8]
  %b = aten.exp.default(%a) : f32[4, 8]
  %c = aten.sum.dim_IntList(%b) {dim = [-1], keepdim = false} : f32[4]
  return %c, %a, %x, %a
}
"""


def eager_chain(x, y):
    a = x + y
    return a.exp().sum(-1), a, x, a


def test_plan_calls_prebound_callables_and_reuses_dead_locals(registry):
    g = parse_graph(CHAIN)
    plan = build_function(g, registry)
    assert "aten" not in plan.source and "registry" not in plan.source  # no lookups per call
    # %b dies at the sum, whose result takes its local: no extra statement frees it
    assert "    t1 = f1(t0)\n    t1 = f2(t1, [-1], False)\n" in plan.source
    assert "= None" not in plan.source
    x, y = torch.randn(4, 8), torch.randn(8)
    got = plan.fn(x, y)
    for a, b in zip(got, eager_chain(x, y)):
        torch.testing.assert_close(a, b)
    assert got[2] is x and got[1] is got[3]


def test_values_dying_without_a_successor_are_dropped(registry):
    g = parse_graph("""\
graph @g(%x: f32[3]) {
  %a = aten.exp.default(%x) : f32[3]
  %b, %c = aten.split.Tensor(%a) {split_size = 2} : f32[2], f32[1]
  %d = aten.sum.default(%x) : f32[]
  aten._assert_async.msg(%d) {assert_msg = "nonzero"} : ()
  %e = aten.sin.default(%b) : f32[2]
  return %e
}
""")
    plan = build_function(g, registry)
    assert "    t0, t1 = f1(t0, 2)\n    t1 = None\n" in plan.source  # unused %c dropped at once
    assert "    f3(t1, 'nonzero')\n    t1 = None\n" in plan.source  # %d's last reader has no output
    x = torch.rand(3) + 0.5
    torch.testing.assert_close(plan.fn(x)[0], x.exp()[:2].sin())


def test_zero_outputs_nonfinite_constants_and_dtype_attributes(registry):
    g = parse_graph("""\
graph @g(%x: f32[3]) {
  %a = aten.clamp.default(%x) {max = inf, min = -inf} : f32[3]
  %b = aten.add.Scalar(%a) {other = nan} : f32[3]
  %c = aten._to_copy.default(%x) {dtype = #f64} : f64[3]
  %d = torchloom.constant() {value = 7} : int
  return %b, %c, %d
}
""")
    x = torch.randn(3)
    b, c, d = build_function(g, registry).fn(x)
    assert torch.isnan(b).all() and c.dtype is torch.float64 and d == 7
    torch.testing.assert_close(c, x.double())
    assert build_function(parse_graph("graph @e() {\n  return\n}\n"), registry).fn() == ()


GUARDED = """\
graph @g(%x: f32[4, 8], %t: f32[1, 8, 4] strided[32, 1, 8]) {
  %a = aten.mul.Tensor(%x, %x) : f32[4, 8]
  %b = aten.sum.default(%t) : f32[]
  %c = aten.add.Tensor(%a, %b) : f32[4, 8]
  return %c
}
"""


def guarded_eager(x, t):
    return (x * x + t.sum(),)


@pytest.fixture
def guarded(registry):
    calls = []

    def fallback(*args):
        calls.append(args)
        return guarded_eager(*args)

    compiled = CompiledGraph(parse_graph(GUARDED), registry, [EagerCodegen()], KernelCache(),
                             fallback)
    return compiled, calls


def transposed(*shape):
    """A tensor of ``shape`` whose last two dims are swapped in memory."""
    return torch.randn(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)


def test_matching_inputs_take_the_compiled_path(guarded):
    compiled, calls = guarded
    x, t = torch.randn(4, 8), transposed(1, 8, 4)
    torch.testing.assert_close(compiled(x, t), guarded_eager(x, t))
    # a size-1 dim may have any stride: still the compiled path
    t2 = torch.randn(8, 4).t().contiguous().t().unsqueeze(0)
    assert t2.stride()[0] != 32
    torch.testing.assert_close(compiled(x, t2), guarded_eager(x, t2))
    assert calls == [] and compiled.fallback_calls == 0


@pytest.mark.parametrize("bad, words", [
    (lambda: (torch.randn(5, 8), transposed(1, 8, 4)), "compiled for f32[4, 8], called with f32[5, 8]"),
    (lambda: (torch.randn(4, 8, dtype=torch.float64), transposed(1, 8, 4)), "called with f64[4, 8]"),
    (lambda: (torch.randn(8, 4).t(), transposed(1, 8, 4)), "called with f32[4, 8] strided[1, 4]"),
    (lambda: (torch.randn(4, 8), torch.randn(1, 8, 4)), "input %t: compiled for f32[1, 8, 4] strided"),
])
def test_failing_guard_falls_back_once_logged_with_reason(guarded, caplog, bad, words):
    compiled, calls = guarded
    caplog.set_level(logging.DEBUG, logger="torchloom")
    for _ in range(3):
        args = bad()
        torch.testing.assert_close(compiled(*args), guarded_eager(*args))
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert words in warnings[0].getMessage() and "running the original graph" in warnings[0].getMessage()
    assert compiled.fallback_calls == 3 and len(calls) == 3
    assert words in compiled.fallback_reason


def test_regions_run_through_the_codegen_and_share_kernels(registry):
    g = parse_graph("""\
graph @g(%x: f32[4], %y: f32[4]) {
  %p = torchloom.fusion_group(%x) : f32[4] region @g0(%a: f32[4]) {
    %b = aten.exp.default(%a) : f32[4]
    return %b
  }
  %q = torchloom.fusion_group(%y) : f32[4] region @g1(%c: f32[4]) {
    %d = aten.exp.default(%c) : f32[4]
    return %d
  }
  %r = aten.add.Tensor(%p, %q) : f32[4]
  return %r
}
""")
    cache = KernelCache()
    compiled = CompiledGraph(g, registry, [EagerCodegen()], cache)
    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(compiled(x, y), (x.exp() + y.exp(),))
    assert [c.codegen for c in compiled.choices] == ["eager", "eager"]
    assert cache.compiles == 1 and cache.hits == 1  # equal up to renaming: one kernel


def test_guard_fallback_with_bound_constants_calls_original_graph(caplog):
    graphs = []

    def capture(gm, ex):
        graphs.append((gm, list(ex)))
        return make_boxed_func(gm.forward)

    fn = lambda x: x * torch.tensor([1.0, 2.0, 3.0]) + 1  # noqa: E731  (an FX get_attr)
    aot_function(fn, fw_compiler=capture)(torch.randn(2, 3))
    gm, ex = graphs[0]
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    compiled = Compiler("none").compile_fx(gm, ex)
    x = torch.randn(2, 3)
    torch.testing.assert_close(compiled(x)[0], fn(x))
    caplog.set_level(logging.WARNING, logger="torchloom")
    wide = torch.randn(5, 3)  # guard fails: the original graph takes only the user's input
    torch.testing.assert_close(compiled(wide)[0], fn(wide))
    assert "guard failed" in caplog.text and "f32[5, 3]" in caplog.text


def test_device_guard_on_a_non_cpu_type(registry, caplog):
    g = parse_graph("graph @g(%x: f32[2] @meta) {\n  %y = aten.neg.default(%x) : f32[2] @meta\n"
                    "  return %y\n}\n")
    compiled = CompiledGraph(g, registry, [EagerCodegen()], KernelCache(),
                             fallback=lambda x: (x * -1,))
    meta = torch.empty(2, device="meta")
    assert compiled(meta)[0].device.type == "meta" and compiled.fallback_calls == 0
    caplog.set_level(logging.WARNING, logger="torchloom")
    x = torch.randn(2)
    torch.testing.assert_close(compiled(x)[0], -x)
    assert compiled.fallback_calls == 1
    assert "compiled for f32[2] @meta, called with f32[2])" in caplog.text


class BrokenCodegen:
    """Claims every group, then fails to compile it."""

    name, version = "broken", "0"

    def supports(self, group, registry):
        return None

    def generate(self, group, registry):
        raise RuntimeError("kaboom")

    def load(self, kernel, registry):
        raise AssertionError("never reached")


def test_a_codegen_that_fails_to_compile_falls_back_to_the_next(registry, caplog):
    g = parse_graph("""\
graph @g(%x: f32[4]) {
  %p = torchloom.fusion_group(%x) : f32[4] region @g0(%a: f32[4]) {
    %b = aten.exp.default(%a) : f32[4]
    return %b
  }
  return %p
}
""")
    caplog.set_level(logging.WARNING, logger="torchloom")
    compiled = CompiledGraph(g, registry, [BrokenCodegen(), EagerCodegen()], KernelCache())
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), (x.exp(),))
    (choice,) = compiled.choices
    assert choice.codegen == "eager"
    (reason,) = choice.fallback_reasons
    assert str(reason).startswith("broken: raised while compiling the group: "
                                  "RuntimeError: kaboom (group IR: ")
    assert "kaboom" in caplog.text


@pytest.mark.parametrize("typed, actual, fails", [
    ("cuda", torch.device("cuda", 1), False),  # no index in the type: any cuda device
    ("cuda:1", torch.device("cuda", 1), False),
    ("cuda:0", torch.device("cuda", 1), True),
    ("cuda", torch.device("cpu"), True),
    ("cpu", torch.device("cuda", 0), True),
])
def test_device_guard_expressions(typed, actual, fails):
    from types import SimpleNamespace

    from torchloom.ir import Graph, TensorType
    from torchloom.runtime.guards import guard_expressions

    g = Graph("g")
    g.add_input(TensorType.make([2], "f32", typed), "x")
    env: dict = {}
    ((index, expr),) = list(guard_expressions(g.inputs, env))
    fake = SimpleNamespace(shape=torch.Size([2]), dtype=torch.float32, device=actual,
                           is_cpu=actual.type == "cpu", is_contiguous=lambda: True)
    assert index == 0 and eval(expr, {**env, "a0": fake}) is fails  # noqa: S307


def test_guards_of_many_inputs_stay_linear_and_name_the_failing_input(registry, caplog):
    n = 300  # a model with hundreds of parameters: one guard each
    params = ", ".join(f"%p{i}: f32[{i % 7 + 1}]" for i in range(n))
    text = (f"graph @wide({params}) {{\n  %s = aten.add.Tensor(%p0, %p{n - 7}) : f32[1]\n"
            f"  return %s\n}}\n")
    calls = []
    compiled = CompiledGraph(parse_graph(text), registry, [EagerCodegen()], KernelCache(),
                             lambda *args: calls.append(len(args)) or (args[0],))
    assert len(compiled.source) < 200 * n  # one condition, one fallback call
    args = [torch.randn(i % 7 + 1) for i in range(n)]
    torch.testing.assert_close(compiled(*args)[0], args[0] + args[n - 7])
    args[250] = torch.randn(3, 3)
    caplog.set_level(logging.WARNING, logger="torchloom")
    compiled(*args)
    assert calls == [n]
    assert "input %p250: compiled for f32[6], called with f32[3, 3]" in compiled.fallback_reason
