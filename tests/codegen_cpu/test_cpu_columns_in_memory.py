"""Reductions whose one kept dim is innermost in memory but not by shape (channels-last
activations summed over N, H and W: a batch norm's gradients in a convolutional model laid
out channels-last) take the column form: the reduced elements walked in memory order, one
SIMD loop over a block of channels each, read at ``r * C + x`` (no division per element),
and the outputs computed per channel from the sums (the weight gradient ``sum * weight``)
stored after them. Eager's values at any sizes, dtypes and special values."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import group_text

DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16}
TOLERANCE = {"f32": dict(rtol=1e-4, atol=1e-4), "f64": {},
             "bf16": dict(rtol=2e-2, atol=2e-2)}


def _types(shape, dtype: str, last: bool) -> tuple[str, str, str]:
    n, c, h, w = shape
    strides = [c * h * w, 1, w * c, c] if last else [c * h * w, h * w, w, 1]
    t = f"{dtype}[{n}, {c}, {h}, {w}] strided[{', '.join(map(str, strides))}]"
    return t, f"{dtype}[1, {c}, 1, 1]", f"{dtype}[{c}]"


def _norm_backward(shape, dtype: str, last: bool = True) -> str:
    """A batch norm's backward through a ReLU, returning the per-channel weight gradient
    (a sum times the weight) and a keepdim view of a scaled sum beside the sums and the
    input gradient."""
    n, c, h, w = shape
    t, k, v = _types(shape, dtype, last)
    scale = 1.0 / (n * h * w)
    return group_text(f"%g: {t}, %y: {t}, %x: {t}, %m: {k}, %s: {v}", f"""
        %d = aten.threshold_backward.default(%g, %y) {{threshold = 0}} : {t}
        %c = aten.sub.Tensor(%x, %m) : {t}
        %p = aten.mul.Tensor(%d, %c) : {t}
        %a = aten.sum.dim_IntList(%p) {{dim = [0, 2, 3]}} : {v}
        %b = aten.sum.dim_IntList(%d) {{dim = [0, 2, 3]}} : {v}
        %ws = aten.mul.Tensor(%a, %s) : {v}
        %a1 = aten.mul.Tensor(%a) {{other = {scale!r}}} : {v}
        %b1 = aten.mul.Tensor(%b) {{other = {scale!r}}} : {v}
        %a3 = aten.view.default(%a1) {{size = [1, {c}, 1, 1]}} : {k}
        %b3 = aten.view.default(%b1) {{size = [1, {c}, 1, 1]}} : {k}
        %e = aten.mul.Tensor(%c, %a3) : {t}
        %f = aten.sub.Tensor(%d, %e) : {t}
        %o = aten.sub.Tensor(%f, %b3) : {t}""", f"%ws: {v}, %b: {v}, %b3: {k}, %o: {t}")


def _memory(t: torch.Tensor) -> torch.Tensor:
    """A dense tensor's elements in memory order, as a 1-D view."""
    return t.as_strided((t.numel(),), (1,))


def _inputs(shape, dtype: str, last: bool, seed: int, special=None):
    g = torch.Generator().manual_seed(seed)
    fmt = torch.channels_last if last else torch.contiguous_format

    def make(s):
        return (torch.randn(s, generator=g, dtype=torch.float64) * 2).to(DTYPES[dtype])
    grad, y, x = (make(shape).contiguous(memory_format=fmt) for _ in range(3))
    if special is not None:
        _memory(grad)[seed % grad.numel()] = special
        _memory(x)[seed * 7 % x.numel()] = special
    return grad, y, x, make((1, shape[1], 1, 1)), make((shape[1],))


def test_channels_last_gradients_walk_memory_in_order(check):
    """ResNet's stem in channels-last: 32 channels of 2 x 112 x 112 pixels, read at
    ``r * 32 + x`` in blocks of channels; no division of ``r``, no stride-32 rows."""
    shape = (2, 32, 112, 112)
    text = _norm_backward(shape, "f32")
    source = check.source(text)
    assert "in_g[r * 32 + x]" in source and "out_o[r * 32 + x]" in source
    assert "r / 12544" not in source and "r % 112" not in source
    assert "for (int64_t xb = 0; xb < n_xb; xb++)" in source  # (the column form's blocks)
    assert "rl" not in source  # (not the row form's lanes over a strided row)
    check(text, *_inputs(shape, "f32", True, 0), **TOLERANCE["f32"])


def test_nchw_gradients_keep_the_row_form(check):
    """The same group laid out NCHW: rows of a channel lie in memory; the row form."""
    source = check.source(_norm_backward((2, 4, 32, 32), "f32", last=False))
    assert "xb" not in source and "for (int64_t x = 0; x < 4; x++)" in source


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 3), c=st.integers(1, 40), h=st.integers(1, 9), w=st.integers(1, 13),
       dtype=st.sampled_from(sorted(DTYPES)), last=st.booleans(), seed=st.integers(0, 999),
       special=st.sampled_from([None, float("nan"), float("inf"), -0.0]))
def test_any_sizes_dtypes_and_values_give_eagers_values(check, n, c, h, w, dtype, last,
                                                        seed, special):
    shape = (n, c, h, w)
    check(_norm_backward(shape, dtype, last), *_inputs(shape, dtype, last, seed, special),
          **TOLERANCE[dtype])


@pytest.mark.parametrize("shape", [(2, 24, 9, 7), (1, 64, 5, 5), (3, 17, 4, 6)])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_maxima_and_a_sum_reading_a_mean_give_eagers_values(check, shape, dtype):
    """Maxima and minima per channel, and a sum of squared deviations from the channel's
    mean (a walk reading an earlier walk's result), channels-last, with per-channel
    outputs computed from the results."""
    n, c, h, w = shape
    t, k, v = _types(shape, dtype, True)
    text = group_text(f"%a: {t}, %s: {v}", f"""
        %hi = aten.amax.default(%a) {{dim = [0, 2, 3]}} : {v}
        %lo = aten.amin.default(%a) {{dim = [0, 2, 3], keepdim = true}} : {k}
        %m = aten.mean.dim(%a) {{dim = [0, 2, 3], keepdim = true}} : {k}
        %d = aten.sub.Tensor(%a, %m) : {t}
        %q = aten.mul.Tensor(%d, %d) : {t}
        %ss = aten.sum.dim_IntList(%q) {{dim = [0, 2, 3]}} : {v}
        %r = aten.mul.Tensor(%ss, %s) : {v}
        %span = aten.sub.Tensor(%hi, %s) : {v}""", f"%r: {v}, %span: {v}, %lo: {k}, %d: {t}")
    g = torch.Generator().manual_seed(3)
    a = torch.randn(shape, generator=g, dtype=DTYPES[dtype]).contiguous(
        memory_format=torch.channels_last)
    _memory(a)[5] = float("nan")
    assert "for (int64_t xb = 0; xb < n_xb; xb++)" in check.source(text)  # (column form)
    check(text, a, torch.randn(c, generator=g, dtype=DTYPES[dtype]), **TOLERANCE[dtype])
