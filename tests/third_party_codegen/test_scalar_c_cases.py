"""The third-party codegen ``scalar_c`` (examples/third_party_codegen/, written against
``torchloom.api`` alone): found through its entry point (a .dist-info written from its own
pyproject.toml, as pip would, and its src/ on sys.path), it runs the group-level case
tables the cpu and Triton codegens' tests share (torchloom.testing.reductions and
torchloom.testing.pointwise) and matches eager; a case it declines is declined for a
capability it lacks (Capabilities.gap), never silently; a pipeline selects it with
``codegen = ["scalar_c"]``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torchloom.api import Reason, Schedule, parse_graph
from torchloom.backend import torchloom_backend
from torchloom.compiler import Compiler
from torchloom.runtime.executor import CompiledGraph
from torchloom.testing import pointwise, reductions
from torchloom.tools import EagerCodegen

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "third_party_codegen"
CASES = {**reductions.CASES, **pointwise.CASES}
#: cases scalar_c renders (the others it declines for a capability; see the count test)
RENDERED = 37


@pytest.fixture(scope="module")
def scalar_c(plugins):
    return plugins.codegen("scalar_c")


def _group(text: str):
    return next(parse_graph(text).nodes)


def test_registered_through_its_entry_point(plugins):
    registered = plugins.codegens["scalar_c"]
    assert registered.distribution == "torchloom-scalar-c"
    assert not [e for e in plugins.errors if "scalar_c" in str(e)]


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")
@pytest.mark.parametrize("name", sorted(CASES))
def test_shared_case_matches_eager_or_is_declined_for_a_capability(plugins, scalar_c, name):
    text, inputs = CASES[name]
    reason = scalar_c.supports(_group(text), plugins.registry)
    if reason is not None:  # declined: for what its capabilities lack, and said so
        gap = scalar_c.renderer.capabilities.gap(Schedule.of(_group(text)))
        assert gap is not None and reason == Reason("scalar_c", gap), reason
        return
    compiled = CompiledGraph(parse_graph(text), plugins.registry, [scalar_c, EagerCodegen()])
    assert [c.codegen for c in compiled.choices] == ["scalar_c"]
    got = compiled(*inputs())
    want = CompiledGraph(parse_graph(text), plugins.registry, [EagerCodegen()])(*inputs())
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, equal_nan=True)


def test_how_many_shared_cases_it_renders(plugins, scalar_c):
    """37 of the 39 shared cases; the 2 others are an f16 input and an op outside its
    table (gelu_backward). Every case whose dtypes and ops it has is rendered: pointwise,
    row, column and strided reductions."""
    rendered, declined = [], {}
    for name, (text, _) in sorted(CASES.items()):
        reason = scalar_c.supports(_group(text), plugins.registry)
        (rendered.append(name) if reason is None else declined.__setitem__(name, reason))
    assert len(CASES) == 39 and len(rendered) == RENDERED, declined
    forms = {name: Schedule.of(_group(CASES[name][0])).form for name in declined}
    assert sorted(forms.values()) == ["pointwise"] * 2
    rendered_forms = {Schedule.of(_group(CASES[name][0])).form for name in rendered}
    assert rendered_forms == {"pointwise", "row_reduction", "column_reduction",
                              "strided_reduction"}
    assert "renders no dtype f16" in str(declined["half_inputs_computed_in_fp32"])
    assert "gelu_backward" in str(declined["backward_templates"])


def test_kernels_are_plain_scalar_c(plugins, scalar_c):
    text, _ = reductions.CASES["softmax"]
    source = scalar_c.generate(_group(text), plugins.registry).source
    assert "void kernel(const float* restrict in_a, float* restrict out0)" in source
    assert "#pragma" not in source and "omp" not in source
    assert source.count("for (int64_t r = 0; r < 20; r++)") == 3  # max, sum, the stores


def test_the_example_imports_torchloom_api_alone():
    sources = sorted((EXAMPLE / "src").rglob("*.py"))
    assert sum(len(p.read_text().splitlines()) for p in sources) <= 300
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                assert not name.startswith("torchloom.") or name == "torchloom.api", (path, name)
                assert not name.startswith("torchloom_codegen"), (path, name)


def _codegens(compiler: Compiler) -> list[str]:
    return [c.codegen for comp in compiler.compilations for c in comp.compiled.choices]


def test_a_pipeline_selects_it(plugins, scalar_c_compiler):
    compiler = scalar_c_compiler

    def fn(x, w):
        return torch.softmax(x * w, dim=-1), torch.nn.functional.gelu(x + w)

    x, w = torch.randn(16, 40), torch.randn(40)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    for got, want in zip(compiled(x, w), fn(x, w)):
        torch.testing.assert_close(got, want)
    torch._dynamo.reset()
    choices = _codegens(compiler)
    assert choices and set(choices) == {"scalar_c"}, choices


def test_dynamic_shapes_compile_once_on_it(plugins, scalar_c, scalar_c_compiler):
    """``torch.compile(dynamic=True)``: one graph and one kernel of symbolic sizes serve
    every batch and row length (sizes 2 and up: Dynamo specialises 0 and 1), on
    scalar_c, matching eager: softmax, layer norm, RMSNorm, GELU, argmax, var."""
    compiler = scalar_c_compiler

    def fn(x, w):
        rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (torch.softmax(x * w, dim=-1), torch.nn.functional.layer_norm(x, w.shape, w),
                rms, torch.nn.functional.gelu(x + w), x.argmax(-1), x.var(-1))

    torch._dynamo.reset()
    compiled = torch.compile(fn, dynamic=True, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    for rows, cols in [(16, 40), (5, 7), (33, 129), (2, 2)]:
        x, w = torch.randn(rows, cols), torch.randn(cols)
        for got, want in zip(compiled(x, w), fn(x, w)):
            torch.testing.assert_close(got, want)
    torch._dynamo.reset()
    assert len(compiler.compilations) == 1
    assert _codegens(compiler) == ["scalar_c"]
    (choice,) = compiler.compilations[0].compiled.choices
    source = scalar_c.generate(choice.node, plugins.registry).source
    sizes = ", ".join(f"int64_t size_{s}" for s in sorted(Schedule.of(choice.node).symbols))
    assert sizes and source.count(f"{sizes}) {{") == 1, source


@pytest.mark.parametrize("name", ["column_sum_long", "mean_middle_dim", "softmax_dim0",
                                  "sum_dim0_keepdim", "sum_outer_dims"])
def test_scalar_c_renders_column_and_strided_nests(plugins, scalar_c, name):
    """The core's lowering walks a nest reduced by columns or across interleaved dims as
    well as by rows: scalar_c claims those forms and renders them, matching eager."""
    text, inputs = CASES[name]
    group = _group(text)
    assert Schedule.of(group).form in ("column_reduction", "strided_reduction", "several_nests")
    compiled = CompiledGraph(parse_graph(text), plugins.registry, [scalar_c, EagerCodegen()])
    assert [c.codegen for c in compiled.choices] == ["scalar_c"]
    want = CompiledGraph(parse_graph(text), plugins.registry, [EagerCodegen()])(*inputs())
    for g, w in zip(compiled(*inputs()), want):
        torch.testing.assert_close(g, w)


def test_without_a_compiler_it_declines_and_says_why(plugins, scalar_c, monkeypatch):
    monkeypatch.setenv("CC", "no-such-cc")
    text, _ = reductions.CASES["softmax"]
    reason = scalar_c.supports(_group(text), plugins.registry)
    assert reason == Reason("scalar_c", "no C compiler: 'no-such-cc' is not on PATH (set CC)")
