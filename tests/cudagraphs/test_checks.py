"""Each static skip check of torchloom_cudagraphs.checks, on IR built with parse_graph.

The graphs carry CUDA types but nothing runs, so these tests need no GPU."""

from __future__ import annotations

import pytest
from torchloom.api import parse_graph
from torchloom.tools import load_plugins
from torchloom_cudagraphs.checks import (CHECKS, check_devices, check_dynamic_shapes,
                                         check_empty, check_host_sync, check_input_mutations,
                                         check_output_aliasing, check_scalar_inputs,
                                         input_aliases, skip_reasons)

CLEAN = """graph @g(%x: f32[4, 8] @cuda:0, %y: f32[8] @cuda:0) {
  %e, %r = torchloom.fusion_group(%x, %y) : f32[4, 8] @cuda:0, f32[4] @cuda:0 region @group0(%a: f32[4, 8] @cuda:0, %b: f32[8] @cuda:0) {
    %s = aten.add.Tensor(%a, %b) : f32[4, 8] @cuda:0
    %e = aten.exp.default(%s) : f32[4, 8] @cuda:0
    %r = aten.sum.dim_IntList(%e) {dim = [-1]} : f32[4] @cuda:0
    return %e, %r
  }
  %t = aten.t.default(%e) : f32[8, 4] strided[1, 8] @cuda:0
  %m = aten.mm.default(%t, %x) : f32[8, 8] @cuda:0
  %w = aten.add_.Tensor(%m, %y) : f32[8, 8] @cuda:0
  return %t, %w, %r
}"""


@pytest.fixture(scope="module")
def registry():
    return load_plugins().registry


def test_a_clean_graph_passes_every_check(registry):
    # a view of an intermediate as output and an in-place write to an intermediate are fine
    graph = parse_graph(CLEAN)
    assert skip_reasons(graph, registry) == []
    assert [check(graph, registry) for check in CHECKS] == [None] * len(CHECKS)


def test_empty_graph(registry):
    graph = parse_graph("graph @g(%x: f32[4] @cuda:0) {\n  return %x\n}")
    assert check_empty(graph, registry) == "the graph has no operations to record"


def test_scalar_input_is_frozen_by_a_recording(registry):
    graph = parse_graph("""graph @g(%x: f32[4] @cuda:0, %n: int) {
  %y = aten.add.Tensor(%x, %n) : f32[4] @cuda:0
  return %y
}""")
    assert check_scalar_inputs(graph, registry) == (
        "graph input %n is a Python int; a recording would freeze its value")
    assert check_scalar_inputs(parse_graph(CLEAN), registry) is None


def test_dynamic_shape_is_found_on_inputs_and_in_regions(registry):
    on_input = parse_graph("""graph @g(%x: f32[s0, 8] @cuda:0) {
  %y = aten.exp.default(%x) : f32[s0, 8] @cuda:0
  return %y
}""")
    assert check_dynamic_shapes(on_input, registry) == (
        "graph input %x has a dynamic shape ['s0', 8]")
    in_region = parse_graph("""graph @g(%x: f32[4] @cuda:0, %i: f32[s1] @cuda:0) {
  %y = torchloom.fusion_group(%x) : f32[4] @cuda:0 region @group0(%a: f32[4] @cuda:0) {
    %b = aten.exp.default(%a) : f32[4] @cuda:0
    return %b
  }
  return %y
}""")
    assert "graph input %i has a dynamic shape" in check_dynamic_shapes(in_region, registry)


def test_cpu_tensors_are_not_recorded(registry):
    cpu_input = parse_graph("""graph @g(%x: f32[4]) {
  %y = aten.exp.default(%x) : f32[4]
  return %y
}""")
    assert check_devices(cpu_input, registry) == (
        "graph input %x is on cpu; CUDA graphs record only CUDA work")
    cpu_inside = parse_graph("""graph @g(%x: f32[4] @cuda:0) {
  %c = aten._to_copy.default(%x) {device = #cpu} : f32[4]
  return %c
}""")
    assert check_devices(cpu_inside, registry) == (
        "%c (from aten._to_copy.default) is on cpu; CUDA graphs record only CUDA work")


def test_mixed_cuda_devices(registry):
    graph = parse_graph("""graph @g(%x: f32[4] @cuda:0, %y: f32[4] @cuda:1) {
  %z = aten._to_copy.default(%y) {device = #cuda:0} : f32[4] @cuda:0
  %s = aten.add.Tensor(%x, %z) : f32[4] @cuda:0
  return %s
}""")
    reason = check_devices(graph, registry)
    assert reason.startswith("the graph uses several devices: ")
    assert "cuda:0 (graph input %x)" in reason and "cuda:1 (graph input %y)" in reason


def test_input_mutation_directly_through_a_view_and_inside_a_region(registry):
    direct = parse_graph("""graph @g(%x: f32[4] @cuda:0, %u: f32[4] @cuda:0) {
  %c = aten.copy_.default(%x, %u) : f32[4] @cuda:0
  return %c
}""")
    assert check_input_mutations(direct, registry) == (
        "graph input %x is written in place by aten.copy_.default (%c)")
    through_view = parse_graph("""graph @g(%x: f32[4, 2] @cuda:0) {
  %v = aten.view.default(%x) {size = [8]} : f32[8] @cuda:0
  %w = aten.mul_.Scalar(%v) {other = 2.0} : f32[8] @cuda:0
  %e = aten.exp.default(%w) : f32[8] @cuda:0
  return %e
}""")
    assert check_input_mutations(through_view, registry) == (
        "graph input %x is written in place by aten.mul_.Scalar (%w)")
    in_region = parse_graph("""graph @g(%x: f32[4] @cuda:0, %y: f32[4] @cuda:0) {
  %r = torchloom.fusion_group(%y, %x) : f32[4] @cuda:0 region @group0(%a: f32[4] @cuda:0, %b: f32[4] @cuda:0) {
    %s = aten.add_.Tensor(%b, %a) : f32[4] @cuda:0
    %e = aten.exp.default(%s) : f32[4] @cuda:0
    return %e
  }
  return %r
}""")
    assert check_input_mutations(in_region, registry) == (
        "graph input %x is written in place by aten.add_.Tensor (%s)")


def test_writes_to_intermediates_are_not_input_mutations(registry):
    graph = parse_graph("""graph @g(%x: f32[4] @cuda:0) {
  %e = aten.exp.default(%x) : f32[4] @cuda:0
  %v = aten.view.default(%e) {size = [2, 2]} : f32[2, 2] @cuda:0
  %w = aten.relu_.default(%v) : f32[2, 2] @cuda:0
  return %w
}""")
    assert check_input_mutations(graph, registry) is None


@pytest.mark.parametrize("op, out_type, tag", [
    ("aten._local_scalar_dense.default", "float", ""),
    ("aten.item.default", "float", ""),
    ("aten.nonzero.default", "i64[3, 1] @cuda:0", ""),
    ("aten.unique_consecutive.default", "f32[3] @cuda:0", " (torch tag dynamic_output_shape)"),
])
def test_host_sync_ops(registry, op, out_type, tag):
    graph = parse_graph(f"""graph @g(%x: f32[4] @cuda:0) {{
  %e = aten.exp.default(%x) : f32[4] @cuda:0
  %s = {op}(%e) : {out_type}
  return %s
}}""")
    assert check_host_sync(graph, registry) == f"{op} (%s) synchronises with the host{tag}"


SHARED = """graph @g(%x: f32[4] @cuda:0, %y: f32[4] @cuda:0) {
  %r = torchloom.call_subgraph(%y, %x) {callee = "layer"} : f32[4] @cuda:0
  return %r
}
graph @layer(%a: f32[4] @cuda:0, %b: f32[4] @cuda:0) {
  %s = BODY
  %e = aten.exp.default(%s) : f32[4] @cuda:0
  return %e
}
"""


def test_host_sync_inside_a_region_and_a_shared_subgraph(registry):
    graph = parse_graph("""graph @g(%x: f32[4] @cuda:0) {
  %r = torchloom.fusion_group(%x) : f32[4] @cuda:0 region @group0(%a: f32[4] @cuda:0) {
    %n = aten.masked_select.default(%a, %a) : f32[2] @cuda:0
    %e = aten.exp.default(%a) : f32[4] @cuda:0
    return %e
  }
  return %r
}""")
    assert check_host_sync(graph, registry) == (
        "aten.masked_select.default (%n) synchronises with the host")
    shared = parse_graph(SHARED.replace("BODY", "aten.item.default(%a) : float\n  %f = "
                                                 "aten.add.Tensor(%a, %b) : f32[4] @cuda:0")
                         .replace("exp.default(%s)", "exp.default(%f)"))
    assert check_host_sync(shared, registry) == "aten.item.default (%s) synchronises with the host"


def test_input_mutation_inside_a_shared_subgraph(registry):
    writes = parse_graph(SHARED.replace("BODY", "aten.mul_.Tensor(%b, %a) : f32[4] @cuda:0"))
    assert check_input_mutations(writes, registry) == (
        "graph input %x is written in place by aten.mul_.Tensor (%s)")
    pure = parse_graph(SHARED.replace("BODY", "aten.mul.Tensor(%b, %a) : f32[4] @cuda:0"))
    assert skip_reasons(pure, registry) == []


def test_outputs_aliasing_inputs_are_mapped_not_skipped(registry):
    same = parse_graph("""graph @g(%x: f32[4] @cuda:0) {
  %e = aten.exp.default(%x) : f32[4] @cuda:0
  return %e, %x
}""")
    assert input_aliases(same, registry) == {1: (0, "")}
    assert check_output_aliasing(same, registry) is None
    view = parse_graph("""graph @g(%y: f32[8] @cuda:0, %x: f32[4, 2] @cuda:0) {
  %v = aten.view.default(%x) {size = [8]} : f32[8] @cuda:0
  %t = aten.unsqueeze.default(%v) {dim = 0} : f32[1, 8] @cuda:0
  %s = aten.add.Tensor(%v, %y) : f32[8] @cuda:0
  return %s, %t, %v
}""")
    assert input_aliases(view, registry) == {
        1: (1, "aten.view.default -> aten.unsqueeze.default"), 2: (1, "aten.view.default")}
    assert check_output_aliasing(view, registry) is None  # two views of one input is fine
    region = parse_graph("""graph @g(%x: f32[4, 2] @cuda:0) {
  %r, %e = torchloom.fusion_group(%x) : f32[8] @cuda:0, f32[4, 2] @cuda:0 region @group0(%a: f32[4, 2] @cuda:0) {
    %v = aten.view.default(%a) {size = [8]} : f32[8] @cuda:0
    %e = aten.exp.default(%a) : f32[4, 2] @cuda:0
    return %v, %e
  }
  return %e, %r
}""")
    assert input_aliases(region, registry) == {1: (0, "aten.view.default")}


def test_outputs_sharing_memory_need_an_owner_among_them(registry):
    # a training forward returns %t and detach(%t): fine, the copy of %t is shared
    owned = parse_graph("""graph @g(%x: f32[4, 2] @cuda:0) {
  %e = aten.tanh.default(%x) : f32[4, 2] @cuda:0
  %d = aten.detach.default(%e) : f32[4, 2] @cuda:0
  %v = aten.view.default(%e) {size = [8]} : f32[8] @cuda:0
  return %e, %d, %v
}""")
    assert check_output_aliasing(owned, registry) is None
    unowned = parse_graph("""graph @g(%x: f32[4, 2] @cuda:0) {
  %e = aten.exp.default(%x) : f32[4, 2] @cuda:0
  %v = aten.view.default(%e) {size = [8]} : f32[8] @cuda:0
  %t = aten.t.default(%e) : f32[2, 4] strided[1, 2] @cuda:0
  return %v, %t
}""")
    assert check_output_aliasing(unowned, registry) == (
        "outputs 0, 1 share the memory of %e, which is not itself an output")
    strided_owner = parse_graph("""graph @g(%x: f32[4, 2] @cuda:0) {
  %e, %r = torchloom.fusion_group(%x) : f32[2, 4] strided[1, 2] @cuda:0, f32[4] @cuda:0 region @group0(%a: f32[4, 2] @cuda:0) {
    %b = aten.exp.default(%a) : f32[4, 2] @cuda:0
    %c = aten.t.default(%b) : f32[2, 4] strided[1, 2] @cuda:0
    %s = aten.sum.dim_IntList(%b) {dim = [-1]} : f32[4] @cuda:0
    return %c, %s
  }
  %t = aten.t.default(%e) : f32[4, 2] @cuda:0
  return %t, %e, %r
}""")
    assert check_output_aliasing(strided_owner, registry) == (
        "outputs 0, 1 share the memory of output 1 (%e), which is not contiguous")


def test_skip_reasons_lists_every_failing_check_in_order(registry):
    graph = parse_graph("""graph @g(%x: f32[4]) {
  %i = aten.item.default(%x) : float
  %w = aten.add_.Tensor(%x, %x) : f32[4]
  return %w
}""")
    reasons = skip_reasons(graph, registry)
    assert [r.split(" ")[0] for r in reasons] == ["graph", "graph", "aten.item.default"]
    assert reasons[0] == "graph input %x is on cpu; CUDA graphs record only CUDA work"
    assert reasons[1] == "graph input %x is written in place by aten.add_.Tensor (%w)"
