"""Depthwise convolutions by loops over the channels (torchloom_codegen_cpu.depthwise): the
forward and the three gradients are eager's ``aten.convolution`` and
``aten.convolution_backward`` values within float rounding, with eager's layouts, for
channels-last and contiguous tensors, any kernel size, stride, padding and dilation,
channel counts past a block of 16, borders, non-finite values and signed zeros; calls it
does not take are eager's op; the codegen offers it for depthwise f32 nodes only; compiled
training steps run it (eager's convolutions counted)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from torchloom.api import parse_graph
from torchloom.runtime.executor import library_calls
from torchloom_codegen_cpu import depthwise

from conftest import Counting, compiled

ATEN = torch.ops.aten
FORWARD = ATEN.convolution.default
BACKWARD = ATEN.convolution_backward.default
CL = torch.channels_last


@pytest.fixture(scope="module")
def loops(codegen):
    """The codegen's depthwise convolutions, the library built and checked."""
    found = codegen._depthwise
    assert found._loaded() is not None, "the depthwise library did not build or agree"
    return found


def tensors(N, C, H, W, KH, KW, bias=True, seed=0, layout="last"):
    """Input (channels-last, or contiguous for ``layout="first"``), weight, bias."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, H, W, generator=g)
    x = x.to(memory_format=CL) if layout == "last" else x
    w = torch.randn(C, 1, KH, KW, generator=g)
    return x, w, torch.randn(C, generator=g) if bias else None


def same(got, want, atol=1e-4):
    assert (got is None) == (want is None)
    if want is not None:
        assert got.shape == want.shape and got.stride() == want.stride()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=atol, equal_nan=True)


def check(loops, x, w, b, stride, padding, dilation, mask=(True, True, True), seed=1):
    """Both directions on both sides: eager's op never called on ours, eager's values."""
    C = x.shape[1]
    args = (stride, padding, dilation, False, [0, 0], C)
    with Counting(FORWARD, BACKWARD) as counted:
        got = loops.forward(x, w, b, *args)
    # (a contiguous input's forward is eager's op, by the module's rule)
    assert counted.calls == x.is_contiguous(), "the forward ran eager's op"
    want = FORWARD(x, w, b, *args)
    same(got, want)
    go = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed)).contiguous(
        memory_format=torch.contiguous_format if x.is_contiguous() else CL)
    mask = [mask[0], mask[1], mask[2] and b is not None]
    sizes = [C] if b is not None else None
    with Counting(FORWARD, BACKWARD) as counted:
        got = loops.backward(go, x, w, sizes, *args, mask)
    # (a gradient of one output pixel is both layouts: eager's op, by the module's rule)
    both = go.is_contiguous() and go.is_contiguous(memory_format=CL)
    assert counted.calls == both, "the backward ran eager's op"
    want = BACKWARD(go, x, w, sizes, *args, mask)
    terms = x.shape[0] * want[0].shape[2] * want[0].shape[3] if want[0] is not None else 1
    for asked, a, e, tol in zip(mask, got, want, (1e-4, 1e-4 * terms ** 0.5,
                                                1e-4 * terms ** 0.5)):
        # (eager's oneDNN path gives the weight's gradient with the bias's unasked)
        same(a, e if asked or both else None, atol=tol)


# ConvNeXt's blocks (7x7, padding 3) at its four stages, smaller images
@pytest.mark.parametrize("layout", ["last", "first"])
@pytest.mark.parametrize("C, H", [(32, 28), (64, 14), (128, 7), (256, 4)])
def test_convnext_blocks_match_eager(loops, C, H, layout):
    check(loops, *tensors(2, C, H, H, 7, 7, layout=layout), [1, 1], [3, 3], [1, 1])


@pytest.mark.parametrize("K, stride, padding, dilation", [
    (3, [1, 1], [1, 1], [1, 1]), (3, [2, 2], [1, 1], [1, 1]), (5, [2, 1], [2, 0], [1, 2]),
    (1, [1, 1], [0, 0], [1, 1]), (3, [1, 1], [0, 0], [3, 3]), (7, [3, 3], [4, 4], [1, 1])])
@pytest.mark.parametrize("C", [2, 15, 17, 40])
def test_strides_paddings_dilations_and_channel_tails_match_eager(loops, K, stride, padding,
                                                                   dilation, C):
    check(loops, *tensors(2, C, 11, 9, K, K), stride, padding, dilation)


@pytest.mark.parametrize("mask", [(True, False, False), (False, True, False),
                                  (False, False, True), (False, True, True)])
def test_each_gradient_alone_matches_eager(loops, mask):
    check(loops, *tensors(1, 20, 10, 10, 3, 3), [1, 1], [1, 1], [1, 1], mask=mask)


@settings(max_examples=60, deadline=None)
@given(N=st.integers(1, 3), C=st.integers(2, 40), H=st.integers(1, 12), W=st.integers(1, 12),
       KH=st.integers(1, 7), KW=st.integers(1, 7), sh=st.integers(1, 3), sw=st.integers(1, 3),
       ph=st.integers(0, 4), pw=st.integers(0, 4), dh=st.integers(1, 3), dw=st.integers(1, 3),
       bias=st.booleans(), seed=st.integers(0, 1000), layout=st.sampled_from(["last", "first"]))
def test_any_geometry_matches_eager(loops, N, C, H, W, KH, KW, sh, sw, ph, pw, dh, dw, bias,
                                    seed, layout):
    assume(H + 2 * ph >= dh * (KH - 1) + 1 and W + 2 * pw >= dw * (KW - 1) + 1 and H * W > 1)
    check(loops, *tensors(N, C, H, W, KH, KW, bias, seed, layout), [sh, sw], [ph, pw],
          [dh, dw], seed=seed)


@pytest.mark.parametrize("where", ["input", "weight"])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_values_give_eagers(loops, where, bad):
    x, w, b = tensors(2, 18, 8, 8, 3, 3)
    if where == "input":
        x[0, 3, 0, 0] = bad  # (a corner: read by taps that other pixels skip as padding)
        x[1, 17, 4, 5] = bad
    else:
        w[0, 0, 0, 0] = bad
        w[17, 0, 1, 1] = bad
    check(loops, x, w, b, [1, 1], [1, 1], [1, 1])


def test_signed_zeros_are_eagers(loops):
    """Eager adds the bias to a sum started at +0: a bias of -0 on products of -0 gives
    +0."""
    x = torch.zeros(1, 16, 5, 5).to(memory_format=CL)
    for sign in (1.0, -1.0):
        w = torch.full((16, 1, 3, 3), -sign)
        for b in (torch.full((16,), -0.0), None):
            args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 16)
            got, want = loops.forward(sign * x, w, b, *args), FORWARD(sign * x, w, b, *args)
            assert torch.equal(torch.signbit(got), torch.signbit(want))


def calls_eager(loops, *args) -> bool:
    """``forward(*args)``: eager's values exactly, from eager's op."""
    with Counting(FORWARD, BACKWARD) as counted:
        got = loops.forward(*args)
    assert torch.equal(got, FORWARD(*args))
    return counted.calls == 1


def test_calls_it_does_not_take_are_eagers_op(loops):
    x, w, b = tensors(2, 8, 9, 9, 3, 3)
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 8)
    # channels first with a channels-last weight: eager's results are channels-last
    assert calls_eager(loops, x.contiguous(), w.to(memory_format=CL), b, *args)
    assert calls_eager(loops, x.double(), w.double(), b.double(), *args)
    assert calls_eager(loops, x.bfloat16(), w.bfloat16(), b.bfloat16(), *args)
    two = torch.randn(16, 1, 3, 3)  # two filters per channel
    assert calls_eager(loops, x, two, None, *args)
    grouped = torch.randn(4, 2, 3, 3)  # two channels per group
    assert calls_eager(loops, x[:, :4], grouped, b[:4], [1, 1], [1, 1], [1, 1], False, [0, 0], 2)
    transposed = torch.randn(8, 1, 3, 3)
    assert calls_eager(loops, x, transposed, None, [1, 1], [1, 1], [1, 1], True, [0, 0], 8)
    needs = x.clone().requires_grad_()
    assert calls_eager(loops, needs, w, b, *args)
    with pytest.raises(RuntimeError) as want:  # eager's error for what eager refuses
        FORWARD(x, w, b, [1, 1], [-1, -1], [1, 1], False, [0, 0], 8)
    with pytest.raises(RuntimeError) as got:
        loops.forward(x, w, b, [1, 1], [-1, -1], [1, 1], False, [0, 0], 8)
    assert str(got.value) == str(want.value)
    for one in (torch.randn(2, 1, 9, 9), torch.randn(2, 8, 1, 1).to(memory_format=CL)):
        # one channel or one pixel: channels-last and
        assert one.is_contiguous()  # contiguous both, so eager picks the layouts
        assert calls_eager(loops, one, w[:one.shape[1]], b[:one.shape[1]], [1, 1], [1, 1],
                           [1, 1], False, [0, 0], one.shape[1])
    go = torch.randn(2, 8, 9, 9)  # a channels-first gradient: eager's backward
    with Counting(FORWARD, BACKWARD) as counted:
        got = loops.backward(go, x, w, [8], *args, [True, True, True])
    want = BACKWARD(go, x, w, [8], *args, [True, True, True])
    assert counted.calls == 1 and all(torch.equal(a, e) for a, e in zip(got, want))


NODE = """\
graph @g(%x: DT[2, 8, 9, 9], %w: DT[OUT, 1, 3, 3]) {
  %o = aten.convolution.default(%x, %w) {stride = [1, 1], padding = [1, 1], \
dilation = [1, 1], transposed = false, output_padding = [0, 0], groups = GROUPS} : DT[2, OUT, 9, 9]
  return %o
}"""


@pytest.mark.parametrize("dtype, out, groups, offered", [
    ("f32", 8, 8, True), ("f64", 8, 8, False), ("f32", 16, 8, False), ("f32", 8, 1, False)])
def test_the_codegen_offers_it_for_depthwise_f32_nodes(registry, codegen, dtype, out, groups,
                                                       offered):
    text = NODE.replace("DT", dtype).replace("OUT", str(out)).replace("GROUPS", str(groups))
    if groups == 1:
        text = text.replace("%w: f32[8, 1, 3, 3]", "%w: f32[8, 8, 3, 3]")
    calls = library_calls(None, [codegen], registry)
    assert [calls(n) is not None for n in parse_graph(text).nodes] == [offered]


class Block(torch.nn.Module):
    """ConvNeXt's block: a depthwise 7x7 convolution, a norm over channels, an MLP."""

    def __init__(self, C=24):
        super().__init__()
        self.dw = torch.nn.Conv2d(C, C, 7, padding=3, groups=C)
        self.norm = torch.nn.LayerNorm(C)
        self.up, self.down = torch.nn.Linear(C, 4 * C), torch.nn.Linear(4 * C, C)

    def forward(self, x):
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        return x + self.down(torch.nn.functional.gelu(self.up(y))).permute(0, 3, 1, 2)


class Inverted(torch.nn.Module):
    """MobileNet's inverted residual's tail, channels first: a depthwise 3x3 convolution, a
    batch norm, ReLU6, a pointwise convolution."""

    def __init__(self, C=24):
        super().__init__()
        self.dw = torch.nn.Conv2d(C, C, 3, padding=1, groups=C, bias=False)
        self.norm = torch.nn.BatchNorm2d(C)
        self.pw = torch.nn.Conv2d(C, C, 1)

    def forward(self, x):
        return x + self.pw(torch.nn.functional.relu6(self.norm(self.dw(x))))


@pytest.mark.parametrize("model, layout, left", [
    (Block, CL, 0),  # ConvNeXt's block: channels-last, both directions ours
    # channels first: the depthwise forward and the pointwise convolution both ways eager's
    (Inverted, torch.contiguous_format, 3)])
def test_a_compiled_training_step_runs_it(tmp_path, model, layout, left):
    torch.manual_seed(0)
    model = model()
    _, fn = compiled(model, tmp_path)
    x = torch.randn(2, 24, 14, 14).contiguous(memory_format=layout).requires_grad_()
    fn(x).sum().backward()  # compiled (its tracing runs torch's ops on fake tensors)
    model.zero_grad()
    runs = []
    for f in (model, fn):
        x.grad = None
        with torch.profiler.profile() as profiled:  # (a dispatch mode stops dynamo)
            out = f(x)
            out.square().mean().backward()
        eager_calls = sum(e.count for e in profiled.key_averages()
                          if e.key in ("aten::convolution", "aten::convolution_backward"))
        runs.append((out.detach(), x.grad.clone(), [p.grad.clone() for p in model.parameters()],
                     eager_calls))
        model.zero_grad()
    (want, wx, w_grads, eager_calls), (got, gx, g_grads, compiled_calls) = runs
    assert (eager_calls, compiled_calls) == (2 + 2 * (left > 0), left)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gx, wx, rtol=1e-4, atol=1e-6)
    for g, w in zip(g_grads, w_grads):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-5)


def test_a_pixel_column_laid_out_by_a_transpose_gets_eagers_layouts(loops):
    """A 1-D convolution written as a 2-D one over ``x.transpose(1, 2).unsqueeze(-1)``:
    the input is channels-last for ``is_contiguous`` but not for eager's suggested memory
    format (the stride of the width of 1 differs), so eager's results are contiguous:
    eager's op runs, and the layouts (which the compiled graph's views were traced with)
    are eager's."""
    x = torch.randn(2, 20, 8).transpose(1, 2).unsqueeze(-1)  # [2, 8, 20, 1]
    w, b = torch.randn(8, 1, 3, 1), torch.randn(8)
    args = ([1, 1], [1, 0], [1, 1], False, [0, 0], 8)
    assert x.is_contiguous(memory_format=CL) and not x.is_contiguous()
    assert calls_eager(loops, x, w, b, *args)
    want = FORWARD(x, w, b, *args)
    go = torch.randn(want.shape).transpose(1, 2).contiguous().transpose(1, 2)
    got = loops.backward(go, x, w, [8], *args, [True, True, True])
    for a, e in zip(got, BACKWARD(go, x, w, [8], *args, [True, True, True])):
        assert a.stride() == e.stride() and torch.equal(a, e)


def test_a_compiled_conv1d_as_a_2d_depthwise_convolution_is_eagers(tmp_path):
    class Conv1d(torch.nn.Module):
        def __init__(self, C=8):
            super().__init__()
            self.dw = torch.nn.Conv2d(C, C, (3, 1), padding=(1, 0), groups=C)

        def forward(self, x):  # x: [N, L, C]
            z = self.dw(x.transpose(1, 2).unsqueeze(-1))
            return torch.softmax(z.flatten(1), -1).view(x.shape[0], -1, x.shape[1]) * 2

    torch.manual_seed(0)
    model = Conv1d()
    _, fn = compiled(model, tmp_path)
    x = torch.randn(2, 20, 8, requires_grad=True)
    got = fn(x)
    got.sum().backward()
    gx = x.grad.clone()
    x.grad = None
    want = model(x)
    want.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gx, x.grad, rtol=1e-4, atol=1e-6)


def test_loading_the_library_draws_nothing_from_the_callers_random_stream(codegen):
    fresh = depthwise.Depthwise(lambda: codegen._depthwise._library.path())
    torch.manual_seed(7)
    state = torch.get_rng_state()
    assert fresh._loaded() is not None
    assert torch.equal(torch.get_rng_state(), state)


def test_a_bias_that_needs_its_gradient_is_eagers_under_grad_mode(loops):
    x, w, b = tensors(2, 8, 9, 9, 3, 3)
    b.requires_grad_()
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 8)
    with Counting(FORWARD, BACKWARD) as counted:
        got = loops.forward(x, w, b, *args)
    assert counted.calls == 1 and got.grad_fn is not None
    with torch.no_grad():
        with Counting(FORWARD, BACKWARD) as counted:
            loops.forward(x, w, b, *args)
    assert counted.calls == 0
