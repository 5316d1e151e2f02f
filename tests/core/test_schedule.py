"""The kernel schedule's reduction nest (codegen/schedule.py): computed once for a group's
reductions, the same data both native codegens render."""

from __future__ import annotations

import pytest
from torchloom.api import Schedule, Walk, expr, indexing, parse_graph, schedule, walk_nest
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


def test_coordinates_place_the_kept_and_reduced_names():
    nest = schedule.ReductionNest((2, 3, 4), (1,))
    full, row, keepdim = nest.coordinates(["x0", "x1"], ["r"])
    x0, x1, r = expr.Name("x0"), expr.Name("x1"), expr.Name("r")
    assert full == (x0, r, x1) and row == (x0, x1) and keepdim == (x0, indexing.ZERO, x1)


def test_a_nest_that_reduces_nothing_is_no_column_reduction():
    # (a pointwise writer's nest: its kept dims end innermost, yet it has no columns)
    assert schedule.ReductionNest((4, 8), ()).columns is False
    assert schedule.ReductionNest((4, 8), ()).rnumel == 1


def test_nest_classes_group_by_shape_and_dims_in_program_order():
    nodes = _reductions("""
  %a = aten.sum.dim_IntList(%x) {dim = [1]} : f32[8]
  %b = aten.sum.dim_IntList(%x) {dim = [0]} : f32[16]
  %c = aten.amax.default(%x) {dim = [-1]} : f32[8]
  return %a, %b, %c""", "%x: f32[8, 16]")
    classes = schedule.nest_classes(nodes, lambda v: v.type.shape)
    assert [[n.outputs[0].name for n in c] for c in classes] == [["a", "c"], ["b"]]


def test_elementwise_numel_names_the_shapes_it_was_shown():
    assert schedule.elementwise_numel([(4, 8), (32,)]) == 32
    assert schedule.elementwise_numel([("s0", 8)]) == "8*s0"
    with pytest.raises(Unsupported, match=r"different element counts \[4, 8\] and \['s1'\]"):
        schedule.elementwise_numel([(4, 8), ("a0",)], [(4, 8), ("s1",)])


def test_planned_nest_reads_the_writers_nest():
    class Writer(schedule.PlannedNest):
        def __init__(self, nest):
            self.reduction_nest = nest

    w = Writer(schedule.ReductionNest((8, 512), (1,)))
    assert (w.shape, w.rdims, w.kept, w.kept_shape, w.red_shape, w.rnumel) == (
        (8, 512), (1,), [0], [8], [512], 512)
    assert Writer.reduction_nest.shape == ()  # a pointwise writer's default


def test_capabilities_match_device_types_and_decline_whole_groups():
    from torchloom.api import Capabilities
    from torchloom.testing.reductions import group_text

    caps = Capabilities(forms=frozenset({"pointwise"}), dtypes=frozenset({"f32"}),
                        ops=frozenset({"aten.exp.default"}), devices=frozenset({"cuda"}))
    exp = group_text("%a: f32[4, 8] @cuda:1", "%e = aten.exp.default(%a) : f32[4, 8] @cuda:1",
                     "%e: f32[4, 8] @cuda:1")
    assert caps.declines(next(parse_graph(exp).nodes)) is None  # cuda covers cuda:1
    on_cpu = exp.replace(" @cuda:1", "")
    assert caps.declines(next(parse_graph(on_cpu).nodes)) == "renders no device cpu"
    assert str(caps.reason("gpu_c", next(parse_graph(on_cpu).nodes))) == (
        "gpu_c: renders no device cpu")
    total = group_text("%a: f32[4, 8] @cuda:1", """
        %s = aten.sum.dim_IntList(%a) {dim = [1]} : f32[4] @cuda:1""", "%s: f32[4] @cuda:1")
    assert caps.declines(next(parse_graph(total).nodes)) == (
        "renders pointwise kernels; this group is a row_reduction (reduces dims [1] of [4, 8])")


def test_rows_and_columns_of_one_shape_are_planned_once():
    nodes = _reductions("""
  %c = aten.sum.dim_IntList(%x) {dim = [0]} : f32[64]
  %s = aten.sum.dim_IntList(%x) {dim = [1], keepdim = true} : f32[8, 1]
  %m = aten.amax.default(%x) {dim = [-1], keepdim = true} : f32[8, 1]
  return %c, %s, %m""", "%x: f32[8, 64]")
    plan = schedule.RowsAndColumns.of(nodes, lambda v: v.type.shape)
    c, s, m = nodes
    assert plan.rows == (s, m) and plan.columns == (c,) and plan.shape == (8, 64)
    assert plan.row_nest.rdims == (1,) and plan.column_nest.rdims == (0,) and plan.trailing
    # the rows need not be innermost as a run (triton takes them); cpu asks ``trailing``
    spread = _reductions("""
  %r = aten.sum.dim_IntList(%x) {dim = [1, 3]} : f32[2, 4]
  %c = aten.sum.dim_IntList(%x) {dim = [0, 2]} : f32[3, 5]
  return %r, %c""", "%x: f32[2, 3, 4, 5]")
    plan = schedule.RowsAndColumns.of(spread, lambda v: v.type.shape)
    assert plan.rows == (spread[0],) and not plan.trailing
    for body in ("""
  %a = aten.sum.dim_IntList(%x) {dim = [1]} : f32[8]
  %b = aten.sum.dim_IntList(%x) {dim = [0, 1]} : f32[]
  return %a, %b""", """
  %a = aten.sum.dim_IntList(%x) {dim = [1]} : f32[8]
  return %a"""):  # overlapping dims; one nest
        assert schedule.RowsAndColumns.of(_reductions(body, "%x: f32[8, 64]"),
                                          lambda v: v.type.shape) is None


def test_a_schedule_of_several_nests_carries_its_rows_and_columns():
    g = parse_graph("""graph @g(%x: f32[8, 64]) {
  %o1, %o2 = torchloom.fusion_group(%x) : f32[64], f32[8] region @k(%in_x: f32[8, 64]) {
    %c = aten.sum.dim_IntList(%in_x) {dim = [0]} : f32[64]
    %s = aten.sum.dim_IntList(%in_x) {dim = [1]} : f32[8]
    return %c, %s
  }
  return %o1, %o2
}""")
    found = Schedule.of(next(g.nodes))
    assert found.form == "several_nests"
    assert [n.op for n in found.rows_and_columns.columns] == ["aten.sum.dim_IntList"]
    assert found.rows_and_columns.row_nest.rdims == (1,)


def test_max_shift_finds_softmaxs_maximum_of_the_same_input():
    g = parse_graph("""graph @g(%x: f32[8, 64], %y: f32[8, 64]) {
  %m = aten.amax.default(%x) {dim = [1], keepdim = true} : f32[8, 1]
  %d = aten.sub.Tensor(%x, %m) : f32[8, 64]
  %v, %i = aten.max.dim(%x) {dim = 1, keepdim = true} : f32[8, 1], i64[8, 1]
  %e = aten.sub.Tensor(%x, %v) : f32[8, 64]
  %f = aten.sub.Tensor(%y, %m) : f32[8, 64]
  %n = aten.amax.default(%x) {dim = [0]} : f32[64]
  %h = aten.sub.Tensor(%x, %n) : f32[8, 64]
  %k = aten.sub.Tensor(%x, %m) {alpha = 2} : f32[8, 64]
  return %d, %e, %f, %h, %k
}""")
    m, d, mx, e, f, n, h, k = g.nodes
    assert schedule.max_shift(d.outputs[0]) is m and schedule.max_shift(e.outputs[0]) is mx
    # another tensor's maximum, a maximum without keepdim, alpha 2, the maximum itself
    for node in (f, h, k, m):
        assert schedule.max_shift(node.outputs[0]) is None


@pytest.mark.parametrize("shape, flat, chunk, flat_chunk, want", [
    ((64, 300), False, 4096, 1024, (300, 1, False)),        # a short row: whole
    ((2, 8192), False, 4096, 1024, (8192, 1, False)),       # up to two chunks: whole
    ((2, 8193), False, 4096, 1024, (4096, 3, True)),        # longer: cut
    ((3, 0), False, 4096, 1024, (0, 0, False)),             # rows of no elements: none
    ((4, 6000), True, 4096, 1024, (1024, 24, True)),        # flat: one row, in its chunks
    ((4, 6), True, 4096, 1024, (24, 1, False)),             # flat and short
    ((2, 10000), False, None, None, (10000, 1, False)),     # no chunks asked: whole
    ((4, 6000), True, 4096, None, (24000, 1, False)),       # a flat row whole
])
def test_row_chunks_cut_long_rows_only(shape, flat, chunk, flat_chunk, want):
    """RowChunks.of: a walk's rows cut into chunks where longer than two (a flat walk's one
    row into its own chunks); the loop over rows runs (row, chunk) pairs."""
    walk = Walk(shape, tuple(range(len(shape))), flat)
    chunks = walk_nest.RowChunks.of(walk, chunk, flat_chunk)
    assert (chunks.size, chunks.count, chunks.cut) == want
    assert chunks.trips(walk) == walk.rows * chunks.count
    if chunks.cut:  # every element in exactly one chunk
        assert (chunks.count - 1) * chunks.size < walk.inner <= chunks.count * chunks.size


def test_row_chunks_of_symbolic_rows_are_counted_at_run_time():
    """Rows of a symbolic length are always cut (a chunk count of ``CeilDiv``), unless
    the target keeps rows whole."""
    s0 = "s0"  # (a symbolic dim, as the IR's types hold it)
    walk = Walk((8, s0), (0, 1), False)
    chunks = walk_nest.RowChunks.of(walk, 4096, 1024)
    assert chunks.cut and chunks.size == 4096 and chunks.count == f"CeilDiv({s0}, 4096)"
    whole = walk_nest.RowChunks.of(walk, None, None)
    assert not whole.cut and whole.count == 1 and whole.size == s0
