"""Views of tensors laid out as their types say are one strided view each
(``codegen/restride.py``): chains of views of a matmul's result or of a guarded input fold
into one ``_restride`` call per view something reads, and every such view has eager's
sizes, strides (of dims longer than 1), storage offset, storage and values."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from torchloom.codegen import plan as plan_module
from torchloom.codegen.plan import build_function
from torchloom.codegen.restride import strides_of
from torchloom.frontend.fx import import_fx
from torchloom.ir import parse_graph
from torchloom.ir.types import TensorType
from torchloom.ops.aten import default_registry


def _plan(fn, inputs, fold=True, monkeypatch=None):
    gm = make_fx(fn)(*inputs)
    graph = import_fx(gm, inputs).graph
    if not fold:
        monkeypatch.setattr(plan_module, "fold_views", lambda *a, **k: frozenset())
    return build_function(graph, default_registry())


def _same_view(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    if got.numel() == 0:  # an empty view's strides and offset address nothing (and follow
        return            # the strides of size-1 dims before it, which torch sets freely)
    assert got.storage_offset() == want.storage_offset()
    for n, a, b in zip(got.shape, got.stride(), want.stride()):
        assert n <= 1 or a == b, (got.stride(), want.stride())
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _chain(a, b):
    m = a @ b  # f32[6, 8], a new row-major tensor
    x, y = m.split(4, -1)
    heads = m.view(6, 2, 4).transpose(0, 1)
    return (x.transpose(0, 1).unsqueeze(0), y[1:, 2].view(-1), m.narrow(0, -2, 1),
            m.select(1, -1), heads, heads * 2, m.t().expand(3, 8, 6))


def test_a_chain_of_views_of_a_matmul_is_one_call_per_view_read():
    a, b = torch.randn(6, 5), torch.randn(5, 8)
    plan = _plan(_chain, [a, b])
    calls = [line.split(" = ")[1].split("(")[0] for line in plan.source.splitlines()
             if " = " in line]
    assert calls.count("_restride") == 6, plan.source  # one per view read
    assert len(calls) == 6 + 2, plan.source  # and the matmul and the multiply
    got, want = plan.fn(a, b), _chain(a, b)
    for g, w in zip(got, want):
        _same_view(g, w)
    storages = {t.untyped_storage().data_ptr() for i, t in enumerate(got) if i != 5}
    assert len(storages) == 1  # views of the one matmul result


def test_views_of_what_may_be_laid_out_otherwise_are_left_to_torch():
    """A graph input without guards and an op's result whose layout is not promised
    (``sort`` values) are viewed by the view ops themselves."""
    def fn(x):
        s = x.sort(-1).values
        return x.t().unsqueeze(0), s.transpose(0, 1)
    plan = _plan(fn, [torch.randn(4, 6)])
    assert "_restride" not in plan.source, plan.source
    x = torch.randn(4, 6)
    for g, w in zip(plan.fn(x), fn(x)):
        _same_view(g, w)


def test_gradients_on_views_are_autograd_views():
    """With gradients on (a plan run outside aot_autograd), each view is ``as_strided``:
    the base's version counter and autograd history; with them off, the same values."""
    a = torch.randn(6, 5, requires_grad=True)
    b = torch.randn(5, 8, requires_grad=True)
    plan = _plan(_chain, [a.detach(), b.detach()])
    got = plan.fn(a, b)
    want = _chain(a, b)
    assert all(g.grad_fn is not None for g in got)
    weights = [torch.randn(w.shape) for w in want]
    grads = torch.autograd.grad(sum((g * w).sum() for g, w in zip(got, weights)), (a, b))
    expect = torch.autograd.grad(sum((g * w).sum() for g, w in zip(want, weights)), (a, b))
    for g, w in zip(grads, expect):
        torch.testing.assert_close(g, w)
    with torch.no_grad():
        for g, w in zip(plan.fn(a, b), _chain(a, b)):
            _same_view(g, w)


def test_a_view_written_in_place_writes_its_base():
    """A view made by restriding is the base's memory: writing it writes the base."""
    text = """graph @g(%a: f32[4, 3], %b: f32[3, 6]) {
  %mm = aten.mm.default(%a, %b) : f32[4, 6]
  %t = aten.t.default(%mm) : f32[6, 4] strided[1, 6]
  %s = aten.select.int(%t) {dim = 0, index = 2} : f32[4] strided[6]
  %w = aten.add_.Scalar(%s) {other = 1.0} : f32[4] strided[6]
  return %mm, %w
}
"""
    graph = parse_graph(text)
    plan = build_function(graph, default_registry())
    a, b = torch.randn(4, 3), torch.randn(3, 6)
    mm, w = plan.fn(a, b)
    expected = a @ b
    expected[:, 2] += 1
    torch.testing.assert_close(mm, expected)
    assert w.storage_offset() == 2 and w.stride() == (6,)


def test_a_graph_reshaping_a_tensor_in_place_folds_nothing():
    """After ``t_`` the view it transposed is no longer laid out as its type said: a
    graph with such an op keeps its view ops."""
    def fn(a, b):
        m = a @ b
        v = m.view(2, 12)
        v.t_()
        return v.view(-1, 4) if v.is_contiguous() else v.unsqueeze(0), m.t()
    a, b = torch.randn(4, 3), torch.randn(3, 6)
    plan = _plan(fn, [a, b])
    assert "_restride" not in plan.source, plan.source
    for g, w in zip(plan.fn(a, b), fn(a, b)):
        _same_view(g, w)


def test_guarded_inputs_are_bases_and_symbolic_sizes_read_from_them():
    """A compiled graph's guarded inputs are laid out as their types: their views fold,
    symbolic sizes (``s0``) read from the input's shape."""
    text = """graph @g(%x: f32[s0, 12], %n: int) {
  %v = aten.view.default(%x, %n) {size = [$1, 3, 4]} : f32[s0, 3, 4]
  %p = aten.permute.default(%v) {dims = [2, 0, 1]} : f32[4, s0, 3] strided[1, 12, 4]
  %l = aten.split.Tensor(%p) {dim = 2, split_size = 2} : f32[4, s0, 2] strided[1, 12, 4]
  %r = aten.slice.Tensor(%p) {dim = 1, start = 1, end = 9223372036854775807} : f32[4, "s0 - 1", 3] strided[1, 12, 4]
  return %l, %r
}
"""
    graph = parse_graph(text)
    plan = build_function(graph, default_registry(), guards=True,
                          fallback=lambda args, i: pytest.fail(f"guard failed: {i}"))
    assert plan.source.count("_restride(") == 2 and "sym_s0 = a0.shape[0]" in plan.source, \
        plan.source
    for rows in (2, 5, 9):
        x = torch.randn(rows, 12)
        left, rest = plan.fn(x, rows)
        v = x.view(rows, 3, 4).permute(2, 0, 1)
        _same_view(left, v.split(2, 2)[0])
        _same_view(rest, v[:, 1:])


_VIEWS = ("transpose", "permute", "unsqueeze", "squeeze", "expand", "split", "select",
          "slice", "narrow", "view", "t")


def _apply(x: torch.Tensor, op: str, draw) -> torch.Tensor | None:
    """``x`` viewed by ``op`` with drawn arguments, or None where it does not apply."""
    r = x.dim()
    dim = draw(st.integers(-r, r - 1)) if r else None
    if op == "transpose" and r >= 2:
        return x.transpose(dim, draw(st.integers(-r, r - 1)))
    if op == "permute" and r >= 1:
        return x.permute(draw(st.permutations(range(r))))
    if op == "unsqueeze" and r < 5:
        return x.unsqueeze(draw(st.integers(-r - 1, r)))
    if op == "squeeze" and r and x.shape[dim] == 1:
        return x.squeeze(dim)
    if op == "expand" and 1 in x.shape:
        return x.expand(*[draw(st.integers(1, 3)) if n == 1 else n for n in x.shape])
    if op in ("split", "select", "slice", "narrow") and r and x.shape[dim] > 0:
        n = x.shape[dim]
        if op == "split":
            parts = x.split(draw(st.integers(1, n)), dim)
            return parts[draw(st.integers(0, len(parts) - 1))]
        if op == "select" and r >= 2:
            return x.select(dim, draw(st.integers(-n, n - 1)))
        if op == "slice":
            start = draw(st.integers(-n - 2, n + 2))
            index = [slice(None)] * (dim % r) + [slice(start, None, draw(st.integers(1, 3)))]
            return x[tuple(index)]
        if op == "narrow":
            start = draw(st.integers(-n, n - 1))
            return x.narrow(dim, start, draw(st.integers(0, n - start % n)))
    if op == "view" and r >= 2 and x.stride(-2) == x.shape[-1] * x.stride(-1):
        return x.view(*x.shape[:-2], x.shape[-2] * x.shape[-1])  # the last two dims merge
    if op == "t" and r <= 2:
        return x.t()
    return None


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_chains_of_views_match_eager(data):
    m, k, n = (data.draw(st.integers(1, 7)) for _ in range(3))
    ops = data.draw(st.lists(st.sampled_from(_VIEWS), min_size=1, max_size=6))
    # the drawn arguments are fixed once, then replayed by tracing and by eager
    steps, probe = [], torch.empty(m, n)
    for op in ops:
        args = []
        out = _apply(probe, op, lambda s: args.append(data.draw(s)) or args[-1])
        if out is not None:
            steps.append((op, args))
            probe = out
    read = data.draw(st.lists(st.booleans(), min_size=len(steps), max_size=len(steps)))

    def fn(a, b):
        x = a @ b
        outs = []
        for (op, args), keep in zip(steps, read):
            replay = iter(args)
            x = _apply(x, op, lambda s: next(replay))
            if keep:
                outs.append(x)
        return (*outs, x, x * 2)

    a, b = torch.randn(m, k), torch.randn(k, n)
    plan = _plan(fn, [a, b])
    for got, want in zip(plan.fn(a, b), fn(a, b)):
        _same_view(got, want)


def test_symbolic_strides_are_products_of_the_later_dims():
    t = TensorType.make(["s0", 4, "s1", 2])
    assert strides_of(t) == ("8*(s1)", "2*(s1)", 2, 1)
    assert strides_of(TensorType.make([3, 4])) == (4, 1)


def _round_trips(a, b, w):
    m = a @ b  # f32[6, 8]
    back = m.t().t()  # laid out as m: m itself
    flat = m.view(2, 3, 8).view(6, 8)  # so is this
    return back, flat @ w, m.t().t() * 2


def test_a_view_laid_out_as_its_base_is_the_base():
    """``t().t()`` and a view back to its base's sizes: no view made, the base itself read
    (and returned: a graph output that no other output is)."""
    a, b, w = torch.randn(6, 5), torch.randn(5, 8), torch.randn(8, 3)
    plan = _plan(_round_trips, [a, b, w])
    assert "_restride" not in plan.source, plan.source
    got, want = plan.fn(a, b, w), _round_trips(a, b, w)
    for g, x in zip(got, want):
        _same_view(g, x)


def test_two_outputs_laid_out_as_one_base_stay_two_tensors():
    """Two outputs that are views of one base laid out as it (a weight gradient returned
    twice, say) are two tensors: the base once, a view of it the other time."""
    def fn(a, b):
        m = a @ b
        return m.t().t(), m.view(6, 8)
    a, b = torch.randn(6, 5), torch.randn(5, 8)
    plan = _plan(fn, [a, b])
    got = plan.fn(a, b)
    assert got[0] is not got[1]
    for g, x in zip(got, fn(a, b)):
        _same_view(g, x)


def test_an_input_laid_out_as_its_view_is_viewed_when_returned():
    """A view of a graph input returned whole stays a view (an output that is an input is
    another thing to torch)."""
    def fn(x):
        return x.view(4, 6), x.t().t() + 1
    x = torch.randn(4, 6)
    graph = import_fx(make_fx(fn)(x), [x]).graph
    plan = build_function(graph, default_registry(), guards=True, fallback=lambda *a: None)
    got = plan.fn(x)
    assert got[0] is not x
    for g, w in zip(got, fn(x)):
        _same_view(g, w)
