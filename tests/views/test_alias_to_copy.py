"""views.alias-to-copy: a view whose base is written in place becomes a copy when no one else
reads the base (mutation-safe handling of aliasing views)."""

from __future__ import annotations

from views_helpers import MUTATED_VIEW, assert_same_results, run_pass


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
