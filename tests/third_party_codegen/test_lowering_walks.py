"""The lowering's pointwise nests walk the schedule's :class:`~torchloom.api.Walk`: the first
output's rows in memory order, a loop over a row inside, values that do not change along a
row computed once per row; flat walks one loop over every element. Each group runs on
``scalar_c`` and matches eager exactly (negations, adds and multiplies of the same operands)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.api import DTYPES, Walk, expr, parse_graph, stmt
from torchloom.testing.renderers import lowered_against_eager


def _type(t: torch.Tensor) -> str:
    dims = ", ".join(map(str, t.shape))
    dense = t.is_contiguous()
    return f"f32[{dims}]" + ("" if dense else f" strided[{', '.join(map(str, t.stride()))}]")


def _group(shape, perm, bshape) -> tuple[str, torch.Tensor, torch.Tensor]:
    """``-a.permute(perm) * b + b`` over ``a`` of ``shape`` and a broadcast ``b``: the
    group text (types as torch lays them out) and the inputs."""
    g = torch.Generator().manual_seed(len(shape) * 7 + sum(shape))
    a = torch.randn(shape, generator=g)
    b = torch.randn(bshape, generator=g)
    view = a.permute(perm)
    out = -view * b + b
    region = (f"%p: {_type(a)}, %q: {_type(b)}")
    text = f"""graph @g(%a: {_type(a)}, %b: {_type(b)}) {{
  %o = torchloom.fusion_group(%a, %b) : {_type(out)} region @k({region}) {{
    %t0 = aten.permute.default(%p) {{dims = {list(perm)}}} : {_type(view)}
    %t1 = aten.neg.default(%t0) : {_type(-view)}
    %t2 = aten.mul.Tensor(%t1, %q) : {_type(-view * b)}
    %t3 = aten.add.Tensor(%t2, %q) : {_type(out)}
    return %t3
  }}
  return %o
}}
"""
    return text, a, b


def _loops(body) -> list[stmt.Loop]:
    return [s for s in stmt.walk(list(body)) if isinstance(s, stmt.Loop)]


def _lowered(scalar_c, text, inputs):
    cls, registry = scalar_c
    lowered = lowered_against_eager(cls(), registry, text, inputs, rtol=0, atol=0)
    return next(parse_graph(text).nodes), lowered


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_pointwise_walks_rows_in_the_first_outputs_memory_order(scalar_c, data):
    """Any permuted read against any broadcast operand: the kernel loops over the walk's
    rows and in each over a row (flat: one row of every element, rows whole on one
    thread), as the cpu codegen's kernels do (``walk_nest``), and matches eager exactly.
    A row of one element may have no loop over it: a store whose offset reads no ``j``
    goes before that loop, left empty then and dropped."""
    shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)))
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    out_shape = [shape[d] for d in perm]
    bshape = [d if data.draw(st.booleans()) else 1 for d in out_shape]
    text, a, b = _group(shape, perm, bshape)
    group, lowered = _lowered(scalar_c, text, (a, b))
    walk = Walk.of(group.region.outputs, lambda v: v.type)
    loops = _loops(lowered.body)
    found = [(s.var, s.end) for s in loops]
    assert found[0] == ("x", str(walk.rows))
    assert found[1:] == [("j", str(walk.inner))] or (walk.inner == 1 and not found[1:])
    assert walk.rows * walk.inner == a.numel()


def test_a_value_of_the_row_is_computed_once_before_the_loop_over_it(scalar_c):
    """``-a * b + b`` with ``b`` one value per row: ``b``'s load stays out of the loop
    ``j``, computed once per row; ``a``'s loads are the row's (``x * 16 + j``)."""
    text, a, b = _group((8, 16), (0, 1), [8, 1])
    _, lowered = _lowered(scalar_c, text, (a, b))
    (outer,) = lowered.body
    inner = [s for s in outer.body if isinstance(s, stmt.Loop)]
    assert len(inner) == 1 and inner[0].var == "j"
    before = [s for s in outer.body if isinstance(s, stmt.Declare)]
    assert [expr.code(s.expr).text for s in before] == ["in_q[x]"]
    loads = [expr.code(s.expr).text for s in stmt.walk(list(inner[0].body))
             if isinstance(s, stmt.Declare) and "in_" in expr.code(s.expr).text]
    assert loads == ["in_p[x * 16 + j]"]


FLAT = """graph @g(%a: f32[4, 6], %b: f32[1, 1]) {
  %o = torchloom.fusion_group(%a, %b) : f32[4, 6] region @k(%p: f32[4, 6], %q: f32[1, 1]) {
    %t0 = aten.mul.Tensor(%p, %q) : f32[4, 6]
    return %t0
  }
  return %o
}
"""


def test_walks_of_the_schedule():
    """Walk.of: memory order of the first output, flat only for dense static tensors of one
    shape with no view; turned puts a dim innermost."""
    g = parse_graph(_group((4, 6), (1, 0), [6, 4])[0])
    walk = Walk.of(next(g.nodes).region.outputs, lambda v: v.type)
    assert walk.order == (1, 0) and not walk.flat  # (a transposed read, a row-major output)
    g = parse_graph(_group((4, 6), (0, 1), [4, 6])[0])
    walk = Walk.of(next(g.nodes).region.outputs, lambda v: v.type)
    assert not walk.flat and walk.sizes == [4, 6]  # (a permute, even of (0, 1), is a view)
    g = parse_graph(FLAT)
    walk = Walk.of(next(g.nodes).region.outputs, lambda v: v.type)
    assert walk.flat and walk.sizes == [24] and walk.rows == 1 and walk.inner == 24
    turned = Walk((2, 3, 40), (0, 1, 2), False).turned(1)
    assert turned.order == (0, 2, 1) and turned.sizes == [2, 40, 3] and turned.rows == 80
    assert Walk((), (), False).sizes == [1]


TWO_OUTPUTS = """graph @g(%a: f32[{s}], %b: f32[{s}]) {{
  %o, %p = torchloom.fusion_group(%a, %b) : f32[{s}], f32[{s}] region @k(%x: f32[{s}], %y: f32[{s}]) {{
    %t0 = aten.add.Tensor(%x, %y) : f32[{s}]
    %t1 = aten.neg.default(%x) : f32[{s}]
    return %t0, %t1
  }}
  return %o, %p
}}
"""

RESHAPED_OUTPUTS = ["""graph @g(%a: f32[6, 4], %b: f32[4]) {
  %o, %p = torchloom.fusion_group(%a, %b) : f32[4, 6] strided[1, 4], f32[24] region @k(%x: f32[6, 4], %y: f32[4]) {
    %t0 = aten.add.Tensor(%x, %y) : f32[6, 4]
    %t1 = aten.t.default(%t0) : f32[4, 6] strided[1, 4]
    %t2 = aten.view.default(%t0) {size = [24]} : f32[24]
    return %t1, %t2
  }
  return %o, %p
}
""", """graph @g(%a: f32[6, 4], %b: f32[6, 1]) {
  %o, %p = torchloom.fusion_group(%a, %b) : f32[6, 4], f32[2, 12] region @k(%x: f32[6, 4], %y: f32[6, 1]) {
    %t0 = aten.mul.Tensor(%x, %y) : f32[6, 4]
    %t2 = aten.view.default(%t0) {size = [2, 12]} : f32[2, 12]
    %t3 = aten.neg.default(%t2) : f32[2, 12]
    return %t0, %t3
  }
  return %o, %p
}
"""]


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (3, 1), (1, 7), (2, 3, 4)])
def test_walks_of_empty_and_unit_dims(scalar_c, shape):
    """Empty walks, rows of one element and a single row (flat: dense, no view)."""
    text = TWO_OUTPUTS.format(s=", ".join(map(str, shape)))
    g = torch.Generator().manual_seed(len(shape))
    _lowered(scalar_c, text, (torch.randn(shape, generator=g), torch.randn(shape, generator=g)))


@pytest.mark.parametrize("text", RESHAPED_OUTPUTS, ids=["transposed_first", "reshaped_second"])
def test_outputs_of_other_shapes_are_stored_at_the_walks_elements(scalar_c, text):
    """A second output of another shape (as many elements) is stored at the element the
    walk of the first is at: the first laid out transposed, or row-major."""
    group = next(parse_graph(text).nodes)
    shapes = [tuple(v.type.shape) for v in group.region.inputs]
    g = torch.Generator().manual_seed(3)
    _lowered(scalar_c, text, tuple(torch.randn(s, generator=g) for s in shapes))


def _transposed(shape, perm, dtype="f32"):
    """``a.permute(perm) + b`` (``b`` laid out as the output): the group and its inputs."""
    g = torch.Generator().manual_seed(sum(shape))
    a = torch.randn(shape, generator=g).to(DTYPES[dtype])
    out = a.permute(perm)
    b = torch.randn(out.shape, generator=g).to(DTYPES[dtype])
    view = _type(out).replace("f32", dtype)
    t, o = _type(a).replace("f32", dtype), _type(b).replace("f32", dtype)
    text = f"""graph @g(%a: {t}, %b: {o}) {{
  %o = torchloom.fusion_group(%a, %b) : {o} region @k(%p: {t}, %q: {o}) {{
    %t0 = aten.permute.default(%p) {{dims = {list(perm)}}} : {view}
    %t1 = aten.add.Tensor(%t0, %q) : {o}
    return %t1
  }}
  return %o
}}
"""
    return text, (a, b)


@pytest.mark.parametrize("shape, perm, dtype, tiled", [
    ((512, 256), (1, 0), "f32", True), ((70, 100), (1, 0), "f32", True),
    ((3, 64, 80), (0, 2, 1), "bf16", True), ((65, 2, 129), (2, 1, 0), "f64", True),
    ((40, 300), (1, 0), "f32", False),  # (40 rows: fewer than two tiles' worth)
    ((256, 128), (0, 1), "f32", False)])  # (nothing read across)
def test_rows_read_across_are_walked_in_tiles(scalar_c, shape, perm, dtype, tiled):
    """A walk whose rows an input reads across (a transposed read stepping 16 elements or
    more) goes in 32 x 32 tiles of its rows and a row, as the cpu codegen walks it
    (``tiles.tile_rows``): each element computed as before, exactly."""
    cls, registry = scalar_c
    text, inputs = _transposed(shape, perm, dtype)
    lowered = lowered_against_eager(cls(), registry, text, inputs, rtol=0, atol=0)
    [top] = lowered.body
    assert (top.var == "xt") == tiled, top
    if tiled:
        [row] = [s for s in top.body if isinstance(s, stmt.Loop)]
        assert (row.var, row.start, row.end) == ("x", "xt0", "xt1")
        assert [(s.var, s.start, s.end) for s in row.body if isinstance(s, stmt.Loop)] == [
            ("j", "jt0", "jt1")]


@pytest.mark.parametrize("n, c, hw", [(2, 3, 80), (1, 4, 64), (2, 3, 8)])
def test_rows_too_short_for_tiles_are_turned(scalar_c, n, c, hw):
    """An NCHW image copied to channels-last (rows of ``c`` channels, each read from
    another plane): where the rows are 4 elements or fewer and the plane 64 or more, the
    walk is turned (``tiles.turned``, as the cpu codegen turns it): its innermost loop runs
    along the input's contiguous pixels, each element computed as before, exactly."""
    cls, registry = scalar_c
    g = torch.Generator().manual_seed(c)
    a = torch.randn(n, c, hw, generator=g)
    out = a.permute(0, 2, 1).contiguous().permute(0, 2, 1)  # (channels innermost in memory)
    t, o = _type(a), _type(out)
    text = f"""graph @g(%a: {t}) {{
  %o = torchloom.fusion_group(%a) : {o} region @k(%p: {t}) {{
    %t0 = aten.mul.Tensor(%p) {{other = 2}} : {o}
    return %t0
  }}
  return %o
}}
"""
    lowered = lowered_against_eager(cls(), registry, text, (a,), rtol=0, atol=0)
    group = next(parse_graph(text).nodes)
    walk = Walk.of(group.region.outputs, lambda v: v.type)
    assert walk.order[-1] == 1  # (the output's channels innermost in memory)
    inner = [s for s in stmt.walk(list(lowered.body)) if isinstance(s, stmt.Loop)][-1]
    turned = hw >= 64
    # turned: the innermost loop runs over the pixels (hw), else over the channels (c)
    assert str(inner.end) == str(hw if turned else c), inner
