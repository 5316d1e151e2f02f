"""runtime/static.py: kernels described without running them (explain's kernel_details):
op-by-op traffic of groups without a plan, ops outside groups, shared subgraphs once per
call, a graph's compulsory bytes; and a compile for a target no codegen knows."""

from __future__ import annotations

import pytest

from torchloom.api import KernelSource, parse_graph
from torchloom.tools import EagerCodegen, load_plugins
from torchloom.runtime.static import (StaticPlan, describe_kernels, graph_compulsory,
                                      retarget, target_codegens, tensor_bytes)

GRAPH = """
graph @g(%x: f32[16, 8], %w: f32[8]) {
  %v = aten.view.default(%x) {size = [128]} : f32[128]
  %y, %z = torchloom.fusion_group(%x, %w) : f32[16, 8], f32[16, 1] region @group0(%a: f32[16, 8], %b: f32[8]) {
    %m = aten.mul.Tensor(%a, %b) : f32[16, 8]
    %t = aten.t.default(%m) : f32[8, 16]
    %e = aten.exp.default(%m) : f32[16, 8]
    %s = aten.sum.dim_IntList(%e) {dim = [1], keepdim = true} : f32[16, 1]
    return %e, %s
  }
  %c = aten.clone.default(%y) : f32[16, 8]
  return %c, %z, %v
}
"""


@pytest.fixture(scope="module")
def registry():
    return load_plugins().registry


def test_groups_without_a_plan_are_counted_op_by_op(registry):
    graph = parse_graph(GRAPH)
    group = next(n for n in graph.nodes if n.region is not None)
    sources = {group: EagerCodegen().generate(group, registry)}
    kernels = describe_kernels(graph, registry, sources)
    assert [(k.name, k.codegen) for k in kernels] == [("group0", "eager"),
                                                      ("aten.clone.default", "aten")]
    full, row, weight = 16 * 8 * 4, 16 * 4, 8 * 4
    fused, clone = kernels
    # mul reads a and b and writes m; exp reads m, writes e; sum reads e, writes s; t is free
    assert fused.bytes_read == (full + weight) + full + full
    assert fused.bytes_written == full + full + row
    assert fused.bytes_compulsory == full + weight + full + row
    assert fused.grid == [] and fused.registers is None and fused.spills is None
    assert (clone.bytes_read, clone.bytes_written, clone.bytes_compulsory) == (full, full,
                                                                               2 * full)
    # inputs once; outputs c and z once; v views the input x: no bytes
    assert graph_compulsory(graph, registry) == full + weight + full + row


def test_a_plan_in_the_metadata_is_taken_as_it_is(registry):
    graph = parse_graph(GRAPH)
    group = next(n for n in graph.nodes if n.region is not None)
    plan = KernelSource("mine", "", {"kernel": "k", "grid": [3, 2], "bytes_read": 11,
                                     "bytes_written": 7})
    fused = describe_kernels(graph, registry, {group: plan})[0]
    assert (fused.name, fused.grid, fused.bytes_read, fused.bytes_written) == ("k", [3, 2],
                                                                               11, 7)


def test_expanded_tensors_count_what_is_stored(registry):
    graph = parse_graph("graph @g(%x: f32[4, 8] strided[0, 1]) {\n  return %x\n}\n")
    assert tensor_bytes(graph.inputs[0]) == 8 * 4


class _Remembers:
    """A codegen that plans every group and builds it for any ``sm_`` target."""

    name = "fake"
    version = "1"

    def __init__(self, target=None):
        self.target, self.builds = target, []

    def for_target(self, target):
        return _Remembers(target) if target.startswith("sm_") else None

    def supports(self, group, registry):
        return None

    def generate(self, group, registry):
        return KernelSource(self.name, group.region.name, {"kernel": "k", "grid": [1],
                                                           "bytes_read": 1,
                                                           "bytes_written": 1})

    def compile_for_target(self, kernel):
        self.builds.append(kernel.source)
        return {"registers": 40, "spills": 0}


def test_static_plan_builds_each_distinct_kernel_once_for_the_target(registry):
    graph = parse_graph(GRAPH)
    retarget(graph, "cuda")
    assert {v.type.device for v in graph.inputs} == {"cuda"}
    chain, declined = target_codegens([_Remembers(), EagerCodegen()], "sm_90")
    assert declined == [] and chain[0].target == "sm_90"
    memo: dict = {}
    plan = StaticPlan(graph, registry, chain, "sm_90", memo)
    StaticPlan(parse_graph(GRAPH), registry, chain, "sm_90", memo)  # same kernel: no build
    assert chain[0].builds == ["group0"]
    [fused, _] = plan.kernels(registry)
    assert (fused.registers, fused.spills, fused.codegen) == (40, 0, "fake")
    assert [c.codegen for c in plan.choices] == ["fake"]


def test_a_codegen_that_does_not_know_the_target_is_left_out(registry):
    chain, declined = target_codegens([_Remembers(), EagerCodegen()], "gfx90a")
    assert [c.name for c in chain] == ["eager"]
    assert "does not generate for target 'gfx90a'" in str(declined[0])


GATHERS = """
graph @g(%w: f32[1000, 8], %i: i64[4, 5], %b: f32[8], %v: f32[6, 8], %j: i64[3]) {
  %y = torchloom.fusion_group(%w, %i, %b) : f32[4, 5, 8] region @group0(%t: f32[1000, 8], %k: i64[4, 5], %c: f32[8]) {
    %e = aten.embedding.default(%t, %k) : f32[4, 5, 8]
    %s = aten.add.Tensor(%e, %c) : f32[4, 5, 8]
    return %s
  }
  %z = aten.embedding.default(%v, %j) : f32[3, 8]
  %m = aten.mul.Tensor(%v, %v) : f32[6, 8]
  return %y, %z, %m
}
"""


def test_a_table_only_gathers_read_counts_the_rows_they_make(registry):
    """An embedding's table moves the rows its indices name (at most the table): the
    group's 20 rows of 1,000; the plain op's table is read whole by another op too."""
    graph = parse_graph(GATHERS)
    group = next(n for n in graph.nodes if n.region is not None)
    f32, i64 = 4, 8
    rows, ids, bias = 20 * 8 * f32, 20 * i64, 8 * f32
    fused = describe_kernels(graph, registry, {group: EagerCodegen().generate(
        group, registry)})[0]
    assert fused.bytes_compulsory == rows + ids + bias + rows
    table, gathered = 6 * 8 * f32, 3 * i64
    assert graph_compulsory(graph, registry) == (rows + ids + bias + table + gathered
                                                 + rows + 3 * 8 * f32 + table)
    small = parse_graph(GATHERS.replace("f32[1000, 8]", "f32[2, 8]"))
    whole = 2 * 8 * f32  # fewer rows than gathered: the table, once
    assert graph_compulsory(small, registry) == (whole + ids + bias + table + gathered
                                                 + rows + 3 * 8 * f32 + table)
