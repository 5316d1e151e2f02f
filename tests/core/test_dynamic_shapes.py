"""Dynamic shapes end to end: graphs with symbolic sizes compile (no eager fallback), at
most twice per graph over many sizes, and match eager forward and backward at every size
(sizes 1 and 0 included); random programs with symbolic dims, through the default
pipeline, at several concrete sizes against eager."""

from __future__ import annotations

import copy
import logging
import re

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from torchloom.compiler import Compiler
from torchloom.ir.types import TensorType
from torchloom.testing.programs import Program, random_program

#: (batch, sequence) pairs: both change at every call, 8 distinct values each
SIZES = [(2, 8), (3, 5), (4, 12), (6, 7), (5, 16), (7, 3), (8, 9), (9, 11)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Block(nn.Module):
    """Attention over a variable sequence and a GELU MLP, layer norms, a residual."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = ((q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        x = x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))
        return x.mean(1) * x.shape[1]  # a size used as a value, too


def _compiled(model, pipeline="default", **kwargs):
    compiler = Compiler(pipeline, compile_cache=False)
    return torch.compile(model, backend="torchloom", options={"compiler": compiler},
                         **kwargs), compiler


def _check_step(model, reference, compiled, batch, seq):
    x = torch.randn(batch, seq, 16)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = compiled(x1), reference(x2)
    torch.testing.assert_close(got, want, equal_nan=True)  # a 0-length mean is NaN
    weights = torch.randn_like(want)
    (got * weights).sum().backward()
    (want * weights).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, equal_nan=True)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, equal_nan=True)
        p.grad = q.grad = None


def _assert_no_fallback(compiler):
    for comp in compiler.compilations:
        assert comp.fallback_reason is None, comp.fallback_reason
        assert comp.compiled.fallback_calls == 0, comp.compiled.fallback_reason


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [None, True])
def test_many_batch_sizes_and_lengths_compile_at_most_twice_and_match_eager(dynamic, caplog):
    caplog.set_level(logging.INFO, logger="torchloom")
    torch.manual_seed(0)
    model = Block()
    reference = copy.deepcopy(model)
    compiled, compiler = _compiled(model, dynamic=dynamic)
    for batch, seq in SIZES:
        _check_step(model, reference, compiled, batch, seq)
    _assert_no_fallback(compiler)
    # forward and backward: a static graph for the first size (default torch.compile
    # only), then one with symbolic batch and sequence for all the others
    assert len(compiler.compilations) == (4 if dynamic is None else 2)
    symbolic = compiler.compilations[-2:]
    assert all(not all(v.type.is_static for v in c.graph.inputs if hasattr(v.type, "shape"))
               for c in symbolic)
    assert "eagerly" not in caplog.text and "guard failed" not in caplog.text
    # every group of the symbolic graphs is compiled by the cpu codegen (sizes as kernel
    # arguments), and explain --json's fallbacks name no symbolic shape
    for comp in symbolic:
        assert comp.compiled.choices and all(c.codegen == "cpu" for c in comp.compiled.choices), [
            (c.codegen, [str(r) for r in c.fallback_reasons]) for c in comp.compiled.choices]
    from torchloom.report import summarize
    fallbacks = summarize(compiler.compilations, compiler.registry,
                          compiler.kernel_cache)["fallbacks"]
    assert not any("symbolic" in f["reason"] for f in fallbacks), fallbacks


@pytest.mark.slow
def test_sizes_one_and_zero_match_eager_forward_and_backward():
    torch.manual_seed(0)
    model = Block()
    reference = copy.deepcopy(model)
    compiled, compiler = _compiled(model, dynamic=True)
    for batch, seq in [(3, 5), (1, 5), (0, 5), (4, 1), (2, 0), (6, 7)]:
        _check_step(model, reference, compiled, batch, seq)
    _assert_no_fallback(compiler)
    # torch specializes sizes 0 and 1: a graph for them, the symbolic one for the rest
    assert len(compiler.compilations) <= 2 * 5


def test_symbolic_groups_compile_once_on_the_cpu_codegen():
    """The cpu codegen takes symbolic sizes as kernel arguments: one C kernel per group
    serves every size (rows and row length both vary)."""
    compiled, compiler = _compiled(lambda x: torch.nn.functional.gelu(x * 2).sum(-1),
                                   dynamic=True)
    for rows, cols in [(3, 8), (5, 20), (9, 5000), (4, 9000)]:
        x = torch.randn(rows, cols)
        torch.testing.assert_close(compiled(x), torch.nn.functional.gelu(x * 2).sum(-1))
    (comp,) = compiler.compilations
    _assert_no_fallback(compiler)
    assert comp.compiled.choices and all(c.codegen == "cpu" for c in comp.compiled.choices)
    assert compiler.kernel_cache.stats()["compiles"] == len(comp.compiled.choices)


def _symbolic_program(program: Program) -> Program:
    return Program(program.ops, rows="s0", cols="s1")


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(3, 30), seed=st.integers(0, 10_000), reduce_every=st.sampled_from([0, 4]),
       matmul_every=st.sampled_from([0, 7]), opaque_every=st.sampled_from([0, 9]))
def test_random_symbolic_programs_match_eager_at_several_sizes(n, seed, reduce_every,
                                                               matmul_every, opaque_every):
    program = random_program(n, seed, window=6, reduce_every=reduce_every,
                             matmul_every=matmul_every, opaque_every=opaque_every)
    symbolic = _symbolic_program(program)
    graph = symbolic.graph()
    assert not graph.inputs[0].type.is_static
    compiler = Compiler("default", compile_cache=False, strict=True)
    comp = compiler.compile_graph(graph, fallback=lambda *a: pytest.fail("guard failed"))
    fn = program.function()
    for rows, cols in [(2, 3), (5, 4), (1, 7), (9, 2), (0, 3)]:
        inputs = Program(program.ops, rows, cols).example_inputs(seed)
        got, want = comp.fn(*inputs), fn(*inputs)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, equal_nan=True, atol=1e-4, rtol=1e-4)
    assert comp.compiled.fallback_calls == 0


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(3, 20), seed=st.integers(0, 10_000), reduce_every=st.sampled_from([0, 3]))
def test_random_programs_under_torch_compile_dynamic(n, seed, reduce_every):
    torch._dynamo.reset()
    program = random_program(n, seed, window=6, reduce_every=reduce_every, matmul_every=8)
    fn = program.function()
    compiled, compiler = _compiled(fn, dynamic=True)
    for rows, cols in [(3, 4), (5, 6), (8, 3)]:
        inputs = Program(program.ops, rows, cols).example_inputs(seed)
        for a, b in zip(compiled(*inputs), fn(*inputs)):
            torch.testing.assert_close(a, b, equal_nan=True, atol=1e-4, rtol=1e-4)
    _assert_no_fallback(compiler)
    assert len(compiler.compilations) == 1


def _views(x, y):
    """View chains and bookend views around pointwise work, over symbolic sizes."""
    b, s, d = x.shape
    a = (x.reshape(b * s, d) * 2).view(b, s, d).transpose(1, 2).sin()
    c = a.permute(0, 2, 1).flatten(0, 1).unsqueeze(0).expand(2, b * s, d) + y
    return c.squeeze(0).sum(0).view(b, s, d)[:, 1:].relu(), a.contiguous().view(-1).cos()


def test_views_over_symbolic_sizes_compile_and_match_eager():
    compiled, compiler = _compiled(_views, dynamic=True)
    for b, s in [(2, 3), (4, 5), (3, 9), (5, 4)]:  # s = 2 makes torch specialize
        x, y = torch.randn(b, s, 8), torch.randn(8)
        for got, want in zip(compiled(x, y), _views(x, y)):
            torch.testing.assert_close(got, want)
    _assert_no_fallback(compiler)
    assert len(compiler.compilations) == 1


def test_composites_with_symbolic_sizes_are_decomposed_and_fused():
    def model(x):
        return torch.softmax(x * 2, -1).relu()

    compiled, compiler = _compiled(model, dynamic=True)
    for rows in (3, 6, 11):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(compiled(x), model(x))
    (comp,) = compiler.compilations
    _assert_no_fallback(compiler)
    assert not any("fusion.decompose" in n for n in comp.notes)
    ops = [n.op for g in [comp.graph, *(n.region for n in comp.graph.nodes if n.region)]
           for n in g.nodes]
    assert "aten._softmax.default" not in ops  # primitives over the symbolic rows
    # the scale, the softmax's primitives and the relu: one group
    assert sum(n.region is not None for n in comp.graph.nodes) == 1


@pytest.mark.slow
def test_explain_dynamic_compiles_symbolic_graphs_with_no_graph_fallback(tmp_path):
    from pathlib import Path

    from torchloom.report.explain import explain, format_explain
    from torchloom.report.html import PassIRRecorder, write_html
    workload = Path(__file__).resolve().parents[2] / "examples" / "transformer_block.py"
    recorder = PassIRRecorder()
    result = explain(workload, dynamic=True, keep_ir=True, instruments=[recorder])
    text = format_explain(result, show_ir=True)
    assert "ran eagerly" not in text and "symbolic shape" not in text
    page = write_html(result, tmp_path / "report.html", recorder)
    assert "symbolic shape" not in page.read_text()
    data = result.data
    assert data["max_abs_error"] is not None and data["max_abs_error"] < 1e-3
    comps = result.compiler.compilations
    assert len(comps) == 2 and all(c.fallback_reason is None for c in comps)
    assert all(any(isinstance(v.type, TensorType) and not v.type.is_static
                   for v in c.graph.inputs) for c in comps)
    # the cpu codegen compiles the symbolic groups: no fallback names a symbolic shape
    assert all(f["reason"].startswith("group on eager:") for f in data["fallbacks"])
    assert not any("symbolic" in f["reason"] for f in data["fallbacks"]), data["fallbacks"]
    assert sum(c.codegen == "cpu" for comp in comps for c in comp.compiled.choices) >= 8


@pytest.mark.slow
def test_symbolic_graphs_load_from_the_compile_cache_and_run_at_new_sizes(tmp_path):
    torch.manual_seed(0)
    model = Block()
    reference = copy.deepcopy(model)
    for run, sizes in enumerate([[(2, 3), (4, 6)], [(5, 7), (3, 4), (7, 9)]]):
        torch._dynamo.reset()
        compiler = Compiler("default", cache_dir=tmp_path, compile_cache=True)
        compiled = torch.compile(model, backend="torchloom", options={"compiler": compiler},
                                 dynamic=True)
        for batch, seq in sizes:
            _check_step(model, reference, compiled, batch, seq)
        _assert_no_fallback(compiler)
        assert [c.cached for c in compiler.compilations] == [run == 1] * 2


def test_sym_size_ops_and_int_values_run_at_every_size():
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchloom.frontend.fx import import_fx

    def f(x, y):
        n = x.shape[0] * x.shape[1]
        return (x.reshape(n) * x.shape[0]).sin() + y.sum(), torch.zeros(x.shape[1], 2) + n

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(3, 4), torch.randn(5))
    compiler = Compiler("default", compile_cache=False, strict=True)
    imported = import_fx(gm, None, registry=compiler.registry)
    assert imported.symbolic
    assert sum(n.op == "aten.sym_size.int" for n in imported.graph.nodes) == 2
    comp = compiler.compile_graph(imported.graph, fallback=gm)
    for rows, cols, extra in [(2, 3, 4), (5, 7, 1), (1, 1, 3), (0, 4, 2)]:
        x, y = torch.randn(rows, cols), torch.randn(extra)
        for got, want in zip(comp.fn(x, y), f(x, y)):
            torch.testing.assert_close(got, want)
    assert comp.compiled.fallback_calls == 0


def test_symbolic_graphs_only_eager_runs_get_the_default_partitioner(monkeypatch):
    """Every group of a graph with symbolic sizes runs on eager (no C compiler, no GPU):
    recomputing in the backward, or splitting layer norm before the split, would only add
    kernels to what eager runs."""
    monkeypatch.setenv("CC", "no-such-compiler-torchloom")
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(16), nn.GELU())
    reference = copy.deepcopy(model)
    compiled, compiler = _compiled(model, dynamic=True)
    for rows in (3, 5):
        x = torch.randn(rows, 16)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        got, want = compiled(x1), reference(x2)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(x1.grad, x2.grad)
    # decomposed over the symbols, but on eager the plan runs the composite again
    plan = compiler.compilations[0].compiled.plan
    calls = re.findall(r"= (f\d+)\(", plan.source)  # layer norm (3 outputs) and GELU
    assert len(calls) == 2 and re.search(r"t\d+, t\d+, t\d+ = f\d+\(", plan.source), \
        plan.source
    _assert_no_fallback(compiler)


def test_groups_equal_up_to_symbol_names_share_one_kernel():
    def model(x, y):  # the same work on two tensors whose rows vary independently
        return torch.tanh(x * 2 + 1).sum(-1), torch.tanh(y * 2 + 1).sum(-1)

    compiled, compiler = _compiled(model, dynamic=True)
    for a, b in [(3, 5), (6, 4), (2, 9)]:
        x, y = torch.randn(a, 8), torch.randn(b, 8)
        for got, want in zip(compiled(x, y), model(x, y)):
            torch.testing.assert_close(got, want)
    (comp,) = compiler.compilations
    groups = [c.node for c in comp.compiled.choices]
    x_rows, y_rows = (v.type.shape[0] for v in comp.graph.inputs if isinstance(v.type, TensorType))
    assert len(groups) == 2 and x_rows != y_rows  # two symbols, one kernel for both
    stats = compiler.kernel_cache.stats()
    assert stats["compiles"] == 1 and stats["hits"] == 1


def test_data_dependent_sizes_compile_and_match_eager():
    """Unbacked symbols (``u0``: nonzero's row count, an ``item()`` used as a size), with
    torch's runtime asserts on them (ops that return nothing)."""
    def model(x):
        idx = torch.nonzero(x > 0)
        n = (x > 0).sum().item()
        return (idx.float() * 2).sin().sum(0), torch.ones(n) * 3

    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True,
                                    capture_scalar_outputs=True):
        compiled, compiler = _compiled(model)
        for rows in (5, 7, 9):
            x = torch.randn(rows, 4)
            for got, want in zip(compiled(x), model(x)):
                torch.testing.assert_close(got, want)
    _assert_no_fallback(compiler)
    assert any("u0" in str(v.type.shape) for c in compiler.compilations
               for n in c.graph.walk() for v in n.outputs if isinstance(v.type, TensorType))


#: shape-preserving steps over an [a, b, 8] tensor mixing views, broadcasts and reductions
VIEW_STEPS = {
    "transpose": lambda x, y: x.transpose(0, 1),
    "flatten": lambda x, y: x.reshape(-1, 8).sin().reshape(x.shape),
    "permute": lambda x, y: x.permute(2, 0, 1).cos().permute(1, 2, 0),
    "bias": lambda x, y: x + y,
    "row_max": lambda x, y: x - x.amax(-1, keepdim=True),
    "exp": lambda x, y: (x * -x).exp() * 0.5,  # bounded: chained exps of exps blew up
    "contiguous": lambda x, y: x.transpose(0, 1).contiguous().transpose(0, 1) * 2,
    "expand": lambda x, y: x.unsqueeze(1).expand(-1, 2, -1, -1).sum(1),
    "merge": lambda x, y: x.reshape(x.shape[0] * x.shape[1], 8).tanh().view(x.shape),
}


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(sorted(VIEW_STEPS)), min_size=1, max_size=7))
@example(steps=["bias", "exp", "bias", "bias", "bias", "exp", "exp"])
def test_random_view_chains_over_symbolic_sizes_match_eager(steps):
    torch._dynamo.reset()

    def model(x, y):
        for step in steps:
            x = VIEW_STEPS[step](x, y)
        return x

    compiled, compiler = _compiled(model, dynamic=True)
    gen = torch.Generator().manual_seed(len(steps))
    for a, b in [(2, 3), (4, 5), (3, 7), (1, 4)]:
        x, y = torch.randn(a, b, 8, generator=gen), torch.randn(8, generator=gen)
        # (the exp step was x.exp() * 0.5: chained, values reached 1e23 and exp's last-ulp
        # differences 3e-5 relative; a wrong index or view gives O(1) differences)
        torch.testing.assert_close(compiled(x, y), model(x, y), rtol=1e-5, atol=1e-5)
    _assert_no_fallback(compiler)
