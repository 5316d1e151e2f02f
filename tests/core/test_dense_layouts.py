"""Transposed elementwise results made row-major before tracing
(torchloom.frontend.dense_layouts, run by the backend on Dynamo's graph): a residual
stream born from a permuted tensor is traced row-major after its first sum, the values,
gradients and graph outputs' layouts stay eager's, and the results the rule leaves out
(graph outputs, in-place ops, channels-last, small or symbolic ones, row-major operands)
keep theirs."""

from __future__ import annotations

import operator

import pytest
import torch
import torch._dynamo
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.frontend import dense_layouts
from torchloom.ir.graph import FUSION_GROUP
from torchloom.tools import Compiler

F = torch.nn.functional


def dynamo_graph(fn, *args, dynamic=False):
    """Dynamo's one graph of ``fn`` (its example values in the nodes' meta)."""
    (gm,) = dynamo_graphs(fn, *args, dynamic=dynamic)
    return gm


def dynamo_graphs(fn, *args, dynamic=False):
    """Dynamo's graphs of ``fn`` (several where it breaks the graph)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, dynamic=dynamic)(*args)
    torch._dynamo.reset()
    return graphs


def contiguous_calls(gm) -> int:
    return sum(n.op == "call_method" and n.target == "contiguous" for n in gm.graph.nodes)


def encoder(x, pos, w, b, layers: int = 3):
    """Whisper's shape of it: a permuted [N, C, T] tensor plus positions, then residual
    sums around layer norms; only the last norm's result is returned."""
    h = x.permute(0, 2, 1) + pos
    for _ in range(layers):
        h = h + torch.tanh(F.layer_norm(h, (h.shape[-1],), w, b))
    return F.layer_norm(h, (h.shape[-1],), w, b)


def _encoder_inputs(n=2, c=64, t=96, grad=False):
    g = torch.Generator().manual_seed(0)
    ins = [torch.randn(n, c, t, generator=g), torch.randn(t, c, generator=g),
           torch.randn(c, generator=g), torch.randn(c, generator=g)]
    return [i.requires_grad_(grad) for i in ins]


def test_one_copy_after_the_first_transposed_sum():
    gm = dynamo_graph(encoder, *_encoder_inputs())
    before = [n for n in gm.graph.nodes if n.target in (operator.add,)]
    assert dense_layouts.make_dense(gm) == 1
    copy = next(n for n in gm.graph.nodes if n.target == "contiguous")
    assert copy.args[0] is before[0]  # after the permuted sum; the later sums read it
    assert list(before[0].users) == [copy]
    assert copy.meta["example_value"].is_contiguous()
    (got,) = gm(*_encoder_inputs())
    torch.testing.assert_close(got, encoder(*_encoder_inputs()))


@pytest.mark.parametrize("shape", [(2, 64, 96), (1, 256, 512), (3, 80, 33)])
def test_compiled_values_gradients_and_layouts_are_eagers(tmp_path, shape):
    n, c, t = shape
    compiler = Compiler("default", cache_dir=tmp_path, compile_cache=False, strict=True)
    torch._dynamo.reset()
    fn = torch.compile(encoder, backend="torchloom", options={"compiler": compiler})
    got_in, want_in = _encoder_inputs(n, c, t, grad=True), _encoder_inputs(n, c, t, grad=True)
    got, want = fn(*got_in), encoder(*want_in)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got.stride() == want.stride()
    got.square().sum().backward()
    want.square().sum().backward()
    for a, b in zip(got_in, want_in):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-3)
        assert a.grad.stride() == b.grad.stride()
    # the kernels write the residual stream row-major (eager's layout: [T, C] transposed)
    written = [v.type for comp in compiler.compilations for node in comp.compiled.graph.nodes
               if node.op == FUSION_GROUP for v in node.outputs
               if tuple(v.type.shape)[1:] == (t, c)]
    assert written and all(tuple(ty.actual_strides())[-1] == 1 for ty in written), written


def _ln_sum(x, w):
    return F.layer_norm(x.t() + w, (x.shape[0],))


@pytest.mark.parametrize("case", ["output", "output_view", "output_relu", "inplace", "out",
                                  "channels_last", "small", "heads"])
def test_results_the_rule_leaves(case):
    g = torch.Generator().manual_seed(1)
    if case == "output":  # the transposed sum is returned: its layout is the user's
        fn, args = (lambda x, p: x.t() + p), (torch.randn(128, 96, generator=g),
                                              torch.randn(96, 128, generator=g))
    elif case == "output_view":  # a view of it is returned (y.t() is row-major in eager)
        fn, args = (lambda x, p: (x.t() + p).t()), (torch.randn(128, 96, generator=g),
                                                    torch.randn(96, 128, generator=g))
    elif case == "output_relu":  # an elementwise result of it is returned
        fn, args = (lambda x, p: torch.relu(x.t() + p) * 2), (
            torch.randn(128, 96, generator=g), torch.randn(96, 128, generator=g))
    elif case == "inplace":  # x += ... aliases x
        def fn(x, p):
            y = x.t()
            y += p
            return F.layer_norm(y, (y.shape[-1],))
        args = (torch.randn(128, 96, generator=g), torch.randn(96, 128, generator=g))
    elif case == "out":  # add(..., out=buffer) returns the buffer
        def fn(x, p):
            buffer = torch.empty(96, 128).t()
            torch.add(x.t(), p, out=buffer)
            return F.layer_norm(buffer, (buffer.shape[-1],))
        args = (torch.randn(128, 96, generator=g), torch.randn(96, 128, generator=g))
    elif case == "channels_last":
        fn = lambda x, y: F.relu(x + y)  # noqa: E731
        args = tuple(torch.randn(2, 8, 32, 32, generator=g).to(memory_format=torch.channels_last)
                     for _ in range(2))
    elif case == "small":  # fewer than MIN_NUMEL elements
        fn, args = _ln_sum, (torch.randn(16, 32, generator=g), torch.randn(32, 16, generator=g))
    else:  # heads swapped with the sequence, rows contiguous (rotary embeddings' q * cos)
        def fn(x, cos):
            q = x.view(2, 64, 4, 32).transpose(1, 2)
            return F.layer_norm(q * cos, (32,)).sum(1)
        args = (torch.randn(2, 64, 128, generator=g), torch.randn(64, 32, generator=g))
    for gm in dynamo_graphs(fn, *[a.clone() for a in args]):
        assert dense_layouts.make_dense(gm) == 0
        assert contiguous_calls(gm) == 0


@pytest.mark.parametrize("hidden_states", [False, True])
def test_returned_layouts_are_eagers(tmp_path, hidden_states):
    """The residual stream returned (a model's ``output_hidden_states``) keeps eager's
    layout: the rule leaves it; returned only after a norm, it is rewritten."""
    def fn(x, pos, w, b):
        h = x.permute(0, 2, 1) + pos
        states = [h]
        for _ in range(2):
            h = h + torch.tanh(F.layer_norm(h, (h.shape[-1],), w, b))
            states.append(h)
        out = F.layer_norm(h, (h.shape[-1],), w, b)
        return (out, *states) if hidden_states else out
    args = _encoder_inputs()
    assert dense_layouts.make_dense(dynamo_graph(fn, *args)) == (0 if hidden_states else 1)
    compiler = Compiler("default", cache_dir=tmp_path, compile_cache=False, strict=True)
    torch._dynamo.reset()
    got = torch.compile(fn, backend="torchloom", options={"compiler": compiler})(*args)
    want = fn(*args)
    for a, b in zip(got if hidden_states else [got], want if hidden_states else [want]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        assert a.stride() == b.stride()


def test_symbolic_sizes_are_left():
    gm = dynamo_graph(encoder, *_encoder_inputs(t=100), dynamic=True)
    assert dense_layouts.make_dense(gm) == 0


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 3), c=st.sampled_from([16, 48, 64]), t=st.integers(64, 200),
       layers=st.integers(1, 3), op=st.sampled_from(["add", "sub", "mul", "div"]))
def test_random_chains_match_eager(n, c, t, layers, op):
    def chain(x, pos):
        h = getattr(torch, op)(x.permute(0, 2, 1), pos)
        for _ in range(layers):
            h = h + torch.sigmoid(h).mean(-1, keepdim=True)
        return F.layer_norm(h, (c,)).sum(-1)  # (the returned value past a norm)
    g = torch.Generator().manual_seed(n * 1000 + t)
    args = (torch.randn(n, c, t, generator=g), torch.rand(t, c, generator=g) + 0.5)
    gm = dynamo_graph(chain, *args)
    made = dense_layouts.make_dense(gm)
    assert made == (1 if n * c * t >= dense_layouts.MIN_NUMEL else 0)
    (got,) = gm(*args)
    torch.testing.assert_close(got, chain(*args), rtol=1e-5, atol=1e-4)  # (sum order)
