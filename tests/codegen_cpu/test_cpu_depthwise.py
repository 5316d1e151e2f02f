"""Depthwise convolutions' backward by loops over the channels
(torchloom_codegen_cpu.depthwise): the three gradients are eager's
``aten.convolution_backward`` values within float rounding, with eager's layouts, for
channels-last and contiguous tensors, any kernel size, stride, padding and dilation,
channel counts past a block of 16, borders, non-finite values and signed zeros; calls it
does not take are eager's op; the codegen offers it for the backward of depthwise f32
nodes only (the forward stays eager's); compiled training steps run it (eager's
convolutions counted)."""

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
    """The backward on both sides: eager's op never called on ours, eager's values."""
    C = x.shape[1]
    args = (stride, padding, dilation, False, [0, 0], C)
    out = FORWARD(x, w, b, *args)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).contiguous(
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
    """Sums start at +0, as eager's: products of -0 give +0, in both gradients."""
    x = torch.zeros(1, 16, 5, 5).to(memory_format=CL)
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 16)
    for sign in (1.0, -1.0):
        w = torch.full((16, 1, 3, 3), -sign)
        go = (sign * x).contiguous(memory_format=CL)
        got = loops.backward(go, sign * x, w, [16], *args, [True, True, True])
        want = BACKWARD(go, sign * x, w, [16], *args, [True, True, True])
        for a, e in zip(got, want):
            assert torch.equal(torch.signbit(a), torch.signbit(e))


def calls_eager(loops, go, x, w, bias, *args) -> bool:
    """``backward`` of these: eager's values exactly, from eager's op."""
    sizes = None if bias is None else [bias.shape[0]]
    mask = [True, True, bias is not None]
    with Counting(FORWARD, BACKWARD) as counted:
        got = loops.backward(go, x, w, sizes, *args, mask)
    want = BACKWARD(go, x, w, sizes, *args, mask)
    assert all((a is None) == (e is None) and (a is None or torch.equal(a, e))
               for a, e in zip(got, want))
    return counted.calls == 1


def gradient(x, w, b, *args):
    """A gradient of the convolution's output, laid out as eager's output."""
    out = FORWARD(x.detach(), w.detach(), None if b is None else b.detach(), *args)
    return torch.randn(out.shape, dtype=out.dtype).contiguous(
        memory_format=torch.channels_last if out.is_contiguous(memory_format=CL) and
        not out.is_contiguous() else torch.contiguous_format)


def test_calls_it_does_not_take_are_eagers_op(loops):
    x, w, b = tensors(2, 8, 9, 9, 3, 3)
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 8)

    def eager(x, w, b, *args):
        return calls_eager(loops, gradient(x, w, b, *args), x, w, b, *args)
    # channels first with a channels-last weight: eager's results are channels-last
    assert eager(x.contiguous(), w.to(memory_format=CL), b, *args)
    assert eager(x.double(), w.double(), b.double(), *args)
    assert eager(x.bfloat16(), w.bfloat16(), b.bfloat16(), *args)
    two = torch.randn(16, 1, 3, 3)  # two filters per channel
    assert eager(x, two, None, *args)
    grouped = torch.randn(4, 2, 3, 3)  # two channels per group
    assert eager(x[:, :4], grouped, b[:4], [1, 1], [1, 1], [1, 1], False, [0, 0], 2)
    transposed = torch.randn(8, 1, 3, 3)
    assert eager(x, transposed, None, [1, 1], [1, 1], [1, 1], True, [0, 0], 8)
    go = gradient(x, w, b, *args)
    with pytest.raises(RuntimeError) as want:  # eager's error for what eager refuses
        BACKWARD(go, x, w, [8], [1, 1], [-1, -1], [1, 1], False, [0, 0], 8, [True] * 3)
    with pytest.raises(RuntimeError) as got:
        loops.backward(go, x, w, [8], [1, 1], [-1, -1], [1, 1], False, [0, 0], 8, [True] * 3)
    assert str(got.value) == str(want.value)
    for one in (torch.randn(2, 1, 9, 9), torch.randn(2, 8, 1, 1).to(memory_format=CL)):
        # one channel or one pixel: channels-last and
        assert one.is_contiguous()  # contiguous both, so eager picks the layouts
        C = one.shape[1]
        assert calls_eager(loops, torch.randn(2, C, *one.shape[2:]), one, w[:C], b[:C],
                           [1, 1], [1, 1], [1, 1], False, [0, 0], C)
    # a channels-first gradient of a channels-last input: eager's backward
    assert calls_eager(loops, torch.randn(2, 8, 9, 9), x, w, b, *args)


def test_under_grad_mode_a_gradient_that_needs_its_own_is_eagers(loops):
    """A double backward (the input or the output's gradient recorded by autograd) is
    eager's op, which autograd can differentiate; without grad mode, ours."""
    x, w, b = tensors(2, 8, 9, 9, 3, 3)
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 8)
    go = gradient(x, w, b, *args).requires_grad_()
    with Counting(FORWARD, BACKWARD) as counted:
        got = loops.backward(go, x, w, [8], *args, [True, True, True])
    assert counted.calls == 1 and got[0].grad_fn is not None
    with torch.no_grad(), Counting(FORWARD, BACKWARD) as counted:
        loops.backward(go, x, w, [8], *args, [True, True, True])
    assert counted.calls == 0


NODES = """\
graph @g(%x: DT[2, 8, 9, 9], %w: DT[OUT, 1, 3, 3], %go: DT[2, OUT, 9, 9]) {
  %o = aten.convolution.default(%x, %w) {stride = [1, 1], padding = [1, 1], \
dilation = [1, 1], transposed = false, output_padding = [0, 0], groups = GROUPS} : DT[2, OUT, 9, 9]
  %gx, %gw = aten.convolution_backward.default(%go, %x, %w) {bias_sizes = none, \
stride = [1, 1], padding = [1, 1], dilation = [1, 1], transposed = false, \
output_padding = [0, 0], groups = GROUPS, output_mask = [true, true, false]} : \
DT[2, 8, 9, 9], DT[OUT, 1, 3, 3]
  return %o, %gx, %gw
}"""


@pytest.mark.parametrize("dtype, out, groups, offered", [
    ("f32", 8, 8, True), ("f64", 8, 8, False), ("f32", 16, 8, False), ("f32", 8, 1, False)])
def test_the_codegen_offers_the_backward_of_depthwise_f32_nodes(registry, codegen, dtype, out,
                                                                groups, offered):
    text = NODES.replace("DT", dtype).replace("OUT", str(out)).replace("GROUPS", str(groups))
    if groups == 1:
        text = text.replace("f32[8, 1, 3, 3]", "f32[8, 8, 3, 3]")
    calls = library_calls(None, [codegen], registry)
    # (the forward is eager's op: faster in the models)
    assert [calls(n) is not None for n in parse_graph(text).nodes] == [False, offered]


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


@pytest.mark.parametrize("model, layout, calls, left", [
    (Block, CL, 2, 1),  # ConvNeXt's block: channels-last, the backward ours
    # channels first: the pointwise convolution both ways eager's too
    (Inverted, torch.contiguous_format, 4, 3)])
def test_a_compiled_training_step_runs_it(tmp_path, model, layout, calls, left):
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
    assert (eager_calls, compiled_calls) == (calls, left)
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
    want = FORWARD(x, w, b, *args)
    go = torch.randn(want.shape).transpose(1, 2).contiguous().transpose(1, 2)
    assert calls_eager(loops, go, x, w, b, *args)
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
