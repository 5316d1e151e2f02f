"""views.collapse: view chains fold into one view."""

from __future__ import annotations

from views_helpers import assert_same_results, run_pass


def _ops(graph):
    return [n.op for n in graph.nodes]


def test_view_of_view_becomes_one_view():
    text = """graph @c(%x: f32[4, 6]) {
  %a = aten.view.default(%x) {size = [2, 12]} : f32[2, 12]
  %b = aten.view.default(%a) {size = [24]} : f32[24]
  %e = aten.exp.default(%b) : f32[24]
  return %e
}
"""
    before, after, _, result, plugins = run_pass("views.collapse", text)
    assert result.changed and _ops(after) == ["aten.view.default", "aten.exp.default"]
    assert next(after.nodes).inputs[0] is after.inputs[0]
    assert_same_results(before, after, plugins)


def test_permute_of_permute_composes():
    text = """graph @p(%x: f32[2, 3, 4]) {
  %a = aten.permute.default(%x) {dims = [2, 0, 1]} : f32[4, 2, 3] strided[1, 12, 4]
  %b = aten.transpose.int(%a) {dim0 = 0, dim1 = 2} : f32[3, 2, 4] strided[4, 12, 1]
  %e = aten.exp.default(%b) : f32[3, 2, 4]
  return %e
}
"""
    before, after, _, result, plugins = run_pass("views.collapse", text)
    assert _ops(after) == ["aten.permute.default", "aten.exp.default"]
    assert next(after.nodes).attrs["dims"] == (1, 0, 2)
    assert_same_results(before, after, plugins)


def test_transpose_twice_is_the_identity():
    text = """graph @t(%x: f32[3, 5]) {
  %a = aten.t.default(%x) : f32[5, 3] strided[1, 5]
  %b = aten.t.default(%a) : f32[3, 5]
  %e = aten.exp.default(%b) : f32[3, 5]
  return %e
}
"""
    before, after, _, result, plugins = run_pass("views.collapse", text)
    assert _ops(after) == ["aten.exp.default"]
    assert_same_results(before, after, plugins)


def test_shared_intermediate_view_is_kept():
    text = """graph @s(%x: f32[4, 6]) {
  %a = aten.view.default(%x) {size = [2, 12]} : f32[2, 12]
  %b = aten.view.default(%a) {size = [24]} : f32[24]
  %n = aten.neg.default(%a) : f32[2, 12]
  return %b, %n
}
"""
    before, after, _, result, plugins = run_pass("views.collapse", text)
    assert _ops(after).count("aten.view.default") == 2
    assert all(n.inputs[0] is after.inputs[0] for n in after.nodes if n.op.endswith("view.default"))
    assert_same_results(before, after, plugins)


def test_views_inside_a_group_collapse():
    text = """graph @g(%x: f32[4, 6]) {
  %y = torchloom.fusion_group(%x) : f32[24] region @group0(%a: f32[4, 6]) {
    %e = aten.exp.default(%a) : f32[4, 6]
    %v = aten.view.default(%e) {size = [2, 12]} : f32[2, 12]
    %w = aten.view.default(%v) {size = [24]} : f32[24]
    %n = aten.neg.default(%w) : f32[24]
    return %n
  }
  return %y
}
"""
    before, after, _, result, plugins = run_pass("views.collapse", text)
    group = next(after.nodes)
    assert [n.op for n in group.region.nodes].count("aten.view.default") == 1
    assert_same_results(before, after, plugins)
