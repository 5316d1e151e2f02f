"""The core's shared-subgraph support that dedup.regions relies on: text form, verifier,
canonical hash, cloning, executor, kernel counting and per-subgraph pass runs."""

from __future__ import annotations

import types
from typing import ClassVar

import attrs
import pytest
import torch

from torchloom.api import (Graph, Pass, PassContext, PassResult, canonical_text, clone_graph,
                           errors, hookimpl, parse_graph, print_graph, structural_hash, verify)
from torchloom.tools import Compiler, build_function, count_kernels, load_plugins
from torchloom.runtime.executor import CompiledGraph

from dedup_helpers import CountingCodegen, write_pipeline

REGISTRY = load_plugins().registry

TWO_CALLS = """\
graph @main(%x: f32[4, 8], %w: f32[8]) {
  %a, %b = torchloom.call_subgraph(%x, %w) {callee = "layer"} : f32[4, 8], f32[4]
  %c, %d = torchloom.call_subgraph(%a, %w) {callee = "layer"} : f32[4, 8], f32[4]
  %e = aten.add.Tensor(%b, %d) : f32[4]
  return %c, %e
}
graph @layer(%p: f32[4, 8], %q: f32[8]) {
  %s = aten.mul.Tensor(%p, %q) : f32[4, 8]
  %t = torchloom.fusion_group(%s) : f32[4, 8] region @g0(%i: f32[4, 8]) {
    %u = aten.tanh.default(%i) : f32[4, 8]
    %v = aten.exp.default(%u) : f32[4, 8]
    return %v
  }
  %r = aten.sum.dim_IntList(%t) {dim = [-1]} : f32[4]
  return %t, %r
}
"""


def _eager(x, w):
    def layer(p, q):
        t = torch.exp(torch.tanh(p * q))
        return t, t.sum(-1)
    a, b = layer(x, w)
    c, d = layer(a, w)
    return c, b + d


def test_text_round_trip_and_verify():
    graph = parse_graph(TWO_CALLS)
    assert print_graph(graph) == TWO_CALLS
    assert list(graph.subgraphs) == ["layer"] and graph.subgraphs["layer"].parent is graph
    verify(graph, REGISTRY)
    assert print_graph(clone_graph(graph)[0]) == TWO_CALLS


def test_parser_rejects_a_subgraph_defined_twice():
    text = TWO_CALLS + TWO_CALLS[TWO_CALLS.index("graph @layer"):]
    with pytest.raises(errors.ParseError, match="defined twice"):
        parse_graph(text)


@pytest.mark.parametrize("edit, message", [
    (('callee = "layer"} : f32[4, 8], f32[4]\n  %c', 'callee = "nope"} : f32[4, 8], f32[4]\n  %c'),
     "callee 'nope' is not a subgraph"),
    (("%a, %b = torchloom.call_subgraph(%x, %w) {callee = \"layer\"} : f32[4, 8], f32[4]",
      "%a, %b = torchloom.call_subgraph(%x, %w) {callee = \"layer\"} : f32[4, 8], f64[4]"),
     "output 1 is f32"),
    (("%a, %b = torchloom.call_subgraph(%x, %w)", "%a, %b = torchloom.call_subgraph(%x)"),
     "@layer has 2 inputs, the call passes 1"),
    (("%s = aten.mul.Tensor(%p, %q) : f32[4, 8]",
      "%s = aten.mul.Tensor(%p, %q) : f32[4, 8]\n  %z, %y = torchloom.call_subgraph(%p, %q) "
      "{callee = \"layer\"} : f32[4, 8], f32[4]"), "recursively"),
])
def test_verifier_checks_calls(edit, message):
    graph = parse_graph(TWO_CALLS.replace(*edit))
    with pytest.raises(errors.VerifyError, match=message):
        verify(graph, REGISTRY)


def test_structural_hash_covers_subgraphs_but_not_their_names():
    base = parse_graph(TWO_CALLS)
    renamed = parse_graph(TWO_CALLS.replace("layer", "block").replace("%s", "%k"))
    changed = parse_graph(TWO_CALLS.replace("aten.exp.default", "aten.sigmoid.default"))
    assert structural_hash(base) == structural_hash(renamed)
    assert structural_hash(base) != structural_hash(changed)
    assert "aten.tanh.default" in canonical_text(base)


def test_clone_copies_subgraphs():
    graph = parse_graph(TWO_CALLS)
    copy = clone_graph(graph)[0]
    assert copy.subgraphs["layer"] is not graph.subgraphs["layer"]
    assert copy.subgraphs["layer"].parent is copy
    copy.subgraphs["layer"].name = "other"
    assert print_graph(graph) == TWO_CALLS


def test_executor_builds_each_subgraph_once_and_matches_eager():
    graph = parse_graph(TWO_CALLS)
    codegen = CountingCodegen()
    compiled = CompiledGraph(graph, REGISTRY, [codegen])
    x, w = torch.randn(4, 8), torch.randn(8)
    for actual, expected in zip(compiled(x, w), _eager(x, w)):
        torch.testing.assert_close(actual, expected)
    for actual, expected in zip(build_function(graph, REGISTRY).fn(x, w), _eager(x, w)):
        torch.testing.assert_close(actual, expected)
    assert list(compiled.subgraph_fns) == ["layer"]
    assert len(compiled.choices) == 1 and codegen.generated == 1
    # per call: the mul, the group and the sum; two calls, plus the add outside
    assert count_kernels(graph, REGISTRY) == 2 * 3 + 1


@attrs.frozen
class ReturnFirstInput(Pass):
    """Test pass: makes every shared subgraph also return its first input."""

    name: ClassVar[str] = "test.return-first-input"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        if graph.parent is None:
            return PassResult(False)
        graph.set_outputs([*graph.outputs, graph.inputs[0]])
        return PassResult(True)


@attrs.frozen
class BreakSubgraphThenRaise(Pass):
    name: ClassVar[str] = "test.break-then-raise"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        if graph.parent is not None:
            graph.set_outputs([])
            raise RuntimeError("boom")
        return PassResult(False)


def _compiler(tmp_path, passes):
    codegen = CountingCodegen()
    module = types.SimpleNamespace(torchloom_passes=hookimpl(
        lambda: [ReturnFirstInput, BreakSubgraphThenRaise]))
    plugins = load_plugins(extra=[("dedup-tests", _helpers(codegen), "t", "0"),
                                  ("core-tests", module, "t", "0")])
    return Compiler(write_pipeline(tmp_path / "p.toml", passes), plugins=plugins,
                    cache_dir=tmp_path / "cache"), codegen


def _helpers(codegen):
    from dedup_helpers import CountNodes
    return types.SimpleNamespace(torchloom_codegens=hookimpl(lambda: [codegen]),
                                 torchloom_passes=hookimpl(lambda: [CountNodes]))


def test_pass_manager_runs_each_pass_on_each_subgraph(tmp_path):
    comp, _ = _compiler(tmp_path, ["test.count-nodes"])
    result = comp.compile_graph(parse_graph(TWO_CALLS))
    (count,) = result.report.records
    assert count.stats == {"nodes": 3 + 3, "graphs": 2}
    x, w = torch.randn(4, 8), torch.randn(8)
    for actual, expected in zip(result.fn(x, w), _eager(x, w)):
        torch.testing.assert_close(actual, expected)


def test_pass_changing_a_subgraph_signature_fails_and_is_rolled_back(tmp_path):
    comp, _ = _compiler(tmp_path, ["test.return-first-input"])
    graph = parse_graph(TWO_CALLS)
    with pytest.raises(errors.PassError, match="signature .* of shared subgraph @layer"):
        comp.compile_graph(graph)
    assert print_graph(graph) == TWO_CALLS


def test_failing_pass_on_a_subgraph_is_rolled_back(tmp_path):
    comp, _ = _compiler(tmp_path, ["test.break-then-raise"])
    graph = parse_graph(TWO_CALLS)
    with pytest.raises(errors.PassError, match="test.break-then-raise"):
        comp.compile_graph(graph)
    assert print_graph(graph) == TWO_CALLS


VIEWED_OUTPUTS = """\
graph @main(%x: f32[4, 8], %w: f32[8, 8]) {
  %a, %b, %c = torchloom.call_subgraph(%x, %w) {callee = "layer"} : f32[4, 8], f32[4, 8], f32[4, 8]
  %d, %e, %f = torchloom.call_subgraph(%a, %w) {callee = "layer"} : f32[4, 8], f32[4, 8], f32[4, 8]
  %ta = aten.t.default(%d) : f32[8, 4] strided[1, 8]
  %tb = aten.t.default(%e) : f32[8, 4] strided[1, 8]
  %tc = aten.t.default(%f) : f32[8, 4] strided[1, 8]
  return %ta, %tb, %tc, %b
}
graph @layer(%p: f32[4, 8], %q: f32[8, 8]) {
  %m = aten.mm.default(%p, %q) : f32[4, 8]
  %s = aten.mul.Tensor(%m, %p) : f32[4, 8]
  return %m, %s, %p
}
"""


def _viewed_eager(x, w):
    def layer(p, q):
        m = p @ q
        return m, m * p, p
    a, b, _ = layer(x, w)
    d, e, f = layer(a, w)
    return d.t(), e.t(), f.t(), b


def test_a_subgraph_s_outputs_of_known_layout_are_viewed_without_view_ops():
    """A shared subgraph's plan says which outputs it returns laid out as their types (a
    matrix product's, here): the caller's views of those are one ``_restride`` each; of
    the others (an op's result, an input handed back) the view ops run."""
    graph = parse_graph(VIEWED_OUTPUTS)
    compiled = CompiledGraph(graph, REGISTRY, [CountingCodegen()])
    assert compiled.subgraph_fns["layer"].exact_outputs == {0}
    assert compiled.source.count("_restride(") == 1, compiled.source
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    for actual, expected in zip(compiled(x, w), _viewed_eager(x, w)):
        assert actual.shape == expected.shape and actual.stride() == expected.stride()
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
