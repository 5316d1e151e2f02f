"""Symbolic sizes on the cpu codegen: random fusion groups whose dims are symbols (rows
``s0``, row length ``s1``), compiled once, run at several concrete sizes (1 and 0 included,
rows long enough to be chunked and split over threads) and compared with eager."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchloom.api import parse_graph

from conftest import as_accurate_as_eager, compare, group_text, reduction_statement

UNARY = ["aten.tanh.default", "aten.relu.default", "aten.neg.default", "aten.abs.default",
         "aten.exp.default", "aten.sigmoid.default"]
BINARY = ["aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.maximum.default"]
REDUCE = ["aten.sum.dim_IntList", "aten.amax.default", "aten.mean.dim"]
#: (rows, row length) each group runs at: size 1 and 0, chunked and threaded rows
SIZES = [(3, 5), (1, 7), (4, 1), (1, 1), (0, 6), (5, 0), (2, 9000), (40, 1000)]


def _type(dtype: str, shape) -> str:
    return f"{dtype}[{', '.join(map(str, shape))}]"


def _broadcast(a, b):
    a, b = (1,) * (len(b) - len(a)) + tuple(a), (1,) * (len(a) - len(b)) + tuple(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


@st.composite
def symbolic_group(draw):
    dtype = draw(st.sampled_from(["f32", "f64"]))
    shapes = draw(st.lists(st.sampled_from([("s0", "s1"), ("s1",), ("s0", 1), (1, "s1")]),
                           min_size=1, max_size=3))
    shapes[0] = ("s0", "s1")
    values = [(f"%a{i}", s) for i, s in enumerate(shapes)]
    lines = []
    for k in range(draw(st.integers(1, 5))):
        if draw(st.booleans()):
            name, shape = draw(st.sampled_from(values))
            lines.append(f"%v{k} = {draw(st.sampled_from(UNARY))}({name}) : "
                         f"{_type(dtype, shape)}")
        else:
            (a, sa), (b, sb) = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            shape = _broadcast(sa, sb)
            lines.append(f"%v{k} = {draw(st.sampled_from(BINARY))}({a}, {b}) : "
                         f"{_type(dtype, shape)}")
        values.append((f"%v{k}", shape))
    last, shape = values[-1]
    results = [f"{last}: {_type(dtype, shape)}"]
    view = draw(st.sampled_from(["none", "flatten", "transpose"]))
    if view == "flatten" and shape == ("s0", "s1"):  # a view to the flattened elements
        lines.append(f"%f = aten.view.default({last}) {{size = [-1]}} : {dtype}[\"s0*s1\"]")
        results.append(f"%f: {dtype}[\"s0*s1\"]")
    elif view == "transpose" and len(shape) == 2:
        out = (shape[1], shape[0])
        strides = "" if 1 in shape else " strided[1, s1]" if shape == ("s0", "s1") else None
        if strides is not None:
            lines.append(f"%t = aten.t.default({last}) : {_type(dtype, out)}{strides}")
            lines.append(f"%u = aten.sin.default(%t) : {_type(dtype, out)}")
            results.append(f"%u: {_type(dtype, out)}")
    if draw(st.booleans()) and len(shape) == 2:
        line, result = reduction_statement(draw(st.sampled_from(REDUCE)), last, shape, dtype,
                                           draw(st.sampled_from([0, -1])), draw(st.booleans()))
        lines.append(line)
        results.append(result)
    params = ", ".join(f"{n}: {_type(dtype, s)}" for n, s in values[:len(shapes)])
    return group_text(params, "\n".join(lines), ", ".join(results)), shapes, dtype


def _inputs(shapes, dtype, rows, cols, seed):
    gen = torch.Generator().manual_seed(seed)
    sizes = {"s0": rows, "s1": cols}
    return [torch.randn([sizes.get(d, d) for d in s], generator=gen,
                        dtype=getattr(torch, {"f32": "float32", "f64": "float64"}[dtype]))
            for s in shapes]


@pytest.mark.slow
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # the checker keeps no state
@given(symbolic_group(), st.integers(0, 1000))
def test_random_symbolic_groups_match_eager_at_every_size(check, case, seed):
    text, shapes, dtype = case
    compiled = check.compile(text)  # every group on cpu, compiled once
    source = check.codegen.generate(compiled.choices[0].node, check.registry).source
    assert "int64_t S_0" in source and "int64_t S_1" in source
    for rows, cols in SIZES:
        inputs = _inputs(shapes, dtype, rows, cols, seed)
        try:
            want = check.reference(text, *inputs)
        except (RuntimeError, IndexError):  # eager refuses it (amax of an empty row)
            continue
        got = compiled(*inputs)
        try:
            compare(got, want, rtol=1e-4, atol=1e-4)  # sums of 9000 in any order
        except AssertionError:
            if dtype != "f32":
                raise
            # ill-conditioned chains (sin of exp(exp(x)): one ulp of libm apart is any
            # value): as close to the float64 result as eager's, as the random groups
            as_accurate_as_eager(check, text, inputs, got, want)


def test_one_library_serves_every_size(check):
    """Kernels take sizes as arguments: the source, the kernel's name and the library hold
    no concrete size, and a second group equal up to its symbols' names reuses them."""
    text = group_text("%a: f32[s0, s1], %b: f32[s1]", """
        %m = aten.mul.Tensor(%a, %b) : f32[s0, s1]
        %e = aten.exp.default(%m) : f32[s0, s1]
        %s = aten.sum.dim_IntList(%e) {dim = [1]} : f32[s0]""", "%e: f32[s0, s1], %s: f32[s0]")
    renamed = text.replace("s0", "s7").replace("s1", "s3")
    kernels = [check.codegen.generate(check.compile(t).choices[0].node, check.registry)
               for t in (text, renamed)]
    assert kernels[0].metadata == kernels[1].metadata
    assert kernels[0].source == kernels[1].source  # so one library, whatever the names
    assert kernels[0].metadata["sizes"] == ["S_0", "S_1"]
    compiled = check.compile(renamed)
    for rows, cols in [(2, 3), (7, 1), (1, 40000)]:
        a, b = torch.randn(rows, cols), torch.randn(cols)
        compare(compiled(a, b), check.reference(renamed, a, b))


def test_sizes_read_from_view_arguments_and_flattened_inputs(check):
    """A symbol that is no dim of an input is read from the int a view takes it from; an
    input dim that is a product of such symbols (a flattened batch) is an argument itself."""
    text = group_text("%x: f32[\"s0*s1\", 16], %b: f32[16], %n: int, %m: int", """
        %y = aten.add.Tensor(%x, %b) : f32["s0*s1", 16]
        %v = aten.view.default(%y, %n, %m) {size = [$1, $2, 16]} : f32[s0, s1, 16]
        %g = aten.relu.default(%v) : f32[s0, s1, 16]""", "%g: f32[s0, s1, 16], %y: f32[\"s0*s1\", 16]")
    compiled = check.compile(text)
    kernel = check.codegen.generate(compiled.choices[0].node, check.registry)
    assert [d.get("sizes") for d in kernel.metadata["inputs"]] == [None, None, ["S_0"], ["S_1"]]
    for b, s in [(2, 3), (1, 5), (3, 1), (0, 4)]:
        x, bias = torch.randn(b * s, 16), torch.randn(16)
        compare(compiled(x, bias, b, s), check.reference(text, x, bias, b, s))
    # only the product is ever used: it is the argument
    text = group_text("%x: f32[\"s0*s1\", 16], %b: f32[16]", """
        %y = aten.add.Tensor(%x, %b) : f32["s0*s1", 16]""", "%y: f32[\"s0*s1\", 16]")
    compiled = check.compile(text)
    kernel = check.codegen.generate(compiled.choices[0].node, check.registry)
    assert kernel.metadata["sizes"] == ["S_0"]
    assert kernel.metadata["inputs"][0]["shape"] == ["S_0", 16]
    for rows in (6, 1, 0, 4000):
        x, bias = torch.randn(rows, 16), torch.randn(16)
        compare(compiled(x, bias), check.reference(text, x, bias))


def test_a_view_size_that_is_an_expression_is_read_from_its_int(check):
    """ConvNext's downsampled feature map under dynamic shapes: the view's sizes are
    (s0//2) and (s1//2), given as ints; each is an argument of its own."""
    text = group_text('%x: f32["((s0//2))*((s1//2))", 32], %b: f32[32], %n: int, %m: int', """
        %y = aten.add.Tensor(%x, %b) : f32["((s0//2))*((s1//2))", 32]
        %v = aten.view.default(%y, %n, %m) {size = [1, $1, $2, 32]} : f32[1, "(s0//2)", "(s1//2)", 32]
        %g = aten.gelu.default(%v) : f32[1, "(s0//2)", "(s1//2)", 32]""",
        '%g: f32[1, "(s0//2)", "(s1//2)", 32], %v: f32[1, "(s0//2)", "(s1//2)", 32]')
    compiled = check.compile(text)
    kernel = check.codegen.generate(compiled.choices[0].node, check.registry)
    assert [d.get("sizes") for d in kernel.metadata["inputs"]][2:] == [["S_0"], ["S_1"]]
    for h, w in [(3, 5), (1, 1), (4, 0), (7, 2)]:
        x, bias = torch.randn(h * w, 32), torch.randn(32)
        compare(compiled(x, bias, h, w), check.reference(text, x, bias, h, w))


def test_one_int_that_is_two_differently_spelled_sizes_gives_both(check):
    """Swin's window reverse under ``dynamic=True`` (square images: height and width are
    one int): a view takes the same int twice and Dynamo spells the two dims differently.
    Each spelling is a size argument read from that int (the launcher raised "size S_0 is
    not read from any input" at load, the int naming only the last)."""
    text = group_text('%x: f32["2*s1*s2", 8], %b: f32[8], %n: int', """
        %y = aten.mul.Tensor(%x, %b) : f32["2*s1*s2", 8]
        %v = aten.view.default(%y, %n, %n) {size = [-1, $1, $2, 8]} : f32[2, s1, s2, 8]
        %t = aten.transpose.int(%v) {dim0 = 1, dim1 = 2} : f32[2, s2, s1, 8]
        %g = aten.clone.default(%t) : f32[2, s2, s1, 8]
        %s = aten.sum.dim_IntList(%g) {dim = [2], keepdim = false} : f32[2, s2, 8]""",
        '%g: f32[2, s2, s1, 8], %s: f32[2, s2, 8]')
    compiled = check.compile(text)
    assert compiled.choices[0].codegen == "cpu"
    kernel = check.codegen.generate(compiled.choices[0].node, check.registry)
    assert kernel.metadata["inputs"][2]["sizes"] == ["S_0", "S_1"]
    for n in (3, 1, 7):  # (n = 0: eager's view raises, -1 is ambiguous)
        x, bias = torch.randn(2 * n * n, 8), torch.randn(8)
        compare(compiled(x, bias, n), check.reference(text, x, bias, n))


def test_a_stride_affine_in_a_whole_expression_dim_is_printed_from_it(check):
    """Falcon's rotary half of a query at dynamic lengths: ``s0 - s1`` (the new tokens) is
    a dim, so an argument; the stride ``48*s0 - 48*s1`` is 48 times it (was "size symbol
    s0 has no value in the kernel")."""
    text = group_text('%x: f32[s2, 4, "s0-s1", 4] strided["48*s0-48*s1", 8, 48, 1]', """
        %y = aten.neg.default(%x) : f32[s2, 4, "s0-s1", 4]""", '%y: f32[s2, 4, "s0-s1", 4]')
    compiled = check.compile(text)
    assert compiled.choices[0].codegen == "cpu"
    kernel = check.codegen.generate(compiled.choices[0].node, check.registry)
    assert kernel.metadata["inputs"][0]["strides"] == ["48 * S_1", 8, 48, 1]
    for b, n in [(2, 5), (1, 1), (3, 0), (0, 4)]:
        x = torch.randn(b, n, 48).view(b, n, 6, 8).transpose(1, 2)[:, :4, :, :4]
        compare(compiled(x), check.reference(text, x))
    x = torch.randn(2, 4, 3, 4)  # another layout: copied to the kernel's
    compare(compiled(x), check.reference(text, x))


def test_a_symbol_that_is_a_whole_expression_divided_is_printed_from_it(check):
    """DeBERTa-v2's heads under ``dynamic=True``: an input of ``2*s0`` rows split as
    ``[s0, 2]``: ``s0`` is the argument ``2*s0`` halved (was "size symbol s0 has no value
    in the kernel")."""
    text = group_text('%x: f32["2*s0", s1, 16], %n: int', """
        %v = aten.view.default(%x, %n) {size = [-1, 2, $1, 16]} : f32[s0, 2, s1, 16]
        %t = aten.permute.default(%v) {dims = [0, 2, 1, 3]} : f32[s0, s1, 2, 16] strided["32*s1", 16, "16*s1", 1]
        %y = aten.clone.default(%t) {memory_format = #contiguous_format} : f32[s0, s1, 2, 16]""",  # noqa: E501
        "%y: f32[s0, s1, 2, 16]")
    compiled = check.compile(text)
    assert compiled.choices[0].codegen == "cpu"
    for b, n in [(3, 5), (1, 1), (2, 7)]:
        x = torch.randn(2 * b, n, 16)
        compare(compiled(x, n), check.reference(text, x, n))


@pytest.mark.parametrize("rows", [1, 3, 40])
def test_a_dim_that_is_the_output_s_or_one_broadcasts_by_its_size(check, rows):
    """A broadcast dim ``s1//s2`` to ``s1``: valid where it is ``s1`` or 1 (the tracer's
    guards keep the rest out); read modulo its size, it is right in both (was declined:
    "the sizes may differ"); a row sum over it too."""
    text = group_text('%x: f32[s0, s1], %y: f32[s0, "s1//s2"], %z: f32[s2]', """
        %a = aten.add.Tensor(%x, %y) : f32[s0, s1]
        %b = aten.mul.Tensor(%a, %y) : f32[s0, s1]
        %c = aten.sum.dim_IntList(%b) {dim = [1]} : f32[s0]""",
        "%a: f32[s0, s1], %c: f32[s0]")
    compiled = check.compile(text)
    assert compiled.choices[0].codegen == "cpu"
    assert "r % (S_1 / S_2)" in check.source(text)  # (the coordinate modulo the size)
    for cols, s2 in [(5, 1), (5, 4), (5, 5), (67, 1), (67, 40), (1, 1), (16, 16), (16, 1)]:
        x = torch.randn(rows, cols)
        y = torch.randn(rows, cols // s2)
        z = torch.randn(s2)
        compare(compiled(x, y, z), check.reference(text, x, y, z))


def test_a_size_carrier_is_read_for_its_shape_only(check, monkeypatch):
    """A group passed a graph input for its shape (fusion.size-carriers): ``s0`` is read
    from it, nothing is loaded from it, and it is never copied to a layout."""
    half = "CeilToInt(IntTrueDiv(s0,2))"
    text = group_text(f'%p: f32["{half}", 4], %c: f32[s0, 4]', f"""
        %t = aten.mul.Tensor(%p) {{other = 2}} : f32["{half}", 4]""", f'%t: f32["{half}", 4]')
    compiled = check.compile(text)
    assert compiled.choices[0].codegen == "cpu"
    kernel = check.codegen.generate(compiled.choices[0].node, check.registry)
    assert kernel.metadata["inputs"][1]["unread"] and "in_c[" not in kernel.source
    monkeypatch.setattr(torch.Tensor, "contiguous", lambda *a, **k: pytest.fail("copied"))
    for n in (1, 6, 7, 40):
        p, carrier = torch.randn((n + 1) // 2, 4), torch.randn(4, n).t()  # (not contiguous)
        compare(compiled(p, carrier), (p * 2,))
    text = group_text(f'%p: f32["{half}", 4], %n: int[s0]', f"""
        %t = aten.mul.Tensor(%p) {{other = 2}} : f32["{half}", 4]""", f'%t: f32["{half}", 4]')
    compiled = check.compile(text)  # an int that is s0 carries it
    assert compiled.choices[0].codegen == "cpu"
    for n in (1, 6, 7, 40):
        p = torch.randn((n + 1) // 2, 4)
        compare(compiled(p, n), (p * 2,))


def test_a_slice_of_the_last_positions_is_strided_below_its_threshold(check):
    """MPT's ALiBi bias at dynamic lengths: ``alibi[:, :, -s:]`` of 64 positions is
    ``f32[4, 1, 64 - Max(0, 64 - s)] strided[64, 64, 1]``, contiguous only where ``s`` >=
    64 (judged at large sizes alone, it was taken as contiguous and read with stride ``s``:
    wrong values at ``s`` = 5 once its broadcast to ``s`` compiled)."""
    text = group_text('%x: f32[s0, 4, s1, s1], %b: f32[4, 1, "64-Max(0,64-s1)"] '
                      'strided[64, 64, 1]', """
        %y = aten.add.Tensor(%x, %b) : f32[s0, 4, s1, s1]""", "%y: f32[s0, 4, s1, s1]")
    compiled = check.compile(text)
    assert compiled.choices[0].codegen == "cpu"
    alibi = torch.randn(4, 1, 64)
    for batch, n in [(2, 5), (1, 13), (2, 64), (1, 63), (3, 1)]:
        x = torch.randn(batch, 4, n, n)
        compare(compiled(x, alibi[:, :, -n:]), check.reference(text, x, alibi[:, :, -n:]))


@pytest.mark.parametrize("end, length, start_of", [
    (9223372036854775807, "64-Max(0,64-s1)", lambda n: max(0, 64 - n)),  # MPT's ALiBi
    (-2, "Max(0,62-Max(0,64-s1))", lambda n: max(0, 64 - n)),
    (40, "Max(0,40-Max(0,64-s1))", lambda n: max(0, 64 - n)),
    (9223372036854775807, "Min(64,s1)", lambda n: -n)])  # from the end
def test_a_slice_whose_start_is_a_graph_value_reads_from_its_type(check, end, length,
                                                                   start_of):
    """MPT's ALiBi bias at dynamic lengths: ``bias[:, :, max(0, 64 - s):]`` takes its start
    from a graph value; a step-1 slice's start is its end (clamped as Python clamps it)
    less the length its type holds."""
    text = group_text(f'%b: f32[4, 1, 64], %st: int, %x: f32[4, 1, "{length}"], '
                      '%n: int[s1]', f"""
        %v = aten.slice.Tensor(%b, %st) {{dim = 2, end = {end}}} : f32[4, 1, "{length}"]
        %y = aten.add.Tensor(%x, %v) : f32[4, 1, "{length}"]""", f'%y: f32[4, 1, "{length}"]')
    compiled = check.compile(text)
    assert compiled.choices[0].codegen == "cpu", compiled.choices[0].fallback_reasons
    bias = torch.randn(4, 1, 64)
    for n in (5, 13, 63, 64, 65, 100):
        start = start_of(n)
        x = torch.randn_like(bias[:, :, start:end])
        want = x + bias[:, :, start:end]
        got = compiled(bias, start, x, n)
        compare(got, (want,))
        compare(got, check.reference(text, bias, start, x, n))


def test_a_stride_of_symbols_no_dim_holds_is_read_from_the_tensor(check):
    """``x[:, 0]`` of an f32[b, s, 16] is f32[b, 16] with strides (16*s, 1): s is no dim of
    the group's input, so the whole stride is a size argument the launcher reads from the
    tensor's strides (HF models pool the first token so under dynamic shapes)."""
    text = group_text('%x: f32[s0, 16] strided["16*s1", 1], %b: f32[16]', """
        %y = aten.mul.Tensor(%x, %b) : f32[s0, 16]""", "%y: f32[s0, 16]")
    compiled = check.compile(text)
    kernel = check.codegen.generate(compiled.choices[0].node, check.registry)
    assert kernel.metadata["inputs"][0]["strides"] == ["S_1", 1]
    for b, s in [(3, 7), (1, 1), (2, 13), (0, 5), (5, 0)]:
        x, bias = torch.randn(b, s, 16)[:, 0] if s else torch.randn(b, 16), torch.randn(16)
        compare(compiled(x, bias), check.reference(text, x, bias))
    x = torch.randn(16, 4, 3).permute(2, 1, 0)[:, 0]  # stride 1 there: copied to the layout
    compare(compiled(x, bias), check.reference(text, x, bias))


def test_first_token_pooling_under_dynamic_shapes_runs_on_cpu(tmp_path):
    from torchloom.backend import torchloom_backend
    from torchloom.tools import Compiler
    compiler = Compiler("default", cache_dir=tmp_path, compile_cache=False, strict=True)
    torch._dynamo.reset()

    def fn(x, w):
        return torch.tanh((x @ w)[:, 0] * 2), x[:, -1].sigmoid()
    c = torch.compile(fn, dynamic=True, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    w = torch.randn(16, 32)
    for s in (7, 13, 2):
        x = torch.randn(3, s, 16)
        for got, want in zip(c(x, w), fn(x, w)):
            torch.testing.assert_close(got, want)
    choices = [ch for comp in compiler.compilations for ch in comp.compiled.choices]
    assert choices and all(ch.codegen == "cpu" for ch in choices), \
        [(ch.codegen, [str(r) for r in ch.fallback_reasons]) for ch in choices]


def test_a_symbol_with_no_value_is_declined_with_a_reason(registry, codegen):
    """A view that needs s0 alone, when only the product s0*s1 is an input's dim."""
    text = group_text("%x: f32[\"s0*s1\", 4]", """
        %v = aten.view.default(%x) {size = [-1, 8]} : f32[s0, "4*s1"]
        %g = aten.relu.default(%v) : f32[s0, "4*s1"]""", "%g: f32[s0, \"4*s1\"]")
    group = next(n for n in parse_graph(text).nodes if n.region is not None)
    reason = codegen.supports(group, registry)
    assert reason is not None and "has no value in the kernel" in reason.message, reason


def test_a_symbolic_scalar_attribute_is_declined_with_a_reason(registry, codegen):
    """An op argument that is a size expression, not a number, has no C constant (and the
    structural hash does not renumber symbols in attributes): declined, not a crash."""
    text = group_text("%a: f32[s0, 8]", """
        %m = aten.mul.Tensor(%a) {other = "s0"} : f32[s0, 8]""", "%m: f32[s0, 8]")
    group = next(n for n in parse_graph(text).nodes if n.region is not None)
    reason = codegen.supports(group, registry)
    assert reason is not None and "other = 's0' has no C value" in reason.message, reason


def test_outputs_of_other_layouts_are_walked_in_their_own_order(check):
    """q and v copied as they are and k transposed, to contiguous, in one group (attention
    at a symbolic length): k's copy is a nest of its own in its own order, so no index is
    delinearised per element (a division by a runtime size); an output computed from a
    value another output also needs stays in that output's walk."""
    t, tt = "f32[4, s0, 8]", "f32[4, 8, s0]"
    text = group_text(f"%q: {t}, %k: {t}, %v: {t}", f"""
        %kt = aten.transpose.int(%k) {{dim0 = 1, dim1 = 2}} : {tt} strided["8*s0", 1, 8]
        %a = aten.clone.default(%q) : {t}
        %b = aten.clone.default(%kt) {{memory_format = #contiguous_format}} : {tt}
        %c = aten.clone.default(%v) : {t}""", f"%a: {t}, %b: {tt}, %c: {t}")
    compiled = check.compile(text)
    kernel = check.codegen.generate(compiled.choices[0].node, check.registry)
    assert kernel.metadata["nests"] == 2
    for loop in kernel.source.split("#pragma omp simd")[1:]:
        body = loop[loop.index("{"):loop.index("}")]
        assert "/ S_0" not in body and "% S_0" not in body, body
    for s in (1, 3, 17, 0):
        q, k, v = (torch.randn(4, s, 8) for _ in range(3))
        compare(compiled(q, k, v), check.reference(text, q, k, v), exact=True)
    shared = group_text(f"%k: {t}", f"""
        %e = aten.exp.default(%k) : {t}
        %et = aten.transpose.int(%e) {{dim0 = 1, dim1 = 2}} : {tt} strided["8*s0", 1, 8]
        %b = aten.clone.default(%et) {{memory_format = #contiguous_format}} : {tt}""",
                        f"%e: {t}, %b: {tt}")
    node = check.compile(shared).choices[0].node
    assert check.codegen.generate(node, check.registry).metadata["nests"] == 1


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 9, 20])
def test_outputs_equal_in_size_only_past_a_threshold_get_nests_of_their_own(check, rows):
    """A chunked loss's gradient (``F.linear_cross_entropy`` at dynamic sizes): the weights
    of all 8 rows and those of the first chunk, ``Max(1, Min(8, s0))`` rows, came out of
    one group. The sizes are equal at every point from 8 up, so both outputs were walked
    by one loop over the chunk's rows, and the other rows of the 8 were never written
    (garbage where the chunk is shorter)."""
    chunk = '"Max(1,Min(8,s0))"'
    text = group_text(f'%g: f32[8], %n: int, %x: f32[{chunk}, s1], %c: int[s0]', f"""
        %w = aten.mul.Tensor(%g) {{other = -2}} : f32[8]
        %first = aten.slice.Tensor(%w, %n) {{dim = 0, start = 0}} : f32[{chunk}]
        %col = aten.unsqueeze.default(%first) {{dim = 1}} : f32[{chunk}, 1]
        %y = aten.mul.Tensor(%x, %col) : f32[{chunk}, s1]""",
        f"%y: f32[{chunk}, s1], %first: f32[{chunk}], %w: f32[8]")
    compiled = check.compile(text)
    assert compiled.choices[0].codegen == "cpu", compiled.choices[0].fallback_reasons
    n = max(1, min(8, rows))
    g, x = torch.randn(8), torch.randn(n, 5)
    compare(compiled(g, n, x, rows), check.reference(text, g, n, x, rows))
