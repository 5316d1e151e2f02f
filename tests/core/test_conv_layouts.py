"""Convolutional graphs traced channels-last (torchloom.frontend.conv_layouts, run by the
backend on Dynamo's graph): each conv2d reads a channels-last input, values that may
now be laid out otherwise are restored before layout-sensitive ops and at the outputs,
and the values, gradients and outputs' layouts stay eager's; graphs the rule leaves out
(no CPU f32/bf16 conv2d of static sizes, the option off, oneDNN off, a restore that
would break an alias) are as they were."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.backend import torchloom_backend
from torchloom.errors import PipelineError
from torchloom.frontend import conv_layouts

from test_dense_layouts import dynamo_graph

F = torch.nn.functional
CL = torch.channels_last


def channels_last_reads(gm) -> int:
    return sum(n.op == "call_method" and n.target == "contiguous" and
               n.kwargs.get("memory_format") == CL for n in gm.graph.nodes)


def restores(gm) -> list[str]:
    """The users of each ``.contiguous()`` that restores a row-major layout."""
    return [str(user.target) for n in gm.graph.nodes
            if n.op == "call_method" and n.target == "contiguous" and
            n.kwargs.get("memory_format") == torch.contiguous_format for user in n.users]


def block(x, w1, w2, bn, wf, *, view=False, in_place=False, permute=False):
    """A residual block in ResNet's shape (optionally with ConvNeXt's permuted layer norm,
    a ``view`` of an activation, an in-place residual sum); returns logits and the last
    activation."""
    y = F.max_pool2d(torch.relu(F.batch_norm(F.conv2d(x, w1, None, 2, 3), *bn[:2], *bn[2:],
                                             training=True)), 3, 2, 1)
    z = F.conv2d(y, w2, None, 1, 1)
    if permute:
        z = F.layer_norm(z.permute(0, 2, 3, 1), (z.shape[1],)).permute(0, 3, 1, 2)
    if in_place:
        z += y
    else:
        z = z + y
    z = torch.relu(z)
    feat = z.view(z.shape[0], z.shape[1], -1).mean(-1) if view else \
        F.adaptive_avg_pool2d(z, 1).flatten(1)
    return F.linear(feat, wf), z


def _inputs(c=8, side=64, dtype=torch.float32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)

    def make(*s):
        t = (torch.randn(*s, generator=g) * 0.5).to(dtype)
        return t.requires_grad_(bool(grad))
    bn = (torch.zeros(c, dtype=dtype), torch.ones(c, dtype=dtype), make(c), make(c))
    x = make(2, 3, side, side).requires_grad_(grad == "input")
    return x, make(c, 3, 7, 7), make(c, c, 3, 3), bn, make(10, c)


def _run(fn, args, options=None, **kw):
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: fn(*a, **kw), backend="torchloom",
                             options=options)
    return compiled(*args)


def _own_statistics(args):
    """``args`` with running statistics of their own (each run updates them in place, and
    eager's backward checks they were not changed since its forward)."""
    if len(args) < 4:
        return args
    bn = args[3]
    return (*args[:3], (bn[0].clone(), bn[1].clone(), *bn[2:]), *args[4:])


def _check_against_eager(fn, args, grads=False, options=None, **kw):
    want = fn(*args, **kw)
    got = _run(fn, _own_statistics(args), options, **kw)
    for a, b in zip(want, got):
        assert a.stride() == b.stride()
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    if grads:
        leaves = [t for t in (args[0], args[1], args[2], args[4], *args[3][2:])
                  if t.requires_grad]
        gw = torch.autograd.grad(sum(o.sum() for o in want), leaves)
        gg = torch.autograd.grad(sum(o.sum() for o in got), leaves)
        for a, b in zip(gw, gg):
            assert a.stride() == b.stride()
            torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-3)


def test_each_convolution_reads_a_channels_last_input():
    args = _inputs()
    gm = dynamo_graph(block, *args)
    assert conv_layouts.make_channels_last(gm) == 2
    assert channels_last_reads(gm) == 4  # (inputs and weights)
    assert restores(gm) == ["output"]  # (z, returned: its traced layout is row-major)
    graphs = []

    def rewritten(gm, example_inputs):  # (Dynamo's graph run by eager, as rewritten)
        graphs.append(conv_layouts.make_channels_last(gm))
        return gm.forward
    torch._dynamo.reset()
    want = block(*args)
    got = torch.compile(block, backend=rewritten)(*_own_statistics(args))
    assert graphs == [2]
    for a, b in zip(want, got):
        assert a.stride() == b.stride()
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_a_view_reads_its_tensor_restored():
    gm = dynamo_graph(lambda *a: block(*a, view=True), *_inputs())
    assert conv_layouts.make_channels_last(gm) == 2
    assert "view" in restores(gm)


def test_an_in_place_sum_before_a_restored_view_is_laid_out():
    """``z += y`` writes a convolution's result; the ``view`` reads the ReLU after it, a
    tensor nothing writes: the restoring copy is never seen."""
    gm = dynamo_graph(lambda *a: block(*a, view=True, in_place=True), *_inputs())
    assert conv_layouts.make_channels_last(gm) == 2


_W = torch.randn(8, 3, 3, 3, generator=torch.Generator().manual_seed(5))


def _written_copy(x):  # eager's contiguous() of a row-major tensor is that tensor
    y = F.conv2d(x, _W, padding=1)
    z = y.contiguous()
    z.add_(1)
    return y


def _written_reshape(x):  # eager's reshape is a view
    y = F.conv2d(x, _W, padding=1)
    y.reshape(2, -1).mul_(2)
    return y


def _view_then_setitem(x):
    y = F.conv2d(x, _W, padding=1)
    v = y.view(2, -1)
    y[:, 0] = 0
    return v


def _slice_then_power(x):  # y **= 2 is operator.ipow, not a known op: restored, written
    y = F.conv2d(x, _W, padding=1)
    z = y[0]
    y **= 2
    return z


def _aliasing_outputs(x):
    y = F.conv2d(x, _W, padding=1)
    return y, y[0]


def _positional_inplace(x):  # nn.LeakyReLU(inplace=True) passes it positionally
    y = F.conv2d(x, _W, padding=1)
    F.leaky_relu(y.reshape(2, -1), 0.5, True)
    return y


def _unknown_in_place(x):  # not a known op: restored, and the copy written
    y = F.conv2d(x, _W, padding=1)
    F.celu(y, 1.0, True)
    return y


def _foreach_write(x):
    y = F.conv2d(x, _W, padding=1)
    torch._foreach_mul_([y], 2.0)
    return y


def _aten_write(x):  # an OpOverload's name is "mul_.Tensor"
    y = F.conv2d(x, _W, padding=1)
    torch.ops.aten.mul_.Tensor(y.reshape(2, -1), torch.tensor(2.0))
    return y


def _statistics_in_a_view(x):  # the norm writes its running mean, a view of y
    y = F.conv2d(x, _W, padding=1)
    F.batch_norm(y, y.reshape(-1)[:8], torch.ones(8), training=True, momentum=0.5)
    return y


@pytest.mark.parametrize("fn", [_written_copy, _written_reshape, _view_then_setitem,
                                _slice_then_power, _aliasing_outputs, _positional_inplace,
                                _unknown_in_place, _foreach_write, _aten_write,
                                _statistics_in_a_view])
def test_a_copy_eager_would_not_make_leaves_the_graph(fn):
    """Where a copy made for the layout could be seen (a tensor aliasing it written
    after it, outputs aliasing each other), nothing is laid out, and the values and
    aliases are eager's (found by two hostile reviewers)."""
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    assert conv_layouts.make_channels_last(dynamo_graph(fn, x)) == 0
    want = fn(x)
    torch._dynamo.reset()
    got = torch.compile(fn, backend="torchloom")(x)
    for a, b in zip(want if isinstance(want, tuple) else (want,),
                    got if isinstance(got, tuple) else (got,)):
        torch.testing.assert_close(b, a)
    if fn is _aliasing_outputs:
        got[0].zero_()
        assert not got[1].any()  # (a view of the first output, as in eager)


def _padded_head(x, w1, w2, bn, wf):
    """MobileNetV2's shape of it in Hugging Face: TF-style padding before each
    convolution, and the pooled features flattened then dropped out in place."""
    y = torch.relu(F.conv2d(F.pad(x, (0, 1, 0, 1)), w1, None, 2))
    y = F.conv2d(F.pad(y, (1, 1, 1, 1)), w2)
    pooled = F.adaptive_avg_pool2d(y, 1).flatten(1)
    return F.linear(F.dropout(pooled, 0.0, True, True), wf), y


def test_padding_and_a_flattened_pool_written_in_place_are_laid_out():
    args = _inputs()
    assert conv_layouts.make_channels_last(dynamo_graph(_padded_head, *args)) == 2
    _check_against_eager(_padded_head, args)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_other_dtypes_are_left(dtype):
    gm = dynamo_graph(block, *_inputs(dtype=dtype))
    assert conv_layouts.make_channels_last(gm) == 0


def test_small_convolutions_are_left():
    """Every convolution reads fewer than MIN_NUMEL elements (2 x 3 x 32 x 32)."""
    gm = dynamo_graph(block, *_inputs(side=32))
    assert conv_layouts.make_channels_last(gm) == 0


def test_symbolic_sizes_and_1d_convolutions_are_left():
    args = _inputs()
    gm = dynamo_graph(block, *args, dynamic=True)
    assert conv_layouts.make_channels_last(gm) == 0
    x, w = torch.randn(2, 4, 50), torch.randn(8, 4, 3)
    gm = dynamo_graph(lambda x, w: torch.relu(F.conv1d(x, w)), x, w)
    assert conv_layouts.make_channels_last(gm) == 0


def test_without_onednn_the_graph_is_left():
    gm = dynamo_graph(block, *_inputs())
    with torch.backends.mkldnn.flags(enabled=False):
        assert conv_layouts.make_channels_last(gm) == 0


@pytest.mark.parametrize("kw", [{}, {"view": True}, {"in_place": True}, {"permute": True},
                                {"view": True, "in_place": True}])
def test_values_gradients_and_layouts_are_eagers(kw):
    """The weights' gradients (the input needs none: the first convolution reads it
    channels-last)."""
    args = _inputs(grad=True)
    assert conv_layouts.make_channels_last(dynamo_graph(block, *args)) == 2 or \
        kw.get("view") and kw.get("in_place")
    _check_against_eager(block, args, grads=True, **kw)


def test_an_input_needing_a_gradient_is_read_as_it_is():
    """Its gradient keeps eager's row-major layout: the convolutions after it, reading
    values computed from it, are left too."""
    args = _inputs(grad="input")
    assert conv_layouts.make_channels_last(dynamo_graph(block, *args)) == 0
    _check_against_eager(block, args, grads=True)


def test_a_channels_last_program_keeps_its_layouts():
    """Inputs already channels-last (a user's choice): its outputs stay channels-last."""
    x, w1, w2, bn, wf = _inputs()

    def fn(x, w1, w2):
        a = F.conv2d(x, w1, None, 1, 3)
        return a, torch.relu(F.conv2d(a, w2, None, 1, 1)) * 2
    args = (x.contiguous(memory_format=CL), w1.contiguous(memory_format=CL), w2)
    _check_against_eager(fn, args)
    gm = dynamo_graph(fn, *args)
    assert conv_layouts.make_channels_last(gm) == 2
    assert restores(gm) == []  # (restored to their traced channels-last layout)


def test_a_channels_last_input_gives_eagers_weight_gradient():
    """Eager's weight gradient beside a channels-last input is channels-last: left as
    traced, not made row-major like the weight."""
    x, w1, *_ = _inputs()
    x = x.contiguous(memory_format=CL)
    w1 = w1.detach().requires_grad_()

    def fn(x, w):
        return torch.relu(F.conv2d(x, w, None, 1, 3))
    want = torch.autograd.grad(fn(x, w1).sum(), w1)[0]
    torch._dynamo.reset()
    got = torch.autograd.grad(torch.compile(fn, backend="torchloom")(x, w1).sum(), w1)[0]
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_option_turns_it_off_and_is_checked():
    _check_against_eager(block, _inputs(), options={"channels_last": False})
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(PipelineError, match="option channels_last must be True or False"):
        torchloom_backend(gm, [torch.ones(2)], options={"channels_last": "yes"})


@settings(max_examples=12, deadline=None)
@given(c=st.sampled_from([3, 8, 16, 20]), side=st.integers(53, 80),
       bf16=st.booleans(), view=st.booleans(), in_place=st.booleans(),
       permute=st.booleans(), seed=st.integers(0, 99))
def test_random_blocks_give_eagers_values_and_layouts(c, side, bf16, view, in_place,
                                                      permute, seed):
    dtype = torch.bfloat16 if bf16 else torch.float32
    args = _inputs(c, side, dtype, seed=seed)
    want = block(*args, view=view, in_place=in_place, permute=permute)
    got = _run(block, _own_statistics(args), view=view, in_place=in_place, permute=permute)
    tol = dict(rtol=3e-2, atol=3e-2) if bf16 else dict(rtol=1e-4, atol=1e-4)
    for a, b in zip(want, got):
        assert a.stride() == b.stride()
        torch.testing.assert_close(b, a, **tol)
