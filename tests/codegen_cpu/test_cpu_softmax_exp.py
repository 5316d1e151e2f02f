"""Softmax's shift ``a - max(a)`` (keepdim) is <= 0 or NaN, and the cpu codegen computes
its exp with ``tl_exp_nonpos`` (one power-of-two scale instead of two, no upper clamp):
bit for bit tl_exp's results wherever it is used, and used only where the argument is that
shift (op_text.py ``minus_max``); a maximum of other elements, of another layout, or a
scaled shift keeps ``tl_exp``. The reduction's row buffer lives in the output row where
the last loop stores that output."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchloom.api import parse_graph

from conftest import group_text
from torchloom_codegen_cpu.op_text import minus_max

INF, NAN = float("inf"), float("nan")


def _kernel(codegen, registry, inputs: str, body: str, outputs: str):
    node = next(parse_graph(group_text(inputs, body, outputs)).nodes)
    assert codegen.supports(node, registry) is None
    kernel = codegen.generate(node, registry)
    (launch,) = codegen.load_many([kernel], registry)
    body = kernel.source[kernel.source.index("/* torchloom cpu kernel"):]  # no prelude
    return body, launch


def _softmax(dtype: str, rows, cols, dim: int = 1, tail: str | None = None) -> str:
    """The body of softmax as fusion.decompose leaves it over ``dtype[rows, cols]``
    (amax, sub, exp, sum, div; ``tail`` replaces the div)."""
    t, r = f"{dtype}[{rows}, {cols}]", f"{dtype}[{rows}, 1]"
    return (f"%m = aten.amax.default(%a) {{dim = [{dim}], keepdim = true}} : {r}\n"
            f"%s = aten.sub.Tensor(%a, %m) : {t}\n%e = aten.exp.default(%s) : {t}\n"
            f"%u = aten.sum.dim_IntList(%e) {{dim = [{dim}], keepdim = true}} : {r}\n"
            + (tail or f"%d = aten.div.Tensor(%e, %u) : {t}"))


def _shifts(rows: int, cols: int) -> torch.Tensor:
    """Rows whose maximum is 0 and whose other elements sweep [-110, 0] densely (results
    from 1 through subnormals to 0), and rows with the edge values."""
    x = torch.linspace(-110, 0, rows * cols).reshape(rows, cols)
    x[:, -1] = 0.0
    edge = torch.tensor([[-INF, -0.0, 1e-45, -1e-45, -87.33655, -103.28, -103.97, -104.5,
                          -88.0, -0.5, 3.0, 2.0],
                         [1.0, NAN, 2.0, -INF, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                         [-INF] * 12,
                         [INF, 1.0, -INF, INF, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                         [3e38, -3e38, 1e-40, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    return torch.cat([x[:, :12], edge])


def test_shifted_exp_is_tl_exp_bit_for_bit(codegen, registry):
    x = _shifts(4096, 12)
    n = x.shape[0]
    shifted, launch = _kernel(
        codegen, registry, f"%a: f32[{n}, 12]",
        f"%m = aten.amax.default(%a) {{dim = [1], keepdim = true}} : f32[{n}, 1]\n"
        f"%s = aten.sub.Tensor(%a, %m) : f32[{n}, 12]\n"
        f"%e = aten.exp.default(%s) : f32[{n}, 12]", f"%s: f32[{n}, 12], %e: f32[{n}, 12]")
    assert "tl_exp_nonpos(" in shifted
    s, e = launch(x)
    plain, launch_plain = _kernel(codegen, registry, f"%a: f32[{n}, 12]",
                                  f"%e = aten.exp.default(%a) : f32[{n}, 12]",
                                  f"%e: f32[{n}, 12]")
    assert "tl_exp_nonpos(" not in plain and "tl_exp(" in plain
    (want,) = launch_plain(s)
    torch.testing.assert_close(e, want, rtol=0, atol=0, equal_nan=True)
    assert (s[~s.isnan()] <= 0).all()
    # and against float64 (tl_exp's 1.03 ulp): subnormals within one step of 2^-149
    ref = torch.exp(s.double()).float()
    torch.testing.assert_close(e, ref, rtol=2.5e-7, atol=2 ** -149, equal_nan=True)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_rows_use_the_shifted_exp_and_match_eager(codegen, registry, dtype, op):
    """softmax and log_softmax as fusion.decompose leaves them (amax, sub, exp, sum, ...)
    on rows with NaN, +-inf and large magnitudes: eager's values."""
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    x = _shifts(64, 12).to(torch_dtype)
    n = x.shape[0]
    t = f"{dtype}[{n}, 12]"
    tail = f"%l = aten.log.default(%u) : {dtype}[{n}, 1]\n%d = aten.sub.Tensor(%s, %l) : {t}"
    source, launch = _kernel(codegen, registry, f"%a: {t}",
                             _softmax(dtype, n, 12, -1, None if op == "softmax" else tail),
                             f"%d: {t}")
    assert "tl_exp_nonpos(" in source
    (got,) = launch(x)
    fn = torch.softmax if op == "softmax" else torch.log_softmax
    want = fn(x.float(), -1).to(torch_dtype) if dtype != "f32" else fn(x, -1)
    tol = {"f32": 1e-6, "bf16": 1e-2, "f16": 1e-3}[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)


NOT_SHIFTS = {
    "another tensor": ("%m = aten.amax.default(%b) {dim = [1], keepdim = true} : f32[8, 1]\n"
                       "%s = aten.sub.Tensor(%a, %m) : f32[8, 8]"),
    "scaled": ("%m = aten.amax.default(%a) {dim = [1], keepdim = true} : f32[8, 1]\n"
               "%s = aten.sub.Tensor(%a, %m) {alpha = 0.5} : f32[8, 8]"),
    "reversed": ("%m = aten.amax.default(%a) {dim = [1], keepdim = true} : f32[8, 1]\n"
                 "%s = aten.sub.Tensor(%m, %a) : f32[8, 8]"),
    "scalar": "%s = aten.sub.Tensor(%a) {other = -100.0} : f32[8, 8]",
    "minimum": ("%m = aten.amin.default(%a) {dim = [1], keepdim = true} : f32[8, 1]\n"
                "%s = aten.sub.Tensor(%a, %m) : f32[8, 8]"),
}


@pytest.mark.parametrize("case", sorted(NOT_SHIFTS))
def test_other_differences_keep_the_full_exp(codegen, registry, case):
    """Where an element can exceed the maximum it meets, exp keeps its overflow clamp and
    two-step scale: the results are eager's, inf where they overflow."""
    source, launch = _kernel(codegen, registry, "%a: f32[8, 8], %b: f32[8, 8]",
                             NOT_SHIFTS[case] + "\n%e = aten.exp.default(%s) : f32[8, 8]",
                             "%e: f32[8, 8]")
    assert "tl_exp_nonpos(" not in source and "tl_exp(" in source
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    a = torch.linspace(-200, 200, 64)[perm].reshape(8, 8)
    b = torch.full((8, 8), -50.0)
    (got,) = launch(a, b)
    m = {"another tensor": lambda: b.amax(1, True), "scaled": lambda: a.amax(1, True) * 0.5,
         "reversed": lambda: -a.amax(1, True), "minimum": lambda: a.amin(1, True),
         "scalar": lambda: torch.tensor(-100.0)}[case]()
    s = (a - m) if case != "reversed" else (a.amax(1, True) - a)
    want = torch.exp(s)
    assert torch.isinf(want).any()  # each case reaches exp's overflow
    # (arguments up to 400: their last-ulp differences between C and eager, times e^x)
    torch.testing.assert_close(got, want, rtol=3e-5, atol=0)


def test_softmax_row_buffer_is_the_output_row(codegen, registry):
    """f32 softmax keeps exp in the output's row (eager's order), no stack array; bf16's
    output has no f32 room, so it keeps the stack array."""
    for dtype, in_output in (("f32", True), ("bf16", False)):
        t = f"{dtype}[16, 1024]"  # whole blocks of 16: one loop per pass over the row
        source, _ = _kernel(codegen, registry, f"%a: {t}", _softmax(dtype, 16, 1024, -1),
                            f"%d: {t}")
        assert ("buf_e[" not in source) == in_output, source
        # written by the exp's loop, read back by the quotient's, overwritten there
        assert (source.count("out_d[x * 1024 + r]") == 3) == in_output, source


def test_a_maximum_of_other_rows_is_no_shift():
    """A transposed maximum, and one without keepdim (broadcast along the leading dim),
    meet elements of other rows. (The codegen declines these groups: a reduction read at
    other elements than its row; the rule must not rely on that.)"""
    graph = parse_graph(group_text(
        "%a: f32[8, 8]",
        "%k = aten.amax.default(%a) {dim = [1], keepdim = true} : f32[8, 1]\n"
        "%m = aten.permute.default(%k) {dims = [1, 0]} : f32[1, 8]\n"
        "%s = aten.sub.Tensor(%a, %m) : f32[8, 8]\n"
        "%t = aten.sub.Tensor(%a, %k) : f32[8, 8]\n"
        "%n = aten.amax.default(%a) {dim = [1]} : f32[8]\n"
        "%u = aten.sub.Tensor(%a, %n) : f32[8, 8]",
        "%s: f32[8, 8], %t: f32[8, 8], %u: f32[8, 8]"))
    s, t, u = next(graph.nodes).region.outputs
    assert not minus_max(s) and minus_max(t) and not minus_max(u)


@pytest.mark.parametrize("dtype", ["i8", "i32"])
def test_an_integer_shift_keeps_the_full_exp(codegen, registry, dtype):
    """An integer a - max(a) wraps (int8: -128 - 127 is 1): exp meets positive arguments
    and overflows to inf where eager does."""
    t = f"{dtype}[2, 4]"
    source, launch = _kernel(
        codegen, registry, f"%a: {t}",
        f"%m = aten.amax.default(%a) {{dim = [1], keepdim = true}} : {dtype}[2, 1]\n"
        f"%s = aten.sub.Tensor(%a, %m) : {t}\n%e = aten.exp.default(%s) : f32[2, 4]",
        "%e: f32[2, 4]")
    assert "tl_exp_nonpos(" not in source
    torch_dtype = {"i8": torch.int8, "i32": torch.int32}[dtype]
    a = torch.tensor([[-128, 127, 0, 5], [-7, 100, -100, 3]]).to(torch_dtype)
    (got,) = launch(a)
    want = torch.exp(a - a.amax(1, keepdim=True))
    torch.testing.assert_close(got, want, rtol=2e-6, atol=0)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 40), scale=st.sampled_from([1.0, 30.0, 1e4]),
       special=st.lists(st.sampled_from([INF, -INF, NAN, -0.0, 0.0, 1e-45]), max_size=4),
       keep_exp=st.booleans())
def test_random_softmax_rows_match_eager(codegen, registry, rows, cols, scale, special,
                                         keep_exp):
    """Random row lengths and magnitudes, special values placed at random; the exp also
    an output (then it is no buffer in the quotient's row)."""
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    x = torch.randn(rows, cols, generator=g) * scale
    for k, v in enumerate(special):
        x.view(-1)[(k * 7919) % x.numel()] = v
    t = f"f32[{rows}, {cols}]"
    outputs = f"%d: {t}" + (f", %e: {t}" if keep_exp else "")
    _, launch = _kernel(codegen, registry, f"%a: {t}", _softmax("f32", rows, cols), outputs)
    got = launch(x)
    e = torch.exp(x - x.amax(1, keepdim=True))
    want = [e / e.sum(1, keepdim=True)] + ([e] if keep_exp else [])
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_, w, rtol=1e-6, atol=1e-7, equal_nan=True)


def test_symbolic_rows_keep_exp_in_the_output_row(check):
    """A row of symbolic length has no stack buffer (it may not fit), but the output's row
    serves at any length: exp is computed once per element, and every size matches eager
    (empty rows and rows, rows longer than the stack buffer's limit, special values)."""
    t = "f32[s0, s1]"
    text = group_text(f"%a: {t}", _softmax("f32", "s0", "s1"), f"%d: {t}")
    compiled = check.compile(text)
    kernel = check.codegen.generate(compiled.choices[0].node, check.registry)
    body = kernel.source[kernel.source.index("/* torchloom cpu kernel"):]
    # once per copy of the sum's row loops (threaded and not, chosen at run time by the
    # size): its whole blocks, its masked last block, a row shorter than a block (lanes.py)
    sums = len(re.findall(r"acc_sum\d+_lanes\[16\];", body))
    assert body.count("tl_exp_nonpos(") == 3 * sums >= 3, body
    assert "buf_" not in body, body
    for rows, cols in [(3, 5), (1, 1), (0, 4), (4, 0), (2, 40000)]:
        a = torch.randn(rows, cols) * 20
        if a.numel() > 2:
            a.view(-1)[0], a.view(-1)[-1] = float("-inf"), float("nan")
        (got,) = compiled(a)
        torch.testing.assert_close(got, torch.softmax(a, 1), rtol=1e-6, atol=1e-7,
                                   equal_nan=True)
