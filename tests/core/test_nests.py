"""The kernel schedule's nest plan (codegen/nests.py): which loop nests a group's kernel
runs, what each stores, computes and reads back, as frozen data a target renders."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torchloom.api import nests, parse_graph
from torchloom.codegen.indexing import Unsupported

REDUCTIONS = ("sum", "amax", "amin", "mean")


def _region(body: str, params: str):
    return parse_graph(f"graph @g({params}) {{\n{body}\n}}")


def _is_reduction(node) -> bool:
    return node.op.split(".")[1] in REDUCTIONS


def _plan(g, fold=None):
    return nests.plan(g, _is_reduction, lambda v: v.type, fold)


def _names(nest):
    return None if nest.outputs is None else [v.name for _, v in nest.outputs]


def test_one_nest_holds_the_whole_group():
    g = _region("""
  %s = aten.sum.dim_IntList(%x) {dim = [1], keepdim = true} : f32[8, 1]
  %y = aten.sub.Tensor(%x, %s) : f32[8, 16]
  return %y, %s""", "%x: f32[8, 16]")
    assert _plan(g) == (nests.Nest(),)  # every output, every reduction
    assert _plan(_region("  %y = aten.exp.default(%x) : f32[8, 16]\n  return %y",
                         "%x: f32[8, 16]")) == (nests.Nest(),)


def test_pointwise_outputs_of_two_counts_are_a_nest_each_largest_first():
    g = _region("""
  %y = aten.exp.default(%x) : f32[8, 16]
  %t = aten.mul.Tensor(%c, %c) : f32[]
  return %t, %y""", "%x: f32[8, 16], %c: f32[]")
    planned = _plan(g)
    assert [_names(n) for n in planned] == [["y"], ["t"]]
    assert all(n.reductions == () and n.read_back == () for n in planned)


def test_row_and_column_sums_are_two_nests_the_later_reading_back_scratch():
    """A layer_norm-like backward: the column sum reads the row mean, which the row nest
    stores in a scratch array the column nest reads back."""
    g = _region("""
  %m = aten.mean.dim(%x) {dim = [1], keepdim = true} : f32[8, 1]
  %d = aten.sub.Tensor(%x, %m) : f32[8, 16]
  %y = aten.mul.Tensor(%d, %g) : f32[8, 16]
  %c = aten.sum.dim_IntList(%y) {dim = [0]} : f32[16]
  return %d, %c""", "%x: f32[8, 16], %g: f32[8, 16]")
    rows, columns = _plan(g)
    assert [r.op for r in rows.reductions] == ["aten.mean.dim"]
    assert [r.op for r in columns.reductions] == ["aten.sum.dim_IntList"]
    assert _names(rows) == ["d"] and _names(columns) == ["c"]
    # the column nest reads d, which the row nest stores as an output
    assert [(v.name, name) for v, name in columns.read_back] == [("d", "out_d")]


def test_a_result_no_output_holds_goes_through_a_scratch_array():
    g = _region("""
  %m = aten.mean.dim(%x) {dim = [1], keepdim = true} : f32[8, 1]
  %d = aten.sub.Tensor(%x, %m) : f32[8, 16]
  %c = aten.sum.dim_IntList(%d) {dim = [0]} : f32[16]
  return %c""", "%x: f32[8, 16]")
    rows, columns = _plan(g)
    assert rows.outputs[-1][0] == "scratch_m" and rows.outputs[-1][1].name == "m"
    assert [(v.name, name) for v, name in columns.read_back] == [("m", "scratch_m")]


def test_a_fold_puts_the_columns_in_the_row_nest():
    g = _region("""
  %s = aten.sum.dim_IntList(%x) {dim = [1]} : f32[8]
  %c = aten.sum.dim_IntList(%x) {dim = [0]} : f32[16]
  return %s, %c""", "%x: f32[8, 16]")
    seen = []

    def fold(classes, parts, depends):
        seen.append(len(classes))
        return 0, 1

    (nest,) = _plan(g, fold)
    assert seen == [2] and _names(nest) == ["s"]
    assert [(name, node.outputs[0].name) for name, node in nest.columns] == [("out_c", "c")]


def test_classes_reading_each_others_results_are_declined():
    g = _region("""
  %a = aten.sum.dim_IntList(%x) {dim = [1], keepdim = true} : f32[8, 1]
  %b = aten.sum.dim_IntList(%x) {dim = [0], keepdim = true} : f32[1, 16]
  %p = aten.add.Tensor(%x, %b) : f32[8, 16]
  %q = aten.add.Tensor(%x, %a) : f32[8, 16]
  %a2 = aten.sum.dim_IntList(%p) {dim = [1], keepdim = true} : f32[8, 1]
  %b2 = aten.sum.dim_IntList(%q) {dim = [0], keepdim = true} : f32[1, 16]
  return %a2, %b2""", "%x: f32[8, 16]")
    with pytest.raises(Unsupported, match="read each other's results"):
        _plan(g)


def test_after_the_rows_stores_results_and_walks_the_rest():
    """A row result read transposed: the reduction's nest stores it (an output here),
    and a pointwise nest after it reads it back at other elements than its row."""
    g = _region("""
  %m = aten.amax.default(%x) {dim = [2], keepdim = true} : f32[4, 6, 1]
  %t = aten.transpose.int(%m) {dim0 = 0, dim1 = 1} : f32[6, 4, 1]
  %y = aten.mul.Tensor(%t, %w) : f32[6, 4, 5]
  return %m, %y""", "%x: f32[4, 6, 5], %w: f32[6, 4, 5]")
    first, after = nests.after_the_rows(g, _is_reduction, lambda v: v.type)
    assert _names(first) == ["m"] and [r.op for r in first.reductions] == ["aten.amax.default"]
    assert _names(after) == ["y"] and after.reductions == ()
    assert [v.name for v, _ in after.read_back] == ["m"]
    two = _region("""
  %a = aten.sum.dim_IntList(%x) {dim = [1]} : f32[4]
  %b = aten.sum.dim_IntList(%x) {dim = [0]} : f32[5]
  return %a, %b""", "%x: f32[4, 5]")
    assert nests.after_the_rows(two, _is_reduction, lambda v: v.type) is None


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.sampled_from([1, 4, 8, 32]), min_size=1, max_size=5))
def test_every_output_is_stored_by_exactly_one_nest(counts):
    """Pointwise outputs of random element counts: each stored once, nests ordered by
    count (largest first), one nest per count."""
    body = "\n".join(f"  %y{k} = aten.exp.default(%x{k}) : f32[{n}]"
                     for k, n in enumerate(counts))
    params = ", ".join(f"%x{k}: f32[{n}]" for k, n in enumerate(counts))
    g = _region(body + "\n  return " + ", ".join(f"%y{k}" for k in range(len(counts))),
                params)
    planned = _plan(g)
    if len(set(counts)) == 1:
        assert planned == (nests.Nest(),)
        return
    stored = [v.name for n in planned for _, v in n.outputs]
    assert sorted(stored) == sorted(f"y{k}" for k in range(len(counts)))
    sizes = [n.outputs[0][1].type.shape[0] for n in planned]
    assert sizes == sorted(set(counts), reverse=True)
