"""The lowering's column form (``codegen/columns.py`` plans it, as it does for the cpu
codegen; ``codegen/lower_columns.py`` lowers it): reductions whose kept dims are innermost,
or whose one kept dim is innermost in memory, walk the reduced elements outer and the
columns inner, accumulating into an array per reduction. Each group runs on ``scalar_c``
and matches eager; the loops are counted."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.api import DTYPES, RendererCodegen, columns, parse_graph, schedule, stmt
from torchloom.runtime.executor import CompiledGraph
from torchloom.testing.reductions import group_text, symbolic_sizes
from torchloom.testing.renderers import lowered_against_eager
from torchloom.tools import EagerCodegen

#: op, attributes, whether it takes integers
_REDUCTIONS = {"sum": ("aten.sum.dim_IntList", True), "mean": ("aten.mean.dim", False),
               "amax": ("aten.amax.default", True), "amin": ("aten.amin.default", True),
               "prod": ("aten.prod.dim_int", True)}
_TOL = {"f32": (2e-5, 2e-5), "f64": (1e-9, 1e-9), "bf16": (1.6e-2, 1e-2),
        "i32": (0, 0), "i64": (0, 0)}


def _t(dtype: str, shape, strides=None) -> str:
    text = f"{dtype}[{', '.join(map(str, shape))}]"
    return text if strides is None else f"{text} strided[{', '.join(map(str, strides))}]"


def _walks(body) -> list[stmt.Loop]:
    """The loops over reduced elements (``r``) that hold a loop over the columns."""
    return [s for s in stmt.walk(list(body)) if isinstance(s, stmt.Loop) and s.var == "r"
            and any(isinstance(t, stmt.Loop) and t.var == "x" for t in s.body)]


def _rows(body) -> list[stmt.Loop]:
    """The row form's loops: over rows (``x``) holding a loop over a row (``r``)."""
    return [s for s in stmt.walk(list(body)) if isinstance(s, stmt.Loop) and s.var == "x"
            and any(isinstance(t, stmt.Loop) and t.var == "r" for t in s.body)]


def _reduce(op: str, dims, keepdim: bool, dtype: str, shape) -> tuple[str, str, list]:
    """A reduction of ``a * 2 + b`` over ``dims``: the node text and its output shape."""
    name, _ = _REDUCTIONS[op]
    out = [1 if d in dims else n for d, n in enumerate(shape)] if keepdim else \
        [n for d, n in enumerate(shape) if d not in dims]
    out_dtype = "i64" if op in ("sum", "prod") and dtype in ("i32", "i64") else dtype
    if op == "prod":  # (one dim)
        attrs = f"dim = {dims[0]}, keepdim = {str(keepdim).lower()}"
    else:
        attrs = f"dim = {list(dims)}, keepdim = {str(keepdim).lower()}"
    node = f"%s = {name}(%t1) {{{attrs}}} : {_t(out_dtype, out)}"
    return node, out_dtype, out


def _inputs(g: torch.Generator, dtype: str, shape, b_shape, op: str):
    if dtype in ("i32", "i64"):
        top = 3 if op == "prod" else 50
        a = torch.randint(-top, top + 1, shape, generator=g)
        b = torch.randint(-top, top + 1, b_shape, generator=g)
    else:
        scale = 0.3 if op == "prod" else 1.0
        a, b = torch.randn(shape, generator=g) * scale, torch.randn(b_shape, generator=g) * scale
        if op == "prod":
            a, b = a + 1, b
    return a.to(DTYPES[dtype]), b.to(DTYPES[dtype])


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_reductions_over_leading_dims_walk_columns(scalar_c, data):
    """Any reduction kind over leading dims (the kept dims innermost) of a pointwise
    input, with a full-shape output beside it, in any of five dtypes: the kernel walks
    the reduced elements outer and the columns inner, and matches eager."""
    cls, registry = scalar_c
    op = data.draw(st.sampled_from(sorted(_REDUCTIONS)))
    dtype = data.draw(st.sampled_from(["f32", "f64", "bf16", "i32", "i64"] if
                                      _REDUCTIONS[op][1] else ["f32", "f64", "bf16"]))
    shape = data.draw(st.lists(st.integers(1, 9), min_size=2, max_size=4))
    lead = data.draw(st.integers(1, len(shape) - 1 if op != "prod" else 1))
    dims = list(range(lead))
    keepdim = data.draw(st.booleans())
    b_shape = shape[lead:]
    t, b = _t(dtype, shape), _t(dtype, b_shape)
    node, out_dtype, out = _reduce(op, dims, keepdim, dtype, shape)
    text = group_text(f"%a: {t}, %b: {b}", f"""
        %t0 = aten.mul.Tensor(%a, %b) : {t}
        %t1 = aten.add.Tensor(%t0, %b) : {t}
        {node}""", f"%s: {_t(out_dtype, out)}, %t1: {t}")
    g = torch.Generator().manual_seed(len(shape) * 31 + sum(shape))
    inputs = _inputs(g, dtype, shape, b_shape, op)
    lowered = lowered_against_eager(cls(), registry, text, inputs, *_TOL[dtype])
    group = next(parse_graph(text).nodes)
    reductions = [n for n in group.region.nodes if n.op == _REDUCTIONS[op][0]]
    nest = schedule.ReductionNest.of(reductions, lambda v: v.type)
    planned = columns.plan(nest, reductions, group.region.inputs, group.region.outputs,
                           lambda v: v.type, lambda v: "full" if v.type.shape == nest.shape
                           else "row")
    if planned is None:  # (a row of one element: by rows)
        assert nest.rnumel == 1
        assert len(_rows(lowered.body)) == 1
        return
    assert len(_walks(lowered.body)) == 1 and not _rows(lowered.body)
    assert [p.name.startswith("acc_") for p in lowered.launch.params
            if p.role == "scratch"] == [True]


@pytest.mark.parametrize("shape", [(7, 5), (64, 33), (3, 4, 6)])
def test_softmax_over_the_first_dim_takes_three_walks(scalar_c, shape):
    """The max, then the sum of exp(a - max) reading it, then the quotients (full-shape
    outputs reading results) in a walk of their own; NaN and inf columns as eager."""
    cls, registry = scalar_c
    t = _t("f32", shape)
    k = _t("f32", [1, *shape[1:]])
    text = group_text(f"%a: {t}", f"""
        %m = aten.amax.default(%a) {{dim = [0], keepdim = true}} : {k}
        %d = aten.sub.Tensor(%a, %m) : {t}
        %e = aten.exp.default(%d) : {t}
        %s = aten.sum.dim_IntList(%e) {{dim = [0], keepdim = true}} : {k}
        %o = aten.div.Tensor(%e, %s) : {t}""", f"%o: {t}, %s: {k}")
    a = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
    a.view(shape[0], -1)[1, 0] = float("nan")
    a.view(shape[0], -1)[0, -1] = float("inf")
    lowered = lowered_against_eager(cls(), registry, text, (a,), 2e-6, 1e-6)
    assert len(_walks(lowered.body)) == 3 and not _rows(lowered.body)


@pytest.mark.parametrize("shape", [(2, 8, 5, 3), (3, 16, 4, 4)])
def test_a_channels_last_batch_norm_gradient_walks_its_channels(scalar_c, shape):
    """Sums over N, H and W of channels-last tensors (the channel innermost in memory) and
    a per-channel output computed from them (a batch norm's weight gradient)."""
    cls, registry = scalar_c
    n, c, h, w = shape
    strides = (c * h * w, 1, w * c, c)
    t, k = _t("f32", shape, strides), _t("f32", [c])
    text = group_text(f"%g: {t}, %x: {t}, %m: {k}, %i: {k}", f"""
        %m2 = aten.view.default(%m) {{size = [{c}, 1, 1]}} : f32[{c}, 1, 1]
        %xm = aten.sub.Tensor(%x, %m2) : {t}
        %p = aten.mul.Tensor(%g, %xm) : {t}
        %sp = aten.sum.dim_IntList(%p) {{dim = [0, 2, 3]}} : {k}
        %sg = aten.sum.dim_IntList(%g) {{dim = [0, 2, 3]}} : {k}
        %w = aten.mul.Tensor(%sp, %i) : {k}""", f"%w: {k}, %sg: {k}")
    g = torch.Generator().manual_seed(c)
    grad = torch.randn(shape, generator=g).to(memory_format=torch.channels_last)
    x = torch.randn(shape, generator=g).to(memory_format=torch.channels_last)
    m, i = torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5
    lowered = lowered_against_eager(cls(), registry, text, (grad, x, m, i), 2e-5, 2e-5)
    assert len(_walks(lowered.body)) == 1 and not _rows(lowered.body)
    assert len([p for p in lowered.launch.params if p.role == "scratch"]) == 2


@pytest.mark.parametrize("shape", [(6, 10), (40, 3)])
def test_column_sums_at_symbolic_sizes(scalar_c, shape):
    """A bias gradient (``sum(g * w, 0)``) beside its input's gradient, every size a
    symbol: the arrays are as long as the call's columns."""
    cls, registry = scalar_c
    t, k = _t("f32", shape), _t("f32", shape[1:])
    text = symbolic_sizes(group_text(f"%g: {t}, %w: {k}", f"""
        %p = aten.mul.Tensor(%g, %w) : {t}
        %s = aten.sum.dim_IntList(%p) {{dim = [0]}} : {k}""", f"%s: {k}, %p: {t}"))
    g = torch.Generator().manual_seed(1)
    for rows, cols in [shape, (shape[0] + 3, shape[1] + 1)]:
        inputs = (torch.randn(rows, cols, generator=g), torch.randn(cols, generator=g))
        lowered = lowered_against_eager(cls(), registry, text, inputs)
        assert len(_walks(lowered.body)) == 1
    bound = lowered.launch.bind(inputs)
    assert [n for n, _ in bound.scratch] == [shape[1] + 1]


def test_rows_in_memory_order_keep_the_row_form(scalar_c):
    """A transposed input summed over its first dim lies with its reduced dim innermost in
    memory: the row form reads its rows contiguously, and is kept."""
    cls, registry = scalar_c
    t = _t("f32", (12, 5), (1, 12))
    text = group_text(f"%a: {t}", """
        %s = aten.sum.dim_IntList(%a) {dim = [0]} : f32[5]""", "%s: f32[5]")
    a = torch.randn(5, 12, generator=torch.Generator().manual_seed(3)).t()
    lowered = lowered_against_eager(cls(), registry, text, (a,))
    assert not _walks(lowered.body) and len(_rows(lowered.body)) == 1


@pytest.mark.parametrize("rows, cols", [(0, 5), (4, 0), (1, 7), (9, 1)])
def test_column_reductions_of_empty_and_single_sizes(scalar_c, rows, cols):
    """The kernel written for ``[s6, s10]`` called with no rows (sums of nothing: zeros;
    a maximum of nothing raises, as eager), no columns (empty results), one row or one
    column, as eager."""
    cls, registry = scalar_c
    text = symbolic_sizes(group_text("%g: f32[6, 10]", """
        %s = aten.sum.dim_IntList(%g) {dim = [0]} : f32[10]
        %m = aten.amax.default(%g) {dim = [0]} : f32[10]""", "%s: f32[10], %m: f32[10]"))
    g = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * 10 + cols))
    if rows == 0:
        compiled = CompiledGraph(parse_graph(text), registry,
                                 [RendererCodegen(cls()), EagerCodegen()])
        with pytest.raises(IndexError, match="amax"):
            compiled(g)
        sums = symbolic_sizes(group_text("%g: f32[6, 10]", """
            %s = aten.sum.dim_IntList(%g) {dim = [0]} : f32[10]""", "%s: f32[10]"))
        lowered_against_eager(cls(), registry, sums, (g,))
        return
    lowered_against_eager(cls(), registry, text, (g,))


@pytest.mark.parametrize("shape", [(7, 1), (5, 1, 1), (9, 3)])
def test_one_column_keeps_what_reads_its_results_in_the_column_loop(scalar_c, shape):
    """Found by random programs: a softmax over dim 0 of ``[7, 1]``, whose one column's
    coordinates are all 0. A value of the walk that names no column coordinate is computed
    once per reduced element, before the loop over the columns, but one computed from a
    result (``a - max``) reads the loop's declaration of it: it stays in the loop (the
    kernel named an undeclared result and did not build)."""
    cls, registry = scalar_c
    t, k = _t("f32", shape), _t("f32", [1, *shape[1:]])
    text = group_text(f"%a: {t}", f"""
        %m = aten.amax.default(%a) {{dim = [0], keepdim = true}} : {k}
        %d = aten.sub.Tensor(%a, %m) : {t}
        %e = aten.exp.default(%d) : {t}
        %s = aten.sum.dim_IntList(%e) {{dim = [0], keepdim = true}} : {k}
        %o = aten.div.Tensor(%e, %s) : {t}
        %y = aten.sin.default(%o) : {t}""", f"%y: {t}")
    a = torch.randn(shape, generator=torch.Generator().manual_seed(7))
    lowered = lowered_against_eager(cls(), registry, text, (a,), 2e-6, 1e-6)
    assert len(_walks(lowered.body)) == 3
