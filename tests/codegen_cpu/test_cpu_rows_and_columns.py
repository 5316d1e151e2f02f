"""Column sums carried by the row nest (rows_and_columns.py): a group of row reductions and
sums over the other dims of the same shape (layer_norm's backward) is one nest whose threads add
their rows' column operands into partials; the values match eager (and, on one thread,
are bitwise the two-nest form's: the same double sums in the same order), at every thread
count and for the shapes the rule takes; other shapes keep the column nest."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import compiled
from torchloom.testing.reductions import group_text, randn, with_nans
from torchloom_codegen_cpu import rows_and_columns as colsums

F = torch.nn.functional


def _ln_backward(rows: int, n: int, dtype: str = "f32", recompute: bool = False) -> str:
    """layer_norm's backward group over [rows, n] (the shape aot_autograd hands over):
    dx, and the weight and bias gradients as column sums; ``recompute``: the statistics
    computed in the group (the column operand reads row results)."""
    t, k, c = f"{dtype}[{rows}, {n}]", f"{dtype}[{rows}, 1]", f"{dtype}[{n}]"
    stats = f"""
        %v, %m = aten.var_mean.correction(%x) {{correction = 0, dim = [1], keepdim = true}} : {k}, {k}
        %e = aten.add.Tensor(%v) {{other = 1e-05}} : {k}
        %r = aten.rsqrt.default(%e) : {k}""" if recompute else ""
    inputs = f"%g: {t}, %w: {c}, %x: {t}" + ("" if recompute else f", %m: {k}, %r: {k}")
    return group_text(inputs, stats + f"""
        %t0 = aten.mul.Tensor(%g, %w) : {t}
        %t1 = aten.mul.Tensor(%t0) {{other = {n}}} : {t}
        %t2 = aten.sum.dim_IntList(%t0) {{dim = [1], keepdim = true}} : {k}
        %t3 = aten.sub.Tensor(%x, %m) : {t}
        %t4 = aten.mul.Tensor(%t3, %r) : {t}
        %t5 = aten.mul.Tensor(%t0, %t4) : {t}
        %t6 = aten.sum.dim_IntList(%t5) {{dim = [1], keepdim = true}} : {k}
        %t7 = aten.mul.Tensor(%t4, %t6) : {t}
        %t8 = aten.sub.Tensor(%t1, %t2) : {t}
        %t9 = aten.sub.Tensor(%t8, %t7) : {t}
        %t10 = aten.div.Tensor(%r) {{other = {n}}} : {k}
        %t11 = aten.mul.Tensor(%t10, %t9) : {t}
        %t13 = aten.mul.Tensor(%g, %t4) : {t}
        %t14 = aten.sum.dim_IntList(%t13) {{dim = [0]}} : {c}
        %t15 = aten.sum.dim_IntList(%g) {{dim = [0]}} : {c}""",
        f"%t11: {t}, %t14: {c}, %t15: {c}")


def _inputs(rows: int, n: int, dtype=torch.float32, recompute: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = randn(g, rows, n).to(dtype)
    ins = [randn(g, rows, n).to(dtype), randn(g, n).to(dtype), x]
    if not recompute:
        ins += [x.mean(1, keepdim=True), x.var(1, correction=0, keepdim=True).add(1e-5).rsqrt()]
    return ins


def _source(check, text: str) -> tuple[str, dict]:
    kernel = check.codegen.generate(check.compile(text).choices[0].node, check.registry)
    return kernel.source, kernel.metadata


@pytest.mark.parametrize("rows, n, recompute", [
    (64, 256, False), (3, 512, False), (1, 1024, False), (100, 768, True), (7, 4096, False)])
def test_rows_carry_the_column_sums_in_one_nest(check, rows, n, recompute):
    text = _ln_backward(rows, n, recompute=recompute)
    source, meta = _source(check, text)
    assert meta["nests"] == 1 and "colparts" in source and "xb" not in source
    check(text, *_inputs(rows, n, recompute=recompute), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("rows, n, dtype", [
    (64, 48, "f32"),     # a short row: the column nest
    (32, 1000, "f32"),   # not whole 16-lane vectors
    (16, 16384, "f32"),  # longer than MAX_ROW
    (32, 256, "bf16"),   # column sums of bf16 (rounded per element as eager does)
])
def test_other_shapes_keep_the_column_nest(check, rows, n, dtype):
    source, meta = _source(check, _ln_backward(rows, n, dtype))
    assert meta["nests"] == 2 and "colparts" not in source


def test_a_column_sum_read_by_another_op_keeps_the_column_nest(check):
    text = group_text("%a: f32[32, 256], %b: f32[256]", """
        %s = aten.sum.dim_IntList(%a) {dim = [1], keepdim = true} : f32[32, 1]
        %d = aten.div.Tensor(%a, %s) : f32[32, 256]
        %c = aten.sum.dim_IntList(%a) {dim = [0]} : f32[256]
        %e = aten.mul.Tensor(%c, %b) : f32[256]""", "%d: f32[32, 256], %e: f32[256]")
    source, meta = _source(check, text)
    assert meta["nests"] == 2 and "colparts" not in source


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_same_values_as_the_column_nest_on_one_thread_and_close_on_more(
        check, monkeypatch, threads):
    """On one thread the partial sums are the column form's sums in its order (bitwise the
    same); on more, each thread's rows are summed apart and the partials added: double
    sums, so the float results agree to rounding."""
    rows, n = 130, 512
    text = _ln_backward(rows, n)
    ins = _inputs(rows, n, seed=3)
    ins[0] = with_nans(ins[0]) if threads == 3 else ins[0]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        folded, _ = check(text, *ins, atol=1e-4, rtol=1e-5)
        monkeypatch.setattr(colsums, "MIN_ROW", 10 ** 9)
        source, meta = _source(check, text)
        assert meta["nests"] == 2
        two_nests, _ = check(text, *ins, atol=1e-4, rtol=1e-5)
    finally:
        torch.set_num_threads(before)
    for a, b in zip(folded, two_nests):
        if threads == 1:
            assert torch.equal(a.nan_to_num(), b.nan_to_num())
        else:
            torch.testing.assert_close(a, b, rtol=2e-7, atol=1e-6, equal_nan=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 40), n=st.sampled_from([256, 272, 512, 768, 1024, 2048]),
       dtype=st.sampled_from([torch.float32, torch.float64]),
       affine=st.sampled_from(["both", "weight", "none"]), threads=st.sampled_from([1, 2]),
       specials=st.lists(st.tuples(st.integers(0, 10 ** 6),
                                   st.sampled_from([float("nan"), float("inf"), -0.0, 1e-40])),
                         max_size=3))
def test_layer_norm_training_matches_eager(tmp_path_factory, rows, n, dtype, affine, threads,
                                           specials):
    """End to end through torch.compile: the gradients of x, weight and bias match eager's,
    (eager sums the weight and bias gradients in float: within its own error of the
    float64 sums), NaN and inf where eager has them."""
    torch.manual_seed(rows * 7 + n)
    x = torch.randn(rows, n, dtype=dtype)
    for pos, value in specials:
        x.view(-1)[pos % x.numel()] = value
    w = torch.randn(n, dtype=dtype) if affine != "none" else None
    b = torch.randn(n, dtype=dtype) if affine == "both" else None
    grad = torch.randn(rows, n, dtype=dtype)

    def fn(x, w, b):
        return F.layer_norm(x, (n,), w, b)

    def grads(f):
        leaves = [t.clone().requires_grad_() if t is not None else None for t in (x, w, b)]
        f(*leaves).backward(grad)
        return [t.grad for t in leaves if t is not None]

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        _, compiled_fn = compiled(fn, tmp_path_factory.mktemp("ln"))
        got, want = grads(compiled_fn), grads(fn)
    finally:
        torch.set_num_threads(before)
    tol = {"atol": 1e-3, "rtol": 1e-4} if dtype == torch.float32 else {}
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, equal_nan=True, **tol)
        assert torch.equal(g.isnan(), e.isnan())


@pytest.mark.parametrize("rows", [4, 33])
def test_a_column_variance_beside_row_sums_is_judged(check, rows):
    """Rows the rule takes (256 values) beside a column reduction of two outputs
    (``var_mean`` over dim 0): the rule unpacked every column reduction's one output and
    raised while judging, so the group ran on eager; it is not carried (no sum), and the
    cpu writes the two nests."""
    t, k = f"f32[{rows}, 256]", f"f32[{rows}]"
    text = group_text(f"%a: {t}", f"""
        %s = aten.sum.dim_IntList(%a) {{dim = [1]}} : {k}
        %v, %m = aten.var_mean.correction(%a) {{dim = [0], correction = 1}} : f32[256], f32[256]""",
        f"%s: {k}, %v: f32[256], %m: f32[256]")
    check(text, randn(torch.Generator().manual_seed(rows), rows, 256), rtol=1e-5, atol=1e-5)
