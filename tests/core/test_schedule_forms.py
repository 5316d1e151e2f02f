"""The kernel schedule's form plans in core: 2-D tiles of a pointwise walk read across by
an input (codegen/tiles.py) and the row forms of targets holding rows in blocks of lanes
(codegen/row_forms.py). Both native codegens read these plans instead of deciding."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from torchloom.api import Tiles, expr, parse_graph, row_forms, schedule
from torchloom.codegen.tiles import input_reads
from torchloom.ops.aten import default_registry

REGISTRY = default_registry()


def _group(body: str, params: str):
    return parse_graph(f"graph @g({params}) {{\n{body}\n}}")


def _plan(g, min_dim=None, outputs=None):
    return Tiles.of(g, REGISTRY, lambda v: v.type, min_dim, outputs)


def test_a_transposed_input_makes_tiles_of_the_two_dims():
    g = _group("""
  %t = aten.t.default(%a) : f32[64, 128] strided[1, 64]
  %y = aten.add.Tensor(%t, %b) : f32[64, 128]
  return %y""", "%a: f32[128, 64], %b: f32[64, 128]")
    assert _plan(g) == Tiles(d0=1, d1=0, step=64)
    # dims shorter than the target's shortest tile dim: no tiles
    assert _plan(g, min_dim=100) is None
    assert _plan(g, min_dim=64) == Tiles(1, 0, 64)


def test_inputs_along_the_walk_or_small_make_no_tiles():
    along = _group("""
  %y = aten.add.Tensor(%a, %b) : f32[64, 128]
  return %y""", "%a: f32[64, 128], %b: f32[64, 128]")
    assert _plan(along) is None
    # a [128] bias read along dim 0 of the walk: a sixty-fourth of the elements, in cache
    small = _group("""
  %u = aten.unsqueeze.default(%c) {dim = 1} : f32[64, 1]
  %y = aten.add.Tensor(%a, %u) : f32[64, 128]
  return %y""", "%a: f32[64, 128], %c: f32[64]")
    assert _plan(small) is None


def test_the_walk_is_the_outputs_memory_order():
    # the output itself laid out column-major: its innermost dim is 0, and a row-major
    # input is read across it
    g = _group("""
  %y = aten.neg.default(%a) : f32[64, 128] strided[1, 64]
  return %y""", "%a: f32[64, 128]")
    assert _plan(g) == Tiles(d0=0, d1=1, step=128)
    # outputs in two orders: no one walk to tile
    two = _group("""
  %y = aten.neg.default(%a) : f32[64, 128] strided[1, 64]
  %z = aten.abs.default(%a) : f32[64, 128]
  return %y, %z""", "%a: f32[64, 128]")
    assert _plan(two) is None
    assert _plan(two, outputs=[two.outputs[1]]) is None  # the row-major one reads along
    assert _plan(two, outputs=[two.outputs[0]]) == Tiles(0, 1, 128)


def test_reads_follow_views_to_the_inputs():
    g = _group("""
  %p = aten.permute.default(%a) {dims = [0, 2, 1]} : f32[2, 32, 16] strided[512, 1, 32]
  %y = aten.mul.Tensor(%p, %p) : f32[2, 32, 16]
  return %y""", "%a: f32[2, 16, 32]")
    p = tuple(expr.Name(f"p{d}") for d in range(3))
    reads = input_reads(g.outputs, REGISTRY, lambda v: v.type, p)
    assert reads == [(g.inputs[0], (p[0], p[2], p[1]))]  # read once, however often used
    assert _plan(g) == Tiles(d0=2, d1=1, step=32)


@settings(max_examples=60, deadline=None)
@given(perm=st.permutations(range(3)), sizes=st.lists(st.sampled_from([1, 3, 16, 40]),
                                                    min_size=3, max_size=3))
def test_tiles_pair_the_walks_inner_dim_with_the_inputs(perm, sizes):
    # an input of shape sizes, permuted: tiles exactly where its innermost real dim (in
    # the output's coordinates) is not the output's innermost real dim
    out_shape = [sizes[d] for d in perm]
    strides = [1] * 3
    for d in (1, 0):
        strides[d] = strides[d + 1] * sizes[d + 1]
    p_strides = [strides[d] for d in perm]
    shape = lambda s: f"[{', '.join(map(str, s))}]"  # noqa: E731
    g = _group(f"""
  %p = aten.permute.default(%a) {{dims = {list(perm)}}} : f32{shape(out_shape)} strided{shape(p_strides)}
  %y = aten.exp.default(%p) : f32{shape(out_shape)}
  return %y""", f"%a: f32{shape(sizes)}")
    assume(out_shape[2] != 1)  # (a walk whose innermost dim has one element reads no row)
    plan = _plan(g)
    real = [d for d in range(3) if out_shape[d] != 1]
    d0 = 2  # the output is row-major: its innermost dim is the last
    unit = [d for d in real if p_strides[d] == 1]
    expected = None if d0 in unit or len(unit) != 1 else Tiles(d0, unit[0], p_strides[d0])
    assert plan == expected


def test_row_forms_looped_and_split_shapes():
    assert [row_forms.next_pow2(n) for n in (0, 1, 2, 3, 1000, 1024)] == [1, 1, 2, 4, 1024, 1024]
    assert not row_forms.looped(4096, 4096) and row_forms.looped(4097, 4096)
    split = row_forms.Split.shape(rows=1, rnumel=1 << 20, xblock=1, rblock=2048, programs=264)
    assert split is not None and split.splits * split.chunk >= 1 << 20
    assert split.chunk % 2048 == 0 and split.splits >= 264 - 1
    assert row_forms.Split.shape(1024, 1 << 20, 1, 2048, 264) is None  # rows enough
    assert row_forms.Split.shape(1, 2048, 1, 2048, 264) is None  # one chunk only
    assert row_forms.Split.shape(1, 0, 1, 2048, 264) is None


@pytest.mark.parametrize("rows,rnumel,xblock,rblock",
                         list(itertools.product((1, 7, 100), (1, 4095, 1 << 16, 1 << 21),
                                                (1, 8), (1024, 2048))))
def test_a_split_covers_every_element_once(rows, rnumel, xblock, rblock):
    split = row_forms.Split.shape(rows, rnumel, xblock, rblock, 264)
    if split is None:
        return
    assert split.chunk % rblock == 0 and split.splits >= 2
    # chunks in order cover [0, rnumel): the last starts inside the row
    assert (split.splits - 1) * split.chunk < rnumel <= split.splits * split.chunk


def test_splittable_needs_row_outputs_and_independent_reductions():
    g = _group("""
  %s = aten.sum.dim_IntList(%x) {dim = [1]} : f32[4]
  %q = aten.sqrt.default(%s) : f32[4]
  return %q""", "%x: f32[4, 4096]")
    reds = [n for n in g.nodes if n.op == "aten.sum.dim_IntList"]
    assert row_forms.splittable(reds, g.outputs, 4, lambda v: v.type)
    full = _group("""
  %s = aten.sum.dim_IntList(%x) {dim = [1], keepdim = true} : f32[4, 1]
  %y = aten.sub.Tensor(%x, %s) : f32[4, 4096]
  return %y""", "%x: f32[4, 4096]")
    reds = [n for n in full.nodes if n.op == "aten.sum.dim_IntList"]
    assert not row_forms.splittable(reds, full.outputs, 4, lambda v: v.type)
    chained = _group("""
  %m = aten.amax.default(%x) {dim = [1], keepdim = true} : f32[4, 1]
  %d = aten.sub.Tensor(%x, %m) : f32[4, 4096]
  %s = aten.sum.dim_IntList(%d) {dim = [1]} : f32[4]
  return %s""", "%x: f32[4, 4096]")
    reds = [n for n in chained.nodes if n.op in ("aten.amax.default", "aten.sum.dim_IntList")]
    assert not row_forms.splittable(reds, chained.outputs, 4, lambda v: v.type)


def test_a_cpu_reads_slices_and_small_inputs_across_the_walk_too():
    # every other column, transposed: no dim is read with a unit stride (a GPU's coalescing
    # gains nothing), but the read still steps 128 elements per element of the walk's row
    g = _group("""
  %s = aten.slice.Tensor(%a) {dim = 1, start = 0, end = 128, step = 2} : f32[64, 64] strided[128, 2]
  %p = aten.permute.default(%s) {dims = [1, 0]} : f32[64, 64] strided[2, 128]
  %y = aten.exp.default(%p) : f32[64, 64]
  return %y""", "%a: f32[64, 128]")
    assert _plan(g) is None
    assert Tiles.of(g, REGISTRY, lambda v: v.type, None, unit=False) == Tiles(1, 0, 128)
    # a [64, 1, 100] input broadcast over [64, 64, 100], the walk's innermost being dim 0:
    # a sixty-fourth of the elements, passed over unless the target caches nothing
    small = _group("""
  %y = aten.mul.Tensor(%a, %b) : f32[64, 64, 100] strided[1, 64, 4096]
  return %y""", "%a: f32[64, 64, 100] strided[1, 64, 4096], %b: f32[64, 1, 100]")
    assert _plan(small) is None
    assert Tiles.of(small, REGISTRY, lambda v: v.type, None, cached=None) == Tiles(0, 2, 100)


def test_the_step_is_the_longest_of_the_reads_across():
    g = _group("""
  %t = aten.t.default(%a) : f32[64, 128] strided[1, 64]
  %u = aten.t.default(%b) : f32[64, 128] strided[1, 64]
  %v = aten.slice.Tensor(%c) {dim = 1, start = 0, end = 64, step = 1} : f32[128, 64] strided[200, 1]
  %w = aten.t.default(%v) : f32[64, 128] strided[1, 200]
  %s = aten.add.Tensor(%t, %u) : f32[64, 128]
  %y = aten.add.Tensor(%s, %w) : f32[64, 128]
  return %y""", "%a: f32[128, 64], %b: f32[128, 64], %c: f32[128, 200]")
    assert _plan(g) == Tiles(d0=1, d1=0, step=200)


def test_reduction_results_and_values_read_back_are_reads_from_memory():
    # a pointwise nest after the rows reads the row sums from memory (an earlier nest
    # stored them), here transposed against the walk: the probe stops there
    g = _group("""
  %s = aten.sum.dim_IntList(%x) {dim = [1], keepdim = true} : f32[128, 1]
  %e = aten.expand.default(%s) {size = [128, 64]} : f32[128, 64] strided[1, 0]
  %t = aten.t.default(%e) : f32[64, 128] strided[0, 1]
  %u = aten.t.default(%y) : f32[64, 128] strided[1, 64]
  %z = aten.add.Tensor(%t, %u) : f32[64, 128]
  return %z, %s""", "%x: f32[128, 300], %y: f32[128, 64]")
    p = (expr.Name("p0"), expr.Name("p1"))
    reads = input_reads([g.outputs[0]], REGISTRY, lambda v: v.type, p)
    sums = list(g.nodes)[0].outputs[0]
    assert [v for v, _ in reads] == [sums, g.inputs[1]]
    assert _plan(g, outputs=[g.outputs[0]]) == Tiles(d0=1, d1=0, step=64)
    # the same sums named as a value an earlier nest stored
    stored = sums
    reads = input_reads([g.outputs[0]], REGISTRY, lambda v: v.type, p, stops=[stored])
    assert reads[0][0] is stored


_SOFTMAX_AND_MORE = """
  %m = aten.amax.default(%x) {dim = [1], keepdim = true} : f32[4, 1]
  %d = aten.sub.Tensor(%x, %m) : f32[4, 64]
  %e = aten.exp.default(%d) : f32[4, 64]
  %s = aten.sum.dim_IntList(%e) {dim = [1], keepdim = true} : f32[4, 1]
  %q = aten.div.Tensor(%e, %s) : f32[4, 64]
  %n = aten.sum.dim_IntList(%q) {dim = [1]} : f32[4]
  %k = aten.amin.default(%x) {dim = [1]} : f32[4]
  %v = aten.var.correction(%q) {dim = [1]} : f32[4]
  return %n, %k, %v"""


def test_levels_put_a_reduction_after_those_its_input_reads():
    g = _group(_SOFTMAX_AND_MORE, "%x: f32[4, 64]")
    reds = [n for n in g.nodes if n.op.split(".")[1] in ("amax", "sum", "amin", "var")]
    m, s, n, k, v = reds
    assert schedule.levels(reds) == [[m, k], [s], [n, v]]
    assert schedule.levels(list(reversed(reds))) == [[k, m], [s], [v, n]]  # (any order)
    assert schedule.reductions_read(n, reds) == {m, s} and schedule.reductions_read(m, reds) == set()
    assert schedule.levels([]) == [[]]


def _kind(n):
    return {"amax": "max", "amin": "min", "sum": "sum", "var": "var"}[n.op.split(".")[1]]


def test_looped_passes_take_softmax_sum_online_beside_its_maximum():
    g = _group(_SOFTMAX_AND_MORE, "%x: f32[4, 64]")
    reds = [n for n in g.nodes if n.op.split(".")[1] in ("amax", "sum", "amin", "var")]
    m, s, n, k, v = reds
    assert row_forms.passes(reds, _kind) == (
        row_forms.Pass((k,), ((m, s),)), row_forms.Pass((n, v)))
    # a pair the target declines (its dtypes, say) takes a pass of its own: the levels
    declined = row_forms.passes(reds, _kind, online=lambda a, b: False)
    assert [list(p.reductions) for p in declined] == schedule.levels(reds)
    assert all(not p.online for p in declined)
    assert row_forms.passes([], _kind) == ()


def test_only_a_keepdim_maximum_of_the_same_input_pairs_online():
    shifted_other = _group("""
  %m = aten.amax.default(%x) {dim = [1], keepdim = true} : f32[4, 1]
  %d = aten.sub.Tensor(%y, %m) : f32[4, 64]
  %e = aten.exp.default(%d) : f32[4, 64]
  %s = aten.sum.dim_IntList(%e) {dim = [1], keepdim = true} : f32[4, 1]
  return %s""", "%x: f32[4, 64], %y: f32[4, 64]")
    no_exp = _group("""
  %m = aten.amax.default(%x) {dim = [1], keepdim = true} : f32[4, 1]
  %d = aten.sub.Tensor(%x, %m) : f32[4, 64]
  %s = aten.sum.dim_IntList(%d) {dim = [1], keepdim = true} : f32[4, 1]
  return %s""", "%x: f32[4, 64]")
    for g in (shifted_other, no_exp):
        m, s = [n for n in g.nodes if n.op.split(".")[1] in ("amax", "sum")]
        assert row_forms.passes([m, s], _kind) == (row_forms.Pass((m,)), row_forms.Pass((s,)))


@pytest.mark.parametrize("order", list(itertools.permutations(range(5))))
def test_every_reduction_is_in_one_pass_after_what_it_reads(order):
    g = _group(_SOFTMAX_AND_MORE, "%x: f32[4, 64]")
    reds = [n for n in g.nodes if n.op.split(".")[1] in ("amax", "sum", "amin", "var")]
    given_order = [reds[i] for i in order]
    plan = row_forms.passes(given_order, _kind)
    seen: list = []
    for p in plan:
        here = [*p.reductions, *(x for pair in p.online for x in pair)]
        for r in here:  # reads only earlier passes' results (or its online partner)
            partner = {a for a, b in p.online if b is r}
            assert schedule.reductions_read(r, reds) <= set(seen) | partner
        assert list(p.reductions) == [r for r in given_order if r in p.reductions]
        seen += here
    assert sorted(map(id, seen)) == sorted(map(id, reds)) and len(plan) == 2
