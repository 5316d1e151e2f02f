"""The kernel schedule's reduction nest (codegen/schedule.py): computed once for a group's
reductions, the same data both native codegens render."""

from __future__ import annotations

import pytest
from torchloom.api import parse_graph, schedule
from torchloom.codegen.indexing import Unsupported


def _reductions(body: str, params: str):
    g = parse_graph(f"graph @g({params}) {{\n{body}\n}}")
    return [n for n in g.nodes if n.op.split(".")[1] in ("sum", "amax")]


def test_a_row_reduction_and_a_column_reduction():
    row = schedule.ReductionNest((8, 512), (1,))
    assert (row.kept, row.kept_shape, row.red_shape) == ([0], [8], [512])
    assert (row.rows, row.rnumel, row.numel, row.columns) == (8, 512, 4096, False)
    col = schedule.ReductionNest((512, 1024), (0,))
    assert (col.rows, col.rnumel, col.columns) == (1024, 512, True)
    every = schedule.ReductionNest((3, 4, 5), (0, 1, 2))
    assert (every.kept, every.rows, every.rnumel, every.columns) == ([], 1, 60, False)


def test_of_reads_the_nodes_and_refuses_different_dims():
    nodes = _reductions("""
  %s = aten.sum.dim_IntList(%x) {dim = [-1], keepdim = true} : f32[s0, 16]
  %m = aten.amax.default(%x) {dim = [1]} : f32[s0]
  return %s, %m""", "%x: f32[s0, 16]")
    nest = schedule.ReductionNest.of(nodes, lambda v: v.type)
    assert nest.rdims == (1,) and nest.rows == "s0" and nest.rnumel == 16
    other = _reductions("""
  %s = aten.sum.dim_IntList(%x) {dim = [0]} : f32[16]
  %m = aten.amax.default(%x) {dim = [1]} : f32[s0]
  return %s, %m""", "%x: f32[s0, 16]")
    with pytest.raises(Unsupported, match="reductions over different shapes or dims"):
        schedule.ReductionNest.of(other, lambda v: v.type)
