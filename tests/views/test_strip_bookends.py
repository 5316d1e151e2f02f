"""views.strip-bookends: hoisting input views, sinking output views, keeping copies."""

from __future__ import annotations

import pytest
from views_helpers import assert_same_results, run_pass

from torchloom.api import FUSION_GROUP
from torchloom.tools import count_kernels

GELU_BOOKENDS = """graph @gelu(%x: f32[8, 12]) {
  %y = torchloom.fusion_group(%x) : f32[8, 12] region @group0(%a: f32[8, 12]) {
    %v = aten.view.default(%a) {size = [2, 4, 12]} : f32[2, 4, 12]
    %g = aten.gelu.default(%v) : f32[2, 4, 12]
    %w = aten.view.default(%g) {size = [8, 12]} : f32[8, 12]
    return %w
  }
  return %y
}
"""


def _group(graph):
    groups = [n for n in graph.nodes if n.op == FUSION_GROUP]
    assert len(groups) == 1
    return groups[0]


def test_gelu_bookend_views_move_out_of_the_group():
    before, after, _, result, plugins = run_pass("views.strip-bookends", GELU_BOOKENDS)
    assert result.changed and result.stats["hoisted"] == 1 and result.stats["sunk"] == 1
    region_ops = [n.op for n in _group(after).region.nodes]
    assert region_ops == ["aten.gelu.default"]
    outside = [n.op for n in after.nodes]
    assert outside == ["aten.view.default", FUSION_GROUP, "aten.view.default"]
    assert count_kernels(after, plugins.registry) == 1
    assert_same_results(before, after, plugins)


def test_transpose_bookends_are_hoisted_as_strided_inputs():
    text = """graph @t(%x: f32[6, 10]) {
  %y = torchloom.fusion_group(%x) : f32[10, 6] region @group0(%a: f32[6, 10]) {
    %t = aten.t.default(%a) : f32[10, 6] strided[1, 10]
    %e = aten.exp.default(%t) : f32[10, 6]
    return %e
  }
  return %y
}
"""
    before, after, _, result, plugins = run_pass("views.strip-bookends", text)
    group = _group(after)
    assert [n.op for n in group.region.nodes] == ["aten.exp.default"]
    assert group.inputs[0].producer.op == "aten.t.default"
    assert group.region.inputs[0].type.strides == (1, 10)
    assert_same_results(before, after, plugins)


def test_a_view_of_an_input_the_group_also_reads_stays_in_it():
    """The kernel reads ``%a`` for ``exp`` anyway: its transpose stays index math instead
    of a view op per call and a second tensor argument."""
    text = """graph @g(%x: f32[4, 6]) {
  %y = torchloom.fusion_group(%x) : f32[6, 4] region @group0(%a: f32[4, 6]) {
    %e = aten.exp.default(%a) : f32[4, 6]
    %t = aten.t.default(%a) : f32[6, 4] strided[1, 6]
    %s = aten.add.Tensor(%t, %t) : f32[6, 4]
    %u = aten.t.default(%e) : f32[6, 4] strided[1, 6]
    %z = aten.mul.Tensor(%s, %u) : f32[6, 4]
    return %z
  }
  return %y
}
"""
    before, after, _, result, plugins = run_pass("views.strip-bookends", text)
    group = _group(after)
    assert len(group.inputs) == 1 and result.stats["hoisted"] == 0
    assert [n.op for n in group.region.nodes].count("aten.t.default") == 2
    assert_same_results(before, after, plugins)


def test_reshape_that_needs_a_copy_stays_in_the_kernel_with_a_note():
    text = """graph @r(%x: f32[4, 6] strided[1, 4]) {
  %y = torchloom.fusion_group(%x) : f32[24] region @group0(%a: f32[4, 6] strided[1, 4]) {
    %v = aten.reshape.default(%a) {shape = [24]} : f32[24]
    %e = aten.exp.default(%v) : f32[24]
    return %e
  }
  return %y
}
"""
    before, after, ctx, result, plugins = run_pass("views.strip-bookends", text)
    assert result.stats["kept_copies"] == 1 and result.stats["hoisted"] == 0
    assert [n.op for n in _group(after).region.nodes] == ["aten.reshape.default",
                                                         "aten.exp.default"]
    assert any("kept in the kernel" in note and "192 bytes" in note for note in ctx.notes)
    assert_same_results(before, after, plugins)


@pytest.mark.parametrize("text, view", [
    ("""graph @v(%x: f32[4, 6]) {
  %y = torchloom.fusion_group(%x) : f32[6, 4] region @group0(%a: f32[4, 6]) {
    %t = aten.t.default(%a) : f32[6, 4] strided[1, 6]
    return %t
  }
  return %y
}
""", "aten.t.default"),
    ("""graph @v(%x: f32[4, 6]) {
  %y = torchloom.fusion_group(%x) : f32[4, 1, 6] region @group0(%a: f32[4, 6]) {
    %u = aten.unsqueeze.default(%a) {dim = 1} : f32[4, 1, 6]
    return %u
  }
  return %y
}
""", "aten.unsqueeze.default"),  # (unit dims only: kept in a group that computes)
])
def test_group_of_only_views_disappears(text, view):
    before, after, _, result, plugins = run_pass("views.strip-bookends", text)
    assert result.stats["groups_removed"] == 1
    assert [n.op for n in after.nodes] == [view]
    assert count_kernels(after, plugins.registry) == 0
    assert_same_results(before, after, plugins)


def test_output_view_also_read_inside_the_group_is_kept_for_that_reader():
    text = """graph @o(%x: f32[4, 6]) {
  %y, %z = torchloom.fusion_group(%x) : f32[24], f32[24] region @group0(%a: f32[4, 6]) {
    %e = aten.exp.default(%a) : f32[4, 6]
    %v = aten.view.default(%e) {size = [24]} : f32[24]
    %n = aten.neg.default(%v) : f32[24]
    return %v, %n
  }
  return %y, %z
}
"""
    before, after, _, result, plugins = run_pass("views.strip-bookends", text)
    assert result.stats["sunk"] == 1
    assert after.outputs[0].producer.op == "aten.view.default"
    assert_same_results(before, after, plugins)


def test_no_groups_no_change():
    text = """graph @n(%x: f32[4]) {
  %e = aten.exp.default(%x) : f32[4]
  return %e
}
"""
    _, after, _, result, _ = run_pass("views.strip-bookends", text)
    assert not result.changed


def _symbolic_gelu(input_type: str) -> str:
    return f"""graph @g(%x: {input_type}) {{
  %y = torchloom.fusion_group(%x) : f32["8*s0"] region @group0(%a: {input_type}) {{
    %v = aten.view.default(%a) {{size = [-1]}} : f32["8*s0"]
    %g = aten.gelu.default(%v) : f32["8*s0"]
    return %g
  }}
  return %y
}}
"""


def test_reshapes_of_contiguous_inputs_with_symbolic_sizes_are_hoisted():
    import torch

    from torchloom.runtime.executor import CompiledGraph
    before, after, _, result, plugins = run_pass("views.strip-bookends",
                                                 _symbolic_gelu("f32[s0, 8]"))
    assert result.stats["hoisted"] == 1
    assert [n.op for n in after.nodes] == ["aten.view.default", FUSION_GROUP]
    chain = plugins.codegen_chain("eager")
    for rows in (1, 3, 6):
        x = torch.randn(rows, 8)
        want, = CompiledGraph(before, plugins.registry, chain)(x)
        got, = CompiledGraph(after, plugins.registry, chain)(x)
        torch.testing.assert_close(got, want)


def test_reshapes_of_strided_inputs_with_symbolic_sizes_stay_in_the_kernel():
    _, after, _, result, _ = run_pass("views.strip-bookends",
                                      _symbolic_gelu("f32[s0, 8] strided[1, s0]"))
    assert result.stats["hoisted"] == 0
    assert [n.op for n in after.nodes] == [FUSION_GROUP]


NORM_WEIGHT = """graph @bn(%x: f32[2, 3, 4, 5], %w: f32[3], %b: f32[1, 3, 1]) {
  %y = torchloom.fusion_group(%x, %w, %b) : f32[2, 3, 4, 5] region @group0(%a: f32[2, 3, 4, 5], %p: f32[3], %q: f32[1, 3, 1]) {
    %u = aten.unsqueeze.default(%p) {dim = -1} : f32[3, 1]
    %v = aten.unsqueeze.default(%u) {dim = -1} : f32[3, 1, 1]
    %m = aten.mul.Tensor(%a, %v) : f32[2, 3, 4, 5]
    %s = aten.squeeze.dim(%q) {dim = 0} : f32[3, 1]
    %r = aten.view.default(%s) {size = [3, 1, 1]} : f32[3, 1, 1]
    %o = aten.add.Tensor(%m, %r) : f32[2, 3, 4, 5]
    return %o
  }
  return %y
}
"""


def test_views_adding_or_removing_unit_dims_stay_in_a_group_that_computes():
    """A batch norm's weight made ``[C, 1, 1]`` (unsqueezes, a squeeze, a view adding a
    dim of size 1) is read at the same places with the same strides inside the kernel:
    no index math there, one call per run outside. Nothing is hoisted."""
    before, after, _, result, plugins = run_pass("views.strip-bookends", NORM_WEIGHT)
    assert not result.changed and result.stats["hoisted"] == 0
    group = _group(after)
    assert [n.op for n in after.nodes] == [FUSION_GROUP]
    assert [v.type.shape for v in group.inputs] == [(2, 3, 4, 5), (3,), (1, 3, 1)]
    assert_same_results(before, after, plugins)


def test_a_view_moving_elements_is_still_hoisted_beside_unit_dim_ones():
    text = NORM_WEIGHT.replace("%q: f32[1, 3, 1]", "%q: f32[3]").replace(
        "%b: f32[1, 3, 1]", "%b: f32[3]").replace(
        "%s = aten.squeeze.dim(%q) {dim = 0} : f32[3, 1]",
        "%s = aten.view.default(%q) {size = [3, 1]} : f32[3, 1]")
    before, after, _, result, plugins = run_pass("views.strip-bookends", text)
    assert not result.changed  # [3] -> [3, 1] -> [3, 1, 1]: unit dims only, kept
    moved = """graph @bn(%x: f32[2, 3, 4, 5], %b: f32[6]) {
  %y = torchloom.fusion_group(%x, %b) : f32[2, 3, 4, 5] region @group0(%a: f32[2, 3, 4, 5], %q: f32[6]) {
    %s = aten.view.default(%q) {size = [3, 2]} : f32[3, 2]
    %c = aten.slice.Tensor(%s) {dim = 1, start = 0, end = 1} : f32[3, 1] strided[2, 1]
    %r = aten.unsqueeze.default(%c) {dim = -1} : f32[3, 1, 1] strided[2, 1, 1]
    %o = aten.add.Tensor(%a, %r) : f32[2, 3, 4, 5]
    return %o
  }
  return %y
}
"""
    before, after, _, result, plugins = run_pass("views.strip-bookends", moved)
    assert result.stats["hoisted"] == 2  # [6] -> [3, 2], then its slice: elements move
    assert [n.op for n in after.nodes] == ["aten.view.default", "aten.slice.Tensor",
                                           FUSION_GROUP]
    assert [n.op for n in _group(after).region.nodes] == ["aten.unsqueeze.default",
                                                          "aten.add.Tensor"]
    assert_same_results(before, after, plugins)
