"""fusion.decompose: composites become fusible primitives with the same results."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from fusion_testing import (example_inputs, fuse_and_compare, fusion_pipeline, groups,
                            plugin_registry, run_passes)
from torchloom.api import DTYPES, Graph, Node, TensorType, parse_graph, print_graph
from torchloom.tools import EagerCodegen, build_function
from torchloom.runtime.executor import CompiledGraph
from torchloom_fusion.decompose import DECOMPOSED_OPS, Decompose

CASES = {
    "layer_norm": """graph @g(%x: f32[6, 16], %w: f32[16], %b: f32[16]) {
      %o, %m, %r = aten.native_layer_norm.default(%x, %w, %b) {eps = 1e-05, normalized_shape = [16]} : f32[6, 16], f32[6, 1], f32[6, 1]
      return %o, %m, %r
    }""",
    "softmax": """graph @g(%x: f32[6, 16]) {
      %s = aten._softmax.default(%x) {dim = -1, half_to_float = false} : f32[6, 16]
      return %s
    }""",
    "log_softmax": """graph @g(%x: f32[6, 16]) {
      %s = aten._log_softmax.default(%x) {dim = 1, half_to_float = false} : f32[6, 16]
      return %s
    }""",
    "softmax_backward": """graph @g(%g: f32[6, 16], %y: f32[6, 16]) {
      %s = aten._softmax_backward_data.default(%g, %y) {dim = -1, input_dtype = #f32} : f32[6, 16]
      return %s
    }""",
    "gelu_backward": """graph @g(%g: f32[6, 16], %x: f32[6, 16]) {
      %s = aten.gelu_backward.default(%g, %x) : f32[6, 16]
      return %s
    }""",
    "batch_norm_eval": """graph @g(%x: f32[4, 3, 5], %w: f32[3], %b: f32[3], %m: f32[3], %v: f32[3]) {
      %o, %s1, %s2 = aten._native_batch_norm_legit_no_training.default(%x, %w, %b, %m, %v) {momentum = 0.1, eps = 1e-05} : f32[4, 3, 5], f32[0], f32[0]
      return %o
    }""",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_composite_is_replaced_by_primitives_with_equal_results(registry, case):
    ops = (*DECOMPOSED_OPS, "aten.gelu_backward.default")  # the last only when asked
    fused = fuse_and_compare(CASES[case], registry, [Decompose(ops=ops)])
    ops = [n.op for n in fused.nodes]
    composite = CASES[case].split("= ")[1].split("(")[0]
    assert composite not in ops
    assert all(registry.get(op).category != "opaque" for op in ops)


def test_gelu_backward_stays_one_pointwise_op_of_its_group(registry):
    """By default GELU's gradient is not decomposed: one pointwise op (native codegens
    compile it whole), fused with the bias gradient that reads it, results as eager's."""
    text = """graph @g(%g: f32[6, 16], %x: f32[6, 16]) {
      %s = aten.gelu_backward.default(%g, %x) : f32[6, 16]
      %b = aten.sum.dim_IntList(%s) {dim = [0]} : f32[16]
      return %s, %b
    }"""
    fused = fuse_and_compare(text, registry, fusion_pipeline())
    (group,) = groups(fused)
    ops = [n.op for n in group.region.nodes]
    assert ops == ["aten.gelu_backward.default", "aten.sum.dim_IntList"]


@pytest.mark.parametrize("case", ["layer_norm", "softmax", "log_softmax", "softmax_backward"])
def test_decomposed_normalization_is_one_group(registry, case):
    fused = fuse_and_compare(CASES[case], registry, fusion_pipeline())
    assert len(groups(fused)) == 1 and len(fused) == 1


def test_addmm_becomes_mm_plus_bias_add_that_joins_the_next_group(registry):
    text = """graph @g(%b: f32[16], %x: f32[4, 8], %w: f32[8, 16]) {
      %a = aten.addmm.default(%b, %x, %w) : f32[4, 16]
      %r = aten.relu.default(%a) : f32[4, 16]
      return %r
    }"""
    fused = fuse_and_compare(text, registry, fusion_pipeline())
    assert [n.op for n in fused.nodes] == ["aten.mm.default", "torchloom.fusion_group"]
    assert {n.op for n in groups(fused)[0].region.nodes} == {"aten.add.Tensor",
                                                              "aten.relu.default"}


def test_scaled_addmm_and_disabled_ops_are_left_alone(registry):
    text = """graph @g(%b: f32[16], %x: f32[4, 8], %w: f32[8, 16]) {
      %a = aten.addmm.default(%b, %x, %w) {beta = 2, alpha = 1} : f32[4, 16]
      %s = aten._softmax.default(%a) {dim = -1, half_to_float = false} : f32[4, 16]
      return %s
    }"""
    fused = fuse_and_compare(text, registry, [Decompose(ops=())])
    assert [n.op for n in fused.nodes] == ["aten.addmm.default", "aten._softmax.default"]


def test_addmm_read_only_by_a_matmul_stays_whole(registry):
    text = """graph @g(%b: f32[8], %x: f32[4, 8], %w: f32[8, 8]) {
      %a = aten.addmm.default(%b, %x, %w) : f32[4, 8]
      %m = aten.mm.default(%a, %w) : f32[4, 8]
      return %m
    }"""
    fused = fuse_and_compare(text, registry, fusion_pipeline())
    assert [n.op for n in fused.nodes] == ["aten.addmm.default", "aten.mm.default"]


# ---- where the primitives run op by op, the composite runs whole again ------------------

class _Calls(TorchDispatchMode):
    """The aten ops called while active (top-level calls, not those inside a kernel)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _calls(fn, args) -> tuple[list[str], tuple]:
    args = [a.clone() for a in args]
    with _Calls() as mode:
        out = fn(*args)
    return mode.ops, out


def _node(g: Graph, registry, op: str, inputs, **attrs) -> list:
    node = Node(op, inputs, attrs)
    return g.create(op, inputs, registry.get(op).infer_types(node), attrs).outputs


def _composite_graph(case: str, rows: int, cols: int, dtype: str, registry) -> Graph:
    """A forward composite and its backward, as aot_autograd hands them over."""
    g = Graph(case)
    x = g.add_input(TensorType((rows, cols), dtype), "x")
    go = g.add_input(TensorType((rows, cols), dtype), "go")
    if case == "layer_norm":
        w = g.add_input(TensorType((cols,), dtype), "w")
        b = g.add_input(TensorType((cols,), dtype), "b")
        y, mean, rstd = _node(g, registry, "aten.native_layer_norm.default", [x, w, b],
                              normalized_shape=(cols,), eps=1e-5)
        grads = _node(g, registry, "aten.native_layer_norm_backward.default",
                      [go, x, mean, rstd, w, b], normalized_shape=(cols,),
                      output_mask=(True, True, True))
        outs = [y, *grads]
    elif case in ("softmax", "log_softmax"):
        fwd, bwd = {"softmax": ("aten._softmax.default", "aten._softmax_backward_data.default"),
                    "log_softmax": ("aten._log_softmax.default",
                                    "aten._log_softmax_backward_data.default")}[case]
        (y,) = _node(g, registry, fwd, [x], dim=-1, half_to_float=False)
        (gx,) = _node(g, registry, bwd, [go, y], dim=-1, input_dtype=DTYPES[dtype])
        outs = [y, gx]
    elif case == "gelu":
        (y,) = _node(g, registry, "aten.gelu.default", [x])
        (gx,) = _node(g, registry, "aten.gelu_backward.default", [go, x])
        outs = [y, gx]
    else:  # linear: the addmm that decompose splits, then GELU
        w = g.add_input(TensorType((cols, cols), dtype), "w")
        b = g.add_input(TensorType((cols,), dtype), "b")
        (a,) = _node(g, registry, "aten.addmm.default", [b, x, w])
        (y,) = _node(g, registry, "aten.gelu.default", [a])
        outs = [y]
    g.set_outputs(outs)
    return g


def _inputs(graph: Graph, seed: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(v.type.shape, generator=gen).to(v.type.torch_dtype)
            for v in graph.inputs]


CASES_ROUND_TRIP = ["layer_norm", "softmax", "log_softmax", "gelu", "linear"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES_ROUND_TRIP), rows=st.integers(1, 33),
       cols=st.integers(1, 70), dtype=st.sampled_from(["f32", "bf16"]),
       seed=st.integers(0, 2**16))
def test_groups_on_the_eager_codegen_run_eagers_ops_exactly(case, rows, cols, dtype, seed):
    """Decomposed, fused, then run on the eager codegen: the same aten calls as the
    original graph (one composite where decompose made many primitives) and bit-identical
    results, forward and backward, f32 and bf16."""
    registry = plugin_registry()
    original = _composite_graph(case, rows, cols, dtype, registry)
    fused = parse_graph(print_graph(original))
    # GELU's gradient too (not decomposed by default), so that it is recomposed here
    passes = [Decompose(ops=(*DECOMPOSED_OPS, "aten.gelu_backward.default")),
              *fusion_pipeline()[1:]]
    run_passes(fused, passes, registry)
    assert any("decomposed" in n.attrs for n in fused.walk())  # decompose did split it
    args = _inputs(original, seed)
    want_ops, want = _calls(build_function(original, registry).fn, args)
    got_ops, got = _calls(CompiledGraph(fused, registry, [EagerCodegen()]), args)
    assert sorted(got_ops) == sorted(want_ops)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True)


def test_layer_norm_group_is_one_composite_call(registry):
    """layer_norm(x + r) -> GELU -> x0.5 + r: one group holding the full layer_norm
    decomposition; on the eager codegen it calls native_layer_norm once, nothing else of it."""
    text = """graph @g(%x: f32[8, 64], %r: f32[8, 64], %w: f32[64], %b: f32[64]) {
      %h = aten.add.Tensor(%x, %r) : f32[8, 64]
      %n, %m, %s = aten.native_layer_norm.default(%h, %w, %b) {eps = 1e-05, normalized_shape = [64]} : f32[8, 64], f32[8, 1], f32[8, 1]
      %g = aten.gelu.default(%n) : f32[8, 64]
      %h2 = aten.mul.Tensor(%g) {other = 0.5} : f32[8, 64]
      %o = aten.add.Tensor(%h2, %r) : f32[8, 64]
      return %o
    }"""
    fused = fuse_and_compare(text, registry, fusion_pipeline())
    (group,) = groups(fused)
    inside = [n.op for n in group.region.nodes]
    assert "aten.native_layer_norm.default" not in inside and len(inside) > 8
    compiled = CompiledGraph(fused, registry, [EagerCodegen()])
    args = example_inputs(parse_graph(text))
    ops, (got,) = _calls(compiled, args)
    assert ops == ["aten.add.Tensor", "aten.native_layer_norm.default", "aten.gelu.default",
                   "aten.mul.Tensor", "aten.add.Tensor"]
    (want,) = build_function(parse_graph(text), registry).fn(*args)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_training_step_through_torch_compile_calls_the_composites(eager_default, tmp_path):
    """LayerNorm -> GELU, forward and backward through ``torch.compile`` with the default
    passes on the eager codegen (and the compile cache: the second compiler loads the graphs
    the first stored): the plans call native_layer_norm and its backward, once each."""
    from torchloom.tools import Compiler, load_workload
    from torchloom.backend import torchloom_backend
    examples = Path(__file__).resolve().parents[2] / "examples"
    for attempt in range(2):
        model, (x,) = load_workload(examples / "layer_norm_gelu.py")
        compiler = Compiler(eager_default, cache_dir=tmp_path, compile_cache=True)
        compiled = torch.compile(model, backend=lambda gm, ex: torchloom_backend(
            gm, ex, options={"compiler": compiler}))
        torch._dynamo.reset()
        try:
            xe, xc = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
            model(xe).sum().backward()
            expected = [xe.grad] + [p.grad.clone() for p in model.parameters()]
            model.zero_grad()
            compiled(xc).sum().backward()  # compiles forward, then backward
            grads = [xc.grad] + [p.grad.clone() for p in model.parameters()]
            # a second step, compiled: what the plans call (the profiler sees aten calls
            # without changing how Dynamo runs, as a dispatch mode would)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                compiled(x.detach().clone().requires_grad_()).sum().backward()
            ops = [e.name for e in prof.events()]
        finally:
            torch._dynamo.reset()
        assert [c.cached for c in compiler.compilations] == [attempt == 1] * 2
        assert all(ch.codegen == "eager" for c in compiler.compilations
                   for ch in c.compiled.choices)
        assert {"CompiledFunction", "CompiledFunctionBackward"} <= set(ops)  # not eagerly
        assert ops.count("aten::native_layer_norm") == 1
        assert ops.count("aten::native_layer_norm_backward") == 1
        assert not {"aten::rsqrt", "aten::var_mean"} & set(ops)
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got, want)
