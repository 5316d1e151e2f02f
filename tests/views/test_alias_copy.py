"""views.alias-to-copy / views.copy-to-alias: mutation-safe handling of aliasing views."""

from __future__ import annotations

from views_helpers import assert_same_results, run_pass

from torchloom.api import PassContext, clone_graph, parse_graph, verify
from torchloom.tools import load_plugins

MUTATED_VIEW = """graph @m(%x: f32[4, 6], %s: f32[24]) {
  %t = aten.exp.default(%x) : f32[4, 6]
  %v = aten.view.default(%t) {size = [24]} : f32[24]
  %w = aten.mul_.Tensor(%v, %s) : f32[24]
  %n = aten.neg.default(%w) : f32[24]
  return %n
}
"""


def test_mutated_view_of_private_base_becomes_a_copy():
    before, after, _, result, plugins = run_pass("views.alias-to-copy", MUTATED_VIEW)
    assert result.stats["copies"] == 1
    assert [n.op for n in after.nodes][1] == "aten.view_copy.default"
    assert_same_results(before, after, plugins)


def test_view_whose_base_is_read_again_stays_a_view():
    text = MUTATED_VIEW.replace("%n = aten.neg.default(%w) : f32[24]\n  return %n",
                                "%n = aten.neg.default(%t) : f32[4, 6]\n  return %n")
    before, after, _, result, plugins = run_pass("views.alias-to-copy", text)
    assert not result.changed  # neg reads %t after the write through %v: it must see it
    assert_same_results(before, after, plugins)


def test_view_of_graph_input_stays_a_view():
    text = """graph @i(%x: f32[24], %s: f32[4, 6]) {
  %v = aten.view.default(%x) {size = [4, 6]} : f32[4, 6]
  %w = aten.mul_.Tensor(%v, %s) : f32[4, 6]
  return %w
}
"""
    _, after, _, result, _ = run_pass("views.alias-to-copy", text)
    assert not result.changed  # the caller sees writes to its input


def test_copy_reverts_to_a_view_once_the_write_is_gone():
    plugins = load_plugins()
    graph = parse_graph(MUTATED_VIEW)
    ctx = PassContext(registry=plugins.registry)
    plugins.pass_class("views.alias-to-copy")().run(graph, ctx)
    # still written in place: copy-to-alias must keep the copy
    assert not plugins.pass_class("views.copy-to-alias")().run(graph, ctx).changed
    # make the write out-of-place (what fusion.functionalize does), then revert
    mul = next(n for n in graph.nodes if n.op == "aten.mul_.Tensor")
    out = graph.create("aten.mul.Tensor", list(mul.inputs), [mul.output.type], {},
                       names=["w2"], before=mul)
    graph.replace_all_uses(mul.output, out.output)
    graph.erase(mul)
    before, _ = clone_graph(graph)
    result = plugins.pass_class("views.copy-to-alias")().run(graph, ctx)
    verify(graph, plugins.registry)
    assert result.stats["reverted"] == 1
    assert [n.op for n in graph.nodes][1] == "aten.view.default"
    assert_same_results(before, graph, plugins)
