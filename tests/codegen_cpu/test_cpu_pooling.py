"""Max pooling of NCHW tensors through eager's channels-last kernel (pooling.py): eager's
values and indices bit for bit (windows of any size, stride, padding, dilation, ceil
mode; NaN, inf, -0.0 and ties in them), contiguous outputs; offered only for large static
contiguous f32/f64 pools of many channels; a compiled ResNet-like stem calls it and
gives eager's values and gradients."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.api import parse_graph

from torchloom_codegen_cpu import pooling

from conftest import compiled

OP = torch.ops.aten.max_pool2d_with_indices.default
BITS = {torch.float32: torch.int32, torch.float64: torch.int64}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype in BITS:
        a, b = a.view(BITS[a.dtype]), b.view(BITS[b.dtype])
    return a.dtype == b.dtype and torch.equal(a, b)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 20), h=st.integers(1, 24), w=st.integers(1, 24),
       k=st.integers(1, 4), s=st.integers(1, 3), p=st.integers(0, 2), d=st.integers(1, 2),
       ceil=st.booleans(), dtype=st.sampled_from([torch.float32, torch.float64]),
       seed=st.integers(0, 999))
def test_channels_last_pooling_gives_eagers_bits(n, c, h, w, k, s, p, d, ceil, dtype, seed):
    if p > k // 2 or (h + 2 * p - d * (k - 1) - 1) < 0 or (w + 2 * p - d * (k - 1) - 1) < 0:
        return  # (eager refuses such windows)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (n, c, h, w), generator=g).to(dtype)  # ties everywhere
    flat = x.view(-1)
    for value, step in ((float("nan"), 17), (float("inf"), 13), (float("-inf"), 11),
                        (-0.0, 7)):
        flat[seed % step::step] = value
    args = ([k, k], [s, s], [p, p], [d, d], ceil)
    want = OP(x, *args)
    got = pooling.max_pool(x, *args)
    assert all(_same_bits(a, b) and a.is_contiguous() for a, b in zip(got, want))


def test_other_layouts_and_recorded_calls_are_eagers_op():
    x = torch.randn(2, 16, 8, 8).contiguous(memory_format=torch.channels_last)
    got = pooling.max_pool(x, [2, 2])
    assert got[0].is_contiguous(memory_format=torch.channels_last)  # eager's op's layout
    y = torch.randn(2, 16, 8, 8, requires_grad=True)
    values, _ = pooling.max_pool(y, [2, 2])
    values.sum().backward()
    assert y.grad is not None and y.grad.sum().item() == 2 * 16 * 16


def _pool_node(shape, dtype="f32", kernel=(3, 3), strides=None):
    n, c, h, w = shape
    oh, ow = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    layout = "" if strides is None else f" strided[{', '.join(map(str, strides))}]"
    t = f"{dtype}[{n}, {c}, {oh}, {ow}]"
    text = f"""graph @g(%x: {dtype}[{n}, {c}, {h}, {w}]{layout}) {{
  %v, %i = aten.max_pool2d_with_indices.default(%x) {{kernel_size = [{kernel[0]}, {kernel[1]}], stride = [2, 2], padding = [1, 1]}} : {t}, i64[{n}, {c}, {oh}, {ow}]
  return %v, %i
}}"""
    return next(node for node in parse_graph(text).nodes if node.op == pooling.OP)


def test_offered_for_large_contiguous_float_pools_of_many_channels():
    assert pooling.offered(_pool_node((2, 32, 112, 112)))
    assert pooling.offered(_pool_node((2, 64, 56, 56), "f64"))
    assert not pooling.offered(_pool_node((2, 32, 112, 112), "bf16"))  # bits differ
    assert not pooling.offered(_pool_node((8, 3, 224, 224)))  # 3 channels
    assert not pooling.offered(_pool_node((2, 16, 32, 32)))  # small
    assert not pooling.offered(_pool_node(
        (2, 32, 112, 112), strides=(401408, 1, 3584, 32)))  # channels-last already


def test_a_compiled_stem_calls_it_with_eagers_values_and_gradients(tmp_path):
    conv = torch.nn.Conv2d(3, 32, 3, padding=1)
    pool = torch.nn.MaxPool2d(3, 2, 1)

    def stem(x):
        return pool(torch.relu(conv(x))).mean(dim=(2, 3))
    x = torch.randn(2, 3, 112, 112)
    calls = []
    original = pooling.max_pool

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)
    compiler, fn = compiled(stem, tmp_path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pooling, "max_pool", counted)
        got_x, want_x = x.clone().requires_grad_(), x.clone().requires_grad_()
        got = fn(got_x)
        want = stem(want_x)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
    assert calls == [torch.Size([2, 32, 112, 112])]
    torch.testing.assert_close(got_x.grad, want_x.grad)
