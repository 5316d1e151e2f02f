"""fusion.decompose of ``roll`` and ``constant_pad_nd`` on the CPU: the input read through
views that tile it along each rolled or padded dim (a pad's outside filled by
``masked_fill``), so the kernel reading the result computes it: Swin's shifted windows
(a zero pad, a roll, the window partition's copy; the reverse after attention) are no eager
ops between kernels. Bit for bit eager's values at every rank, dim, shift, pad and dtype,
laid out as the graph's types say; the op itself where the decomposition does not apply
(a flattened roll, sizes that are not ints, another device)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

from torchloom.api import decomposition_table
from torchloom.tools import Compiler

from fusion_testing import strides_that_show
from test_decompose_cat import _ops as _compiled_ops

ROLL = torch.ops.aten.roll.default
PAD = torch.ops.aten.constant_pad_nd.default
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.bool)


def _values(shape, dtype, g, layout):
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 4
    x[x.abs() < 0.5] = -0.0
    if x.numel():
        x.view(-1)[0] = float("nan")
    x = x.to(dtype) if dtype != torch.bool else x > 0
    if layout == "transposed" and x.dim() >= 2:
        return x.transpose(0, -1).contiguous().transpose(0, -1)
    return x.contiguous(memory_format=torch.channels_last) if layout == "cl" and \
        x.dim() == 4 else x


def _same(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    if got.dtype.is_floating_point:  # -0.0 as -0.0
        assert torch.equal(torch.signbit(got), torch.signbit(want))


def _meta_strides(op, x, *args):
    """The strides torch's fake run gives (the graph's types)."""
    with FakeTensorMode() as mode:
        return strides_that_show(op(mode.from_tensor(x), *args))


@st.composite
def _rolls(draw):
    rank = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank))
    dims = draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=3))
    shifts = [draw(st.integers(-15, 15)) for _ in dims]
    return (shape, shifts, dims, draw(st.sampled_from(DTYPES)),
            draw(st.sampled_from(["contiguous", "cl", "transposed"])),
            draw(st.integers(0, 2 ** 16)))


@settings(max_examples=300, deadline=None)
@given(_rolls())
def test_the_roll_decomposition_is_eager_s_roll_bit_for_bit(case):
    shape, shifts, dims, dtype, layout, seed = case
    x = _values(shape, dtype, torch.Generator().manual_seed(seed), layout)
    got = decomposition_table([ROLL], "cpu")[ROLL](x, shifts, dims)
    _same(got, ROLL(x, shifts, dims))
    assert strides_that_show(got) == _meta_strides(ROLL, x, shifts, dims)


@st.composite
def _pads(draw):
    rank = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank))
    pad = draw(st.lists(st.integers(-3, 4), min_size=2, max_size=2 * rank))
    pad = pad[:len(pad) // 2 * 2]
    for i in range(len(pad) // 2):  # (none left empty: eager raises there)
        n = shape[rank - 1 - i]
        while n + min(pad[2 * i], 0) + min(pad[2 * i + 1], 0) <= 0:
            pad[2 * i] = pad[2 * i + 1] = 0
    value = draw(st.sampled_from([0, 1, -100, 2.5, float("nan"), float("-inf")]))
    return (shape, pad, value, draw(st.sampled_from(DTYPES)),
            draw(st.sampled_from(["contiguous", "cl", "transposed"])),
            draw(st.integers(0, 2 ** 16)))


@settings(max_examples=300, deadline=None)
@given(_pads())
def test_the_pad_decomposition_is_eager_s_pad_bit_for_bit(case):
    shape, pad, value, dtype, layout, seed = case
    x = _values(shape, dtype, torch.Generator().manual_seed(seed), layout)
    try:
        want = PAD(x, pad, value)
    except RuntimeError:  # (a value an integer dtype cannot hold: eager raises, so do we)
        with pytest.raises(RuntimeError):
            decomposition_table([PAD], "cpu")[PAD](x, pad, value)
        return
    got = decomposition_table([PAD], "cpu")[PAD](x, pad, value)
    _same(got, want)
    assert strides_that_show(got) == strides_that_show(want) == \
        _meta_strides(PAD, x, pad, value)


def test_pytorch_s_own_samples():
    """OpInfo's samples of ``roll`` and of ``pad`` (constant) in every dtype they list."""
    from torch.testing._internal import common_methods_invocations as cmi
    table = decomposition_table([ROLL, PAD], "cpu")
    checked = 0
    for name, variant, op in (("roll", "", ROLL), ("nn.functional.pad", "constant", PAD)):
        (info,) = [o for o in cmi.op_db if o.name == name and o.variant_test_name == variant]
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool):
            for sample in info.sample_inputs("cpu", dtype):
                if op is PAD:  # F.pad(x, pad, mode="constant", value=v)
                    args = (sample.args[0], sample.kwargs.get("value", 0))
                else:
                    args = (sample.args[0], *(sample.args[1:] or ((),)))
                try:
                    want = op(sample.input, *args)
                except RuntimeError:
                    continue
                _same(table[op](sample.input, *args), want)
                checked += 1
    assert checked > 50


def test_the_ops_themselves_where_the_decompositions_do_not_apply():
    """A flattened roll (no dims) and a pad that leaves a dim empty: torch's own
    decompositions, eager's values (the pass does not decompose either)."""
    table = decomposition_table([ROLL, PAD], "cpu")
    x = torch.randn(3, 5)
    _same(table[ROLL](x, [2], []), ROLL(x, [2], []))
    _same(table[PAD](x, [-5, 0], 1.0), PAD(x, [-5, 0], 1.0))


class _ShiftedWindows(torch.nn.Module):
    """A Swin block's attention path: layer norm, pad, roll, window partition, a linear
    map per window, window reverse, roll back, crop, residual."""

    def __init__(self, channels=32, window=7, shift=3, pad=0):
        super().__init__()
        self.window, self.shift, self.pad = window, shift, pad
        self.norm = torch.nn.LayerNorm(channels)
        self.proj = torch.nn.Linear(channels, channels)

    def forward(self, x, size):
        b, _, c = x.shape
        w, p = self.window, self.pad
        h = self.norm(x).view(b, size, size, c)
        h = torch.nn.functional.pad(h, (0, 0, 0, p, 0, p))
        n = size + p
        h = torch.roll(h, (-self.shift, -self.shift), (1, 2))
        h = h.view(b, n // w, w, n // w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, c)
        h = self.proj(h)
        h = h.view(b, n // w, n // w, w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(b, n, n, c)
        h = torch.roll(h, (self.shift, self.shift), (1, 2))[:, :size, :size]
        return x + h.reshape(b, size * size, c)


@pytest.mark.parametrize("size, shift, pad", [(14, 3, 0), (12, 3, 2), (21, -2, 0)])
def test_shifted_windows_run_no_roll_or_pad_between_kernels(size, shift, pad):
    torch._dynamo.reset()
    torch.manual_seed(size)
    model = _ShiftedWindows(32, 7, shift, pad).eval()
    x = torch.randn(2, size * size, 32)
    compiler = Compiler(keep_ir=True)
    compiled = torch.compile(model, backend="torchloom", options={"compiler": compiler})
    with torch.no_grad():
        got, want = compiled(x, size), model(x, size)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    ops = _compiled_ops(compiler)
    assert ops["aten.roll.default"] == ops["aten.constant_pad_nd.default"] == 0, ops
    # the norm with its pad, roll and partition; the reverse, roll back and residual
    assert ops["torchloom.fusion_group"] == 2, ops
    assert {c.codegen for c in compiler.compilations[-1].compiled.choices} == {"cpu"}
    torch._dynamo.reset()


def test_shifted_windows_train_as_eager():
    """The gradients (a roll back and a crop of the padded gradient) are eager's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, ref = _ShiftedWindows(16, 7, 3, 2), _ShiftedWindows(16, 7, 3, 2)
    ref.load_state_dict(model.state_dict())
    x = torch.randn(2, 144, 16)
    compiler = Compiler(keep_ir=True)
    compiled = torch.compile(model, backend="torchloom", options={"compiler": compiler})
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    compiled(xs[0], 12).square().sum().backward()
    ref(xs[1], 12).square().sum().backward()
    torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4,
                                   atol=1e-5 * float(q.grad.abs().max()))
    ops = _compiled_ops(compiler)
    assert ops["aten.roll.default"] == ops["aten.constant_pad_nd.default"] == 0, ops
    torch._dynamo.reset()


def test_a_roll_at_a_symbolic_size_is_left_as_is():
    """A roll along a dim of symbolic size: the tiled views would need the size as an int;
    eager's op stays, eager's values at each length."""
    torch._dynamo.reset()
    compiler = Compiler(keep_ir=True)

    def fn(x):
        return torch.roll(x * 2, 3, 0) + 1
    compiled = torch.compile(fn, backend="torchloom", dynamic=True,
                             options={"compiler": compiler})
    for n in (7, 9, 12):
        x = torch.randn(n, 8)
        torch.testing.assert_close(compiled(x), fn(x), rtol=0, atol=0)
    assert _compiled_ops(compiler)["aten.roll.default"] >= 1
    torch._dynamo.reset()


def test_a_labels_pad_of_int64_keeps_its_fill():
    """A language model's shifted labels: ``pad(labels, (0, 1), value=-100)`` of int64,
    read by a comparison: one kernel, eager's values."""
    torch._dynamo.reset()
    compiler = Compiler(keep_ir=True)

    def fn(labels):
        shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
        return (shifted != -100).sum(-1), shifted
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler})
    labels = torch.randint(0, 50, (2, 17))
    for got, want in zip(compiled(labels), fn(labels)):
        _same(got, want)
    assert _compiled_ops(compiler)["aten.constant_pad_nd.default"] == 0
    # (an int fill: a float -100.0 in an integer computation had no cpu kernel)
    assert {c.codegen for c in compiler.compilations[-1].compiled.choices} == {"cpu"}
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype, value", [
    (torch.int64, 1.5), (torch.int32, -1.5), (torch.int8, 2.7), (torch.uint8, 3.9),
    (torch.bool, 1.5), (torch.bool, float("nan")), (torch.bool, float("inf")),
    (torch.bool, 0.0), (torch.float32, float("inf")), (torch.float16, 65504.0)])
def test_a_fill_is_converted_as_eager_converts_it(dtype, value):
    """An integer pad's fractional fill is truncated, a bool's is its truth (NaN and inf
    are true): the kernel writes eager's values and keeps the input's (a pad left to
    torch's decomposition lost its copy of the input: only the fill came out)."""
    torch._dynamo.reset()
    compiler = Compiler(keep_ir=True)

    def fn(x):
        return torch.nn.functional.pad(x, (1, 2, -1, 1), value=value)
    x = torch.arange(12).view(3, 4).to(dtype)
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler})
    _same(compiled(x), fn(x))
    assert _compiled_ops(compiler)["aten.constant_pad_nd.default"] == 0
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype, value", [
    (torch.float32, 1e39), (torch.bfloat16, 3.4e38), (torch.float16, 65520.0),
    (torch.int8, 300), (torch.uint8, -1), (torch.int32, float("nan")),
    (torch.int64, float("inf"))])
def test_a_fill_the_dtype_cannot_hold_raises_as_eager(dtype, value):
    """Eager's pad raises for a value its dtype cannot hold; the op is left to it."""
    torch._dynamo.reset()

    def fn(x):
        return torch.nn.functional.pad(x, (1, 1), value=value) * 1
    x = torch.ones(2, 3, dtype=dtype)
    with pytest.raises(RuntimeError, match="without overflow"):
        fn(x)
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": Compiler()})
    with pytest.raises(RuntimeError, match="without overflow"):
        compiled(x)
    torch._dynamo.reset()


def test_a_decomposition_that_writes_in_place_is_not_used():
    """torch's own ``constant_pad_nd`` decomposition (what ours falls back to for a fill
    it does not convert, a complex one here) fills a new tensor and copies the input into
    a view of it in place (``prims.copy_to``); the IR's ops are values, so that write would
    be lost (the result: the fill alone). Such a trace is not used: the op stays."""
    from torchloom.api import parse_graph
    from torchloom_fusion.decompose import _trace_decomposition
    graph = parse_graph("""\
graph @g(%x: c64[2, 3]) {
  %p = aten.constant_pad_nd.default(%x) {pad = [1, 1], value = 1.0} : c64[2, 5]
  return %p
}
""")
    (node,) = graph.nodes
    assert _trace_decomposition(node, Compiler().registry) is None
