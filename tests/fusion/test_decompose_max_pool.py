"""fusion.decompose of ``max_pool2d_with_indices`` on the CPU: each window element read
through a padded, strided view of the input and kept as eager's loop keeps it (greater than
the maximum so far, or NaN), so the kernel making a channels-last input (a batch norm and a
ReLU in inference) computes the pool. Values and indices bit for bit eager's at every
geometry (NaN payloads aside), decomposed only where it pays (channels-last, indices
unread, a window of at most 25 elements)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchloom.api import decomposition_table
from torchloom.tools import Compiler

from fusion_testing import strides_that_show
from test_decompose_cat import _ops as _compiled_ops

POOL = torch.ops.aten.max_pool2d_with_indices.default
CL = torch.channels_last


def _values(shape, dtype, g, layout):
    """Small integers (ties), -0.0 beside +0.0, NaN, +-inf."""
    x = torch.randint(-3, 4, shape, generator=g).to(torch.float64)
    x = torch.where((x == 0) & (torch.rand(x.shape, generator=g) < 0.5), -0.0, x)
    special = torch.rand(shape, generator=g)
    x[special < 0.03] = float("nan")
    x[(special > 0.03) & (special < 0.06)] = float("inf")
    x[(special > 0.06) & (special < 0.12)] = float("-inf")
    x = x.to(dtype)
    if layout == "transposed":  # (neither layout: eager reads a contiguous copy)
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    return x.contiguous(memory_format=CL) if layout == "cl" and x.dim() == 4 else x


@st.composite
def _pools(draw):
    rank = draw(st.sampled_from([3, 4]))
    shape = [draw(st.integers(1, 3))] if rank == 4 else []
    shape += [draw(st.integers(1, 6)), draw(st.integers(1, 12)), draw(st.integers(1, 12))]
    kernel = [draw(st.integers(1, 4)), draw(st.integers(1, 4))]
    stride = draw(st.sampled_from([[], [1, 1], [2, 2], [3, 2], [1, 3]]))
    padding = [draw(st.integers(0, k // 2)) for k in kernel]
    return (shape, kernel, stride, padding, draw(st.booleans()),
            draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16])),
            draw(st.sampled_from(["cl", "contiguous", "transposed"])),
            draw(st.integers(0, 2 ** 16)))


def _bits(t):
    """NaN made one value (eager's bf16 kernel rounds its payloads), -0.0 kept apart."""
    t = torch.where(t.isnan(), torch.zeros((), dtype=t.dtype), t)
    return t.view({torch.float32: torch.int32, torch.float64: torch.int64,
                   torch.bfloat16: torch.int16, torch.float16: torch.int16}[t.dtype])


@settings(max_examples=400, deadline=None)
@given(_pools())
def test_the_decomposition_is_eager_s_pool_bit_for_bit(case):
    shape, kernel, stride, padding, ceil_mode, dtype, layout, seed = case
    g = torch.Generator().manual_seed(seed)
    x = _values(shape, dtype, g, layout)
    try:
        values, indices = POOL(x, kernel, stride, padding, [1, 1], ceil_mode)
    except RuntimeError:  # (an output of no elements: eager raises, so does the table)
        with pytest.raises(RuntimeError):
            decomposition_table([POOL], "cpu")[POOL](x, kernel, stride, padding, [1, 1],
                                                     ceil_mode)
        return
    got, got_indices = decomposition_table([POOL], "cpu")[POOL](x, kernel, stride, padding,
                                                                [1, 1], ceil_mode)
    assert got.shape == values.shape and strides_that_show(got) == strides_that_show(values)
    assert strides_that_show(got_indices) == strides_that_show(indices)
    assert got_indices.dtype == torch.int64
    assert torch.equal(got.isnan(), values.isnan())
    assert torch.equal(_bits(got), _bits(values))
    assert torch.equal(got_indices, indices)


def test_torch_s_decomposition_where_this_one_does_not_apply():
    """A dilation: torch's own decomposition, eager's values."""
    table = decomposition_table([POOL], "cpu")
    x = torch.randn(2, 3, 9, 9)
    for args in (([3, 3], [2, 2], [1, 1], [2, 2], False),):
        for want, got in zip(POOL(x, *args), table[POOL](x, *args)):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("shape", [(1, 0, 5, 5), (0, 5, 5), (2, 3, 0, 5), (2, 3, 5, 0)])
def test_an_empty_plane_raises_eager_s_error(shape):
    x = torch.randn(shape)
    with pytest.raises(RuntimeError, match="Expected 3D or 4D"):
        POOL(x, [2, 2])
    with pytest.raises(RuntimeError, match="Expected 3D or 4D"):
        decomposition_table([POOL], "cpu")[POOL](x, [2, 2])


def test_an_empty_batch_pools_to_an_empty_batch():
    x = torch.randn(0, 3, 5, 5).contiguous(memory_format=CL)
    got, want = decomposition_table([POOL], "cpu")[POOL](x, [2, 2]), POOL(x, [2, 2])
    assert got[0].shape == want[0].shape and got[1].shape == want[1].shape


class _Stem(torch.nn.Module):
    """ResNet's stem: convolution, batch norm, ReLU, 3 x 3 max pool, then a convolution."""

    def __init__(self, channels=16, kernel=3, stride=2, padding=1):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 7, 2, 3, bias=False)
        self.bn = torch.nn.BatchNorm2d(channels)
        self.pool = torch.nn.MaxPool2d(kernel, stride, padding)
        self.out = torch.nn.Conv2d(channels, channels, 1)

    def forward(self, x):
        return self.out(self.pool(torch.relu(self.bn(self.conv(x)))))


@pytest.mark.parametrize("size, kernel, stride, padding", [
    (64, 3, 2, 1), (80, 2, 2, 0), (75, 3, 1, 1), (98, 5, 3, 2)])
def test_an_inference_stem_pools_in_the_norm_s_kernel(size, kernel, stride, padding):
    """Channels-last (the layout pass), indices unread: no pool op left, the norm, the
    ReLU and the pool one kernel; eager's values."""
    torch._dynamo.reset()
    torch.manual_seed(size)
    model = _Stem(16, kernel, stride, padding).eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, size, size)
    compiler = Compiler(keep_ir=True)
    compiled = torch.compile(model, backend="torchloom", options={"compiler": compiler})
    with torch.no_grad():
        got, want = compiled(x), model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    ops = _compiled_ops(compiler)
    assert ops["aten.max_pool2d_with_indices.default"] == 0, ops
    assert ops["torchloom.fusion_group"] <= 3, ops  # the input's copy, the stem, the output's
    assert {c.codegen for c in compiler.compilations[-1].compiled.choices} == {"cpu"}
    torch._dynamo.reset()


def test_a_training_step_keeps_the_pool_whose_indices_its_gradient_reads():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, ref = _Stem(16), _Stem(16)
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 64, 64)
    compiler = Compiler(keep_ir=True)
    compiled = torch.compile(model, backend="torchloom", options={"compiler": compiler})
    compiled(x).square().sum().backward()
    ref(x).square().sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        # (sums over 8,192 pixels in other orders: within 1e-5 of the gradient's scale)
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4,
                                   atol=1e-5 * float(q.grad.abs().max()))
    assert _compiled_ops(compiler)["aten.max_pool2d_with_indices.default"] == 1
    torch._dynamo.reset()


def test_a_dilated_pool_is_left_to_eager_s_op():
    """(A dilation other than 1 is not this decomposition's; torch's, which the pass would
    otherwise trace, reads the window through an unfold.)"""
    torch._dynamo.reset()
    compiler = Compiler(keep_ir=True)

    def fn(x):
        return torch.nn.functional.max_pool2d(x * 1, 2, 1, 0, dilation=2)
    x = torch.randn(2, 4, 3, 3).contiguous(memory_format=CL)
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), fn(x), rtol=0, atol=0)
    assert _compiled_ops(compiler)["aten.max_pool2d_with_indices.default"] == 1
    torch._dynamo.reset()


def test_a_contiguous_pool_is_left_to_eager_s_op():
    """NCHW (no convolution to lay out): its kernel would read two elements a lane apart;
    the op stays (the cpu codegen runs large ones through a channels-last copy)."""
    torch._dynamo.reset()
    compiler = Compiler(keep_ir=True)

    def fn(x):
        return torch.nn.functional.max_pool2d(torch.relu(x * 2), 3, 2, 1)
    x = torch.randn(2, 8, 32, 32)
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), fn(x), rtol=0, atol=0)
    assert _compiled_ops(compiler)["aten.max_pool2d_with_indices.default"] == 1
    torch._dynamo.reset()


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.integers(2, 9), st.integers(5, 20), st.integers(1, 3), st.integers(1, 3),
       st.booleans(), st.integers(0, 99))
def test_a_channels_last_pool_of_special_values_gives_eager_s_values(
        channels, size, kernel, stride, ceil_mode, seed):
    """A channels-last input made by a pointwise op (NaN, +-inf, -0.0 and ties in it),
    indices unread: the compiled pool's values bit for bit eager's."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(seed)
    x = _values([2, channels, size, size], torch.float32, g, "cl")
    padding = kernel // 2

    def fn(x):
        return torch.nn.functional.max_pool2d(x * 1.5 - 0.5, kernel, stride, padding,
                                              ceil_mode=ceil_mode)
    compiler = Compiler(keep_ir=True)
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler})
    with torch.no_grad():
        got, want = compiled(x), fn(x)
    assert got.shape == want.shape and strides_that_show(got) == strides_that_show(want)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(_bits(got), _bits(want))
    assert _compiled_ops(compiler)["aten.max_pool2d_with_indices.default"] == 0
    torch._dynamo.reset()
