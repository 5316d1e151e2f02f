"""The core's lowering writes every kernel the nest plan gives (``codegen/nests.py``, the
plan the cpu codegen writes too): reductions of several classes one nest after the other,
row results a later nest reads from scratch arrays, outputs read back where a later nest
sums them, pointwise outputs of several element counts, and the nests after a reduction
whose nest cannot hold an output. Each group runs on ``scalar_c`` (claiming every form)
and matches eager."""

from __future__ import annotations

import json

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.api import (DTYPES, LaunchSpec, Reason, RendererCodegen, Schedule,
                           lower, parse_graph, size_param)
from torchloom.runtime.executor import CompiledGraph
from torchloom.testing import pointwise, reductions
from torchloom.testing.reductions import (group_text, randn, row_results_for_columns,
                                          stored_output_for_columns)
from torchloom.testing.renderers import lowered_against_eager
from torchloom.tools import EagerCodegen


def _run(scalar_c, text, inputs, rtol=1.3e-6, atol=1e-5, renderer=None):
    cls, registry = scalar_c
    return lowered_against_eager(renderer or cls(), registry, text, inputs,
                                 rtol, atol)


def _t(dtype: str, shape) -> str:
    return f"{dtype}[{', '.join(map(str, shape))}]"


_SUM, _AMAX = "aten.sum.dim_IntList", "aten.amax.default"


@pytest.mark.parametrize("column", [_SUM, _AMAX])
@pytest.mark.parametrize("shape", [(8, 6), (33, 7), (1, 5), (2, 4, 9), (3, 1, 1)])
def test_row_results_the_columns_read(scalar_c, shape, column):
    """A layer_norm backward recomputing its statistics: the weight gradient's column sums
    read mean and rstd per row. The row nest carries the sums (an array of one sum per
    column, each adding its rows in order); a column maximum, which it does not carry,
    is a column nest reading the row results from the scratch arrays the row nest stores
    them in."""
    text = row_results_for_columns(shape, column)
    g = torch.Generator().manual_seed(sum(shape))
    a, grad = randn(g, *shape) * 3 + 1, randn(g, *shape)
    a.view(-1)[-1] = float("nan")
    lowered = _run(scalar_c, text, (a, grad), rtol=2e-5, atol=2e-5)
    scratch = [p.name for p in lowered.launch.params if p.role == "scratch"]
    assert scratch and len(lowered.launch.scratch) == len(scratch)
    rows = max(1, torch.Size(shape[:-1]).numel())
    counts = {name: numel for name, (numel, _) in zip(scratch, lowered.launch.scratch)}
    loops = [s.var for s in lowered.body if type(s).__name__ == "Loop"]
    if column == _SUM:  # carried: its sums started, the row nest, the sums stored
        assert counts == {scratch[0]: shape[-1]} and scratch[0].startswith("acc_colsum")
        assert loops == ["r", "x", "r"]
        return
    # the row results, one per row; the column nest's maxima, one per column (columns.py)
    assert {n for name, n in counts.items() if name.startswith("scratch_")} == {rows}
    columns = rows > 1  # (one row: the column nest reduces rows of one element, by rows)
    assert {n for name, n in counts.items() if name.startswith("acc_")} == (
        {shape[-1]} if columns else set())
    # the row nest; the column nest: its maxima started, the walk over rows, its results
    assert loops == (["x", "x", "r", "x"] if columns else ["x", "x"])


@pytest.mark.parametrize("column", [_SUM, _AMAX])
@pytest.mark.parametrize("shape", [(8, 6), (33, 70), (4, 5, 3)])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_a_stored_output_the_columns_read(scalar_c, shape, dtype, column):
    """A cross-entropy gradient and the bias gradient summed from it over the batch: the
    row nest carries the sums of the gradient it computes (its value before rounding to
    the output's dtype, as the cpu codegen does); a column maximum is a column nest
    reading back the gradient the row nest stored (rounded, as eager reads it)."""
    text = stored_output_for_columns(shape, dtype, column)
    g = torch.Generator().manual_seed(len(shape))
    a = (randn(g, *shape) - 2).to(DTYPES[dtype])
    grad = randn(g, *shape).to(DTYPES[dtype])
    grad.view(-1)[3] = float("nan")
    tol = (1.6e-2, 1e-2) if dtype == "bf16" else (1e-5, 1e-5)
    lowered = _run(scalar_c, text, (a, grad), *tol)
    scratch = [p.name for p in lowered.launch.params if p.role == "scratch"]
    # no row results in scratch (what it reads back is an output); the columns' arrays
    prefix = "acc_colsum" if column == _SUM else "acc_max"
    assert scratch and scratch == [n for n in scratch if n.startswith(prefix)]


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_row_and_column_sums_of_one_shape_are_one_nest(scalar_c, rows):
    """A layer norm's backward: the row nest carries the weight and bias gradients' column
    sums (one array each, one sum per column), one read of every input."""
    t, k = _t("f32", (rows, 48)), _t("f32", (rows, 1))
    text = group_text(f"%g: {t}, %w: f32[48], %x: {t}, %m: {k}, %r: {k}", f"""
        %t0 = aten.mul.Tensor(%g, %w) : {t}
        %t2 = aten.sum.dim_IntList(%t0) {{dim = [1], keepdim = true}} : {k}
        %t3 = aten.sub.Tensor(%x, %m) : {t}
        %t4 = aten.mul.Tensor(%t3, %r) : {t}
        %t7 = aten.mul.Tensor(%t4, %t2) : {t}
        %t9 = aten.sub.Tensor(%t0, %t7) : {t}
        %t13 = aten.mul.Tensor(%g, %t4) : {t}
        %t14 = aten.sum.dim_IntList(%t13) {{dim = [0]}} : f32[48]
        %t15 = aten.sum.dim_IntList(%g) {{dim = [0]}} : f32[48]""",
                      f"%t9: {t}, %t14: f32[48], %t15: f32[48]")
    g = torch.Generator().manual_seed(rows)
    inputs = (randn(g, rows, 48), randn(g, 48), randn(g, rows, 48), randn(g, rows, 1),
              randn(g, rows, 1).abs())
    lowered = _run(scalar_c, text, inputs, rtol=1e-5, atol=1e-5)
    assert [s.var for s in lowered.body] == ["r", "x", "r"]
    assert [(p.name[:10], n) for p, (n, _) in zip(
        [p for p in lowered.launch.params if p.role == "scratch"], lowered.launch.scratch)] == [
        ("acc_colsum", 48)] * 2


@pytest.mark.parametrize("n", [1, 6, 37])
def test_pointwise_outputs_of_several_element_counts(scalar_c, n):
    text = group_text(f"%a: f32[4, {n}], %b: f32[{n}]", f"""
        %x = aten.exp.default(%a) : f32[4, {n}]
        %y = aten.mul.Tensor(%b) {{other = 3}} : f32[{n}]
        %z = aten.add.Tensor(%x, %y) : f32[4, {n}]""", f"%z: f32[4, {n}], %y: f32[{n}]")
    g = torch.Generator().manual_seed(n)
    lowered = _run(scalar_c, text, (randn(g, 4, n), randn(g, n)))
    assert len(lowered.body) == 2


@pytest.mark.parametrize("shape", [(2, 3, 8), (1, 1, 4), (3, 2, 6)])
def test_outputs_of_another_count_after_the_reduction(scalar_c, shape):
    """Llama's backward: the gradient summed over the repeated heads, then half of each
    head sliced for the rotary embedding (nests.after_the_rows)."""
    b, h, d = shape
    half = d // 2
    text = group_text(f"%g: f32[{b}, {h}, 5, {d}]", f"""
        %s = aten.sum.dim_IntList(%g) {{dim = [2]}} : f32[{b}, {h}, {d}]
        %l = aten.slice.Tensor(%s) {{dim = 2, start = 0, end = {half}}} : f32[{b}, {h}, {half}]
        %o = aten.mul.Tensor(%l) {{other = 2}} : f32[{b}, {h}, {half}]
        %h = aten.mul.Tensor(%g) {{other = 0.5}} : f32[{b}, {h}, 5, {d}]""",
                      f"%o: f32[{b}, {h}, {half}], %s: f32[{b}, {h}, {d}], "
                      f"%h: f32[{b}, {h}, 5, {d}]")
    g = torch.Generator().manual_seed(d)
    grad = randn(g, b, h, 5, d)
    grad.view(-1)[0] = float("nan")
    _run(scalar_c, text, (grad,))


def test_several_nests_are_declined_for_a_nest_form_the_renderer_lacks(scalar_c):
    """scalar_c renders several nests of rows, and of rows and columns; a renderer of row
    nests alone declines the second group for its column nest's form, said so."""
    cls, registry = scalar_c
    two_rows = group_text("%a: f32[4, 6], %b: f32[3, 5]", """
        %s = aten.sum.dim_IntList(%a) {dim = [1]} : f32[4]
        %m = aten.amax.default(%b) {dim = [1]} : f32[3]""", "%s: f32[4], %m: f32[3]")
    g = torch.Generator().manual_seed(0)
    assert Schedule.of(next(parse_graph(two_rows).nodes)).parts == ("row_reduction",) * 2
    _run(scalar_c, two_rows, (randn(g, 4, 6), randn(g, 3, 5)), renderer=cls())
    rows_and_columns = group_text("%a: f32[4, 6]", """
        %s = aten.sum.dim_IntList(%a) {dim = [1]} : f32[4]
        %c = aten.sum.dim_IntList(%a) {dim = [0]} : f32[6]""", "%s: f32[4], %c: f32[6]")
    group = next(parse_graph(rows_and_columns).nodes)
    schedule = Schedule.of(group)
    assert schedule.parts == ("row_reduction", "column_reduction")
    _run(scalar_c, rows_and_columns, (randn(g, 4, 6),), renderer=cls())

    class Rows(cls):
        capabilities = attrs.evolve(cls.capabilities, forms=frozenset(
            {"pointwise", "row_reduction", "several_nests"}))
    assert RendererCodegen(Rows()).supports(group, registry) == Reason(
        "scalar_c", f"renders pointwise, row_reduction, several_nests nests; this group's "
                    f"nests include a column_reduction ({schedule.detail})")


@pytest.mark.parametrize("given", ["contiguous", "typed", "sliced"])
def test_an_input_laid_out_otherwise_than_its_type_is_read_as_its_type(scalar_c, given):
    """A graph's intermediate may come from eager's op in other strides than its IR type
    says: the kernel reads each input at its type's strides, so the codegen made of a
    renderer hands it a copy laid out so (a renderer's build never sees another)."""
    cls, registry = scalar_c
    text = group_text("%a: f32[4, 6] strided[1, 4], %b: f32[4, 1]", """
        %e = aten.exp.default(%a) : f32[4, 6]
        %s = aten.sum.dim_IntList(%e) {dim = [1], keepdim = true} : f32[4, 1]
        %y = aten.div.Tensor(%e, %s) : f32[4, 6]
        %z = aten.mul.Tensor(%y, %b) : f32[4, 6]""", "%z: f32[4, 6]")
    group = next(parse_graph(text).nodes)
    codegen = RendererCodegen(cls())
    kernel = codegen.load(codegen.generate(group, registry), registry)
    g = torch.Generator().manual_seed(0)
    a = randn(g, 6, 4).t()  # the type's layout
    if given == "contiguous":
        a = a.contiguous()
    elif given == "sliced":
        a = randn(g, 4, 12)[:, ::2]
    b = randn(g, 4, 1)
    (got,) = kernel(a, b)
    torch.testing.assert_close(got, torch.softmax(a, 1) * b)


SHARED = {**reductions.CASES, **pointwise.CASES}


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")
@pytest.mark.parametrize("name", sorted(SHARED))
def test_shared_cases_at_symbolic_sizes(scalar_c, name):
    """Each shared case with its dims as size symbols (``f32[s8, s20]``) is rendered once
    for every size, taking the sizes as ``size`` arguments the launcher reads from the
    inputs, and matches eager at the case's sizes; or it is declined with a reason (a
    form or dtype the renderer lacks, a view whose sizes may differ at some sizes)."""
    cls, registry = scalar_c
    text, inputs = SHARED[name]
    symbolic = reductions.symbolic_sizes(text)
    group = next(parse_graph(symbolic).nodes)
    codegen = RendererCodegen(cls())
    reason = codegen.supports(group, registry)
    if reason is not None:
        assert name in SYMBOLIC_DECLINED, reason
        assert SYMBOLIC_DECLINED[name] in reason.message, reason
        return
    assert name not in SYMBOLIC_DECLINED
    launch = lower.lower(group, registry, Schedule.of(group), codegen.renderer).launch
    assert [p.name for p in launch.params if p.role == "size"] == [
        size_param(s) for s in sorted(Schedule.of(group).symbols)]
    _run(scalar_c, symbolic, inputs(), rtol=1.3e-6 if "f32" in text else None,
         atol=1e-5 if "f32" in text else None)


#: shared cases declined at symbolic sizes, and what their reason says
SYMBOLIC_DECLINED = {
    "backward_templates": "gelu_backward", "half_inputs_computed_in_fp32": "f16",
    # (their views' dims, each its own symbol here, line up at no sample point: one group
    # of dims, whose sizes the launcher cannot read from these inputs)
    "outputs_viewed_to_other_shapes": "is no input's dim",
    "views_as_index_math": "is no input's dim"}


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(0, 9), cols=st.integers(0, 70), dtype=st.sampled_from(["f32", "bf16"]))
def test_one_kernel_serves_every_size(scalar_c, rows, cols, dtype):
    """Layer norm and softmax of ``x * w`` over ``[s0, s1]``: one kernel, called at sizes
    drawn (no rows, rows of one element, empty rows among them), matches eager at each;
    over empty rows it writes empty outputs, as ``torch.softmax`` does (the group's
    decomposed ``amax`` raises in eager, but its result reaches no element)."""
    cls, registry = scalar_c
    t, row = f"{dtype}[s0, s1]", f"{dtype}[s0, 1]"
    text = group_text(f"%a: {t}, %w: {dtype}[s1]", f"""
        %m = aten.mul.Tensor(%a, %w) : {t}
        %x = aten.amax.default(%m) {{dim = [-1], keepdim = true}} : {row}
        %s = aten.sub.Tensor(%m, %x) : {t}
        %e = aten.exp.default(%s) : {t}
        %u = aten.sum.dim_IntList(%e) {{dim = [-1], keepdim = true}} : {row}
        %y = aten.div.Tensor(%e, %u) : {t}
        %v, %mu = aten.var_mean.correction(%a) {{dim = [-1], correction = 0, keepdim = true}} : {row}, {row}
        %c = aten.sub.Tensor(%a, %mu) : {t}
        %n = aten.mul.Tensor(%c, %v) : {t}""", f"%y: {t}, %n: {t}")
    codegen = RendererCodegen(cls())
    kernel = codegen.load(codegen.generate(next(parse_graph(text).nodes), registry), registry)
    g = torch.Generator().manual_seed(rows * 100 + cols)
    a, w = randn(g, rows, cols, dtype=DTYPES[dtype]), randn(g, cols, dtype=DTYPES[dtype])
    eager = CompiledGraph(parse_graph(text), registry, [EagerCodegen()])
    if cols == 0:  # the decomposed amax over empty rows raises; torch.softmax does not
        with pytest.raises(IndexError):
            eager(a, w)
        assert [o.shape for o in kernel(a, w)] == [(rows, 0)] * 2
        return
    for got, expected in zip(kernel(a, w), eager(a, w)):
        assert got.shape == expected.shape and got.dtype == expected.dtype
        torch.testing.assert_close(got, expected)


def test_a_size_read_from_no_input_is_declined(scalar_c):
    """A symbol only inside size expressions (``f32[2*s0]``) has no input dim to read it
    from: the group is declined, said so."""
    cls, registry = scalar_c
    t = 'f32["2*s0"]'
    text = group_text(f"%a: {t}", f"%e = aten.exp.default(%a) : {t}", f"%e: {t}")
    reason = RendererCodegen(cls()).supports(next(parse_graph(text).nodes), registry)
    assert reason is not None and "size s0 is no input's dim" in reason.message, reason


def test_a_symbolic_launch_spec_round_trips_and_binds(scalar_c):
    """A launch spec of symbolic dims survives its JSON (the kernel cache's metadata) and
    binds a call's sizes: outputs, scratch arrays and input layouts at those sizes."""
    cls, registry = scalar_c
    group = next(parse_graph(reductions.symbolic_sizes(
        row_results_for_columns((8, 6), _AMAX))).nodes)
    launch = lower.lower(group, registry, Schedule.of(group), cls()).launch
    assert LaunchSpec.from_json(json.loads(json.dumps(launch.to_json()))) == launch
    assert launch.sizes == (("s6", 0, 1), ("s8", 0, 0))
    bound = launch.bind((torch.empty(5, 3), torch.empty(5, 3)))
    assert bound.sizes == (3, 5)
    assert [o[0] for o in bound.outputs] == [(3,), (5, 3)]
    assert bound.inputs == (((5, 3), (3, 1)), ((5, 3), (3, 1)))
    # the column maxima's array (3 columns), the two row results (5 rows)
    assert sorted(n for n, _ in bound.scratch) == [3, 5, 5]


def test_a_launch_spec_naming_another_error_is_refused(scalar_c):
    """A launch spec read back from a cache is data: an empty-row check naming an error
    outside EMPTY_ERRORS is refused when it is read, never looked up as a name."""
    cls, registry = scalar_c
    text, _ = reductions.EMPTY_ROWS["amax_times_two"]
    group = next(parse_graph(text).nodes)
    data = lower.lower(group, registry, Schedule.of(group), cls()).launch.to_json()
    assert data["nonempty"][0][2] == "IndexError"
    data["nonempty"][0][2] = "SystemExit"
    with pytest.raises(ValueError, match="names error 'SystemExit'.*damaged"):
        LaunchSpec.from_json(data)


@pytest.mark.parametrize("name", sorted(reductions.EMPTY_ROWS))
def test_empty_symbolic_rows_raise_as_eager(scalar_c, name):
    """A max, min, argmax or argmin over rows of symbolic length empty at a call: the
    launch (``LaunchSpec.bind``) raises eager's error, where the kernel would return its
    accumulator's start; other sizes match eager."""
    cls, registry = scalar_c
    text, empty = reductions.EMPTY_ROWS[name]
    compiled = CompiledGraph(parse_graph(text), registry,
                             [RendererCodegen(cls()), EagerCodegen()])
    assert [c.codegen for c in compiled.choices] == ["scalar_c"]
    eager = CompiledGraph(parse_graph(text), registry, [EagerCodegen()])
    with pytest.raises((IndexError, RuntimeError)) as want:
        eager(torch.empty(empty))
    with pytest.raises(want.type) as got:
        compiled(torch.empty(empty))
    assert str(got.value) == str(want.value)
    a = torch.randn(3, 5)
    torch.testing.assert_close(compiled(a), eager(a))


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")
@pytest.mark.parametrize("shape", [(5, 37), (1, 8), (4, 1), (3, 2, 9)])
def test_reductions_of_one_level_share_a_loop_over_the_row(scalar_c, shape):
    """A sum, a maximum, an argmax and a variance of one row, none reading another's
    result: their accumulators fold in one loop over the row (the variance's squared
    deviations in a second, after its mean), a softmax's sum after its maximum in a loop
    of its own; every result as eager's (NaN rows included)."""
    cls, registry = scalar_c
    rows = _t("f32", shape[:-1])
    keep = _t("f32", [*shape[:-1], 1])
    t = _t("f32", shape)
    text = group_text(f"%a: {t}", f"""
        %s = aten.sum.dim_IntList(%a) {{dim = [-1]}} : {rows}
        %m = aten.amax.default(%a) {{dim = [-1], keepdim = true}} : {keep}
        %i = aten.argmax.default(%a) {{dim = -1}} : {_t("i64", shape[:-1])}
        %v, %u = aten.var_mean.correction(%a) {{dim = [-1], correction = 1}} : {rows}, {rows}
        %d = aten.sub.Tensor(%a, %m) : {t}
        %e = aten.exp.default(%d) : {t}
        %z = aten.sum.dim_IntList(%e) {{dim = [-1]}} : {rows}""",
        f"%s: {rows}, %i: {_t('i64', shape[:-1])}, %v: {rows}, %u: {rows}, %z: {rows}")
    a = randn(torch.Generator().manual_seed(sum(shape)), *shape)
    a.view(-1)[0] = float("nan")
    lowered = _run(scalar_c, text, (a,), rtol=2e-5, atol=2e-5, renderer=cls())
    [row] = lowered.body
    loops = [s for s in row.body if type(s).__name__ == "Loop"]
    # sum, max, argmax and the variance's sum; the squares; the softmax's sum
    assert [s.var for s in loops] == ["r"] * 3


@pytest.mark.parametrize("rows", [4, 9])
def test_a_column_variance_beside_row_sums_is_two_nests(scalar_c, rows):
    """Found by random programs: a column reduction of two outputs (``var_mean``) beside
    row sums of the same shape. The row + column plan looked for column sums by unpacking
    each column reduction's one output, and raised; it is not carried: two nests."""
    t = _t("f32", (rows, 256))
    text = group_text(f"%a: {t}", f"""
        %s = aten.sum.dim_IntList(%a) {{dim = [1]}} : {_t("f32", (rows,))}
        %v, %m = aten.var_mean.correction(%a) {{dim = [0], correction = 1}} : f32[256], f32[256]""",
        f"%s: {_t('f32', (rows,))}, %v: f32[256], %m: f32[256]")
    a = randn(torch.Generator().manual_seed(rows), rows, 256)
    lowered = _run(scalar_c, text, (a,), rtol=2e-5, atol=2e-5, renderer=scalar_c[0]())
    assert not [p for p in lowered.launch.params if p.name.startswith("acc_colsum")]
