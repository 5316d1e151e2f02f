"""views.copy-to-alias: a copy that alias-to-copy made turns back into a view once the write
through it has gone out of place."""

from __future__ import annotations

from views_helpers import MUTATED_VIEW, assert_same_results

from torchloom.api import PassContext, clone_graph, parse_graph, verify
from torchloom.tools import load_plugins


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
