"""fusion.decompose of ``cat`` on the CPU: each piece read through views that tile it along
the dim, chosen by ``where`` on the dim's index, so the kernel reading the concatenation
computes it (rotary embeddings' ``rotate_half``: ``q * cos + cat(-x2, x1) * sin`` is one
kernel, no ``cat`` and no ``neg`` kernel between). Bit for bit eager's ``cat`` at every
rank, dim, piece count and dtype mix; the op itself where the decomposition does not
apply (an empty piece, sizes that are not ints, another device)."""

from __future__ import annotations

import collections

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchloom.api import decomposition_table
from torchloom.tools import Compiler

CAT = torch.ops.aten.cat.default
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
          torch.int32, torch.bool)


def _values(shape, dtype, g):
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 4
    x[x.abs() < 0.5] = -0.0
    if x.numel():
        x.view(-1)[0] = float("nan")
    return x.to(dtype) if dtype != torch.bool else x > 0


@st.composite
def _cats(draw):
    rank = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank))
    dim = draw(st.integers(-rank, rank - 1))
    pieces = []
    for _ in range(draw(st.integers(1, 4))):
        piece = list(shape)
        piece[dim] = draw(st.integers(1, 7))
        pieces.append((piece, draw(st.sampled_from(DTYPES))))
    return pieces, dim, draw(st.integers(0, 2 ** 16))


@settings(max_examples=300, deadline=None)
@given(_cats())
def test_the_decomposition_is_eager_s_cat_bit_for_bit(case):
    pieces, dim, seed = case
    g = torch.Generator().manual_seed(seed)
    tensors = [_values(shape, dtype, g) for shape, dtype in pieces]
    expected = CAT(tensors, dim)
    actual = decomposition_table([CAT], "cpu")[CAT](tensors, dim)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
    if actual.dtype.is_floating_point:  # -0.0 as -0.0
        assert torch.equal(torch.signbit(actual), torch.signbit(expected))


def test_cat_itself_where_the_decomposition_does_not_apply():
    table = decomposition_table([CAT], "cpu")
    empty = [torch.randn(3, 0), torch.randn(3, 4)]  # an empty piece
    legacy = [torch.randn(0), torch.randn(3, 4)]  # a 1-D empty tensor beside 2-D ones
    for tensors, dim in ((empty, 1), (legacy, 0)):
        torch.testing.assert_close(table[CAT](tensors, dim), CAT(tensors, dim))
    on_cuda = decomposition_table([CAT], "cuda")[CAT]
    tensors = [torch.randn(2, 3), torch.randn(2, 5)]
    from torch.fx.experimental.proxy_tensor import make_fx
    traced = make_fx(lambda a, b: on_cuda([a, b], 1))(*tensors)
    assert [n.target for n in traced.graph.nodes if n.op == "call_function"] == [CAT]


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary(q, cos, sin):
    return q * cos + _rotate_half(q) * sin


def _ops(compiler):
    found: collections.Counter[str] = collections.Counter()
    for comp in compiler.compilations:
        for graph in (comp.graph, *comp.graph.subgraphs.values()):
            found.update(n.op for n in graph.nodes)
    return found


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from([(1, 2, 8, 8), (2, 3, 5, 16), (1, 8, 33, 32), (3, 64)]),
       st.sampled_from([torch.float32, torch.float64]), st.integers(0, 99))
def test_rotary_embeddings_are_one_kernel_as_eager(shape, dtype, seed):
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(shape, generator=g, dtype=dtype)
    cos, sin = (torch.randn(shape[-2:], generator=g, dtype=dtype) for _ in range(2))
    compiler = Compiler(keep_ir=True)
    compiled = torch.compile(_rotary, backend="torchloom", options={"compiler": compiler})
    torch.testing.assert_close(compiled(q, cos, sin), _rotary(q, cos, sin), rtol=1e-6,
                               atol=1e-6)
    ops = _ops(compiler)
    assert ops["aten.cat.default"] == 0 and ops["torchloom.fusion_group"] == 1
    assert [c.codegen for c in compiler.compilations[-1].compiled.choices] == ["cpu"]


def test_rotary_embeddings_at_symbolic_lengths_are_one_kernel_as_eager():
    """dynamic=True, the query a projection's output with its heads transposed out (the
    strides Llama's are: symbolic expressions), run at several lengths: no cat, one
    group, eager's values at each length."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(7)
    compiler = Compiler(keep_ir=True)

    def fn(x, cos, sin):
        q = x.view(x.shape[0], x.shape[1], 4, 16).transpose(1, 2)
        return _rotary(q, cos, sin)
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler},
                             dynamic=True)
    for batch, length in ((1, 5), (2, 33), (3, 2), (1, 130)):
        x = torch.randn(batch, length, 64, generator=g)
        cos, sin = (torch.randn(length, 16, generator=g) for _ in range(2))
        torch.testing.assert_close(compiled(x, cos, sin), fn(x, cos, sin), rtol=0, atol=0)
    symbolic = 0  # (a batch of 1 compiles a graph of its own: torch specializes size 1)
    for comp in compiler.compilations:
        symbolic += any(isinstance(d, str) for v in comp.graph.inputs
                        for d in getattr(v.type, "shape", ()))
        ops = collections.Counter(n.op for g in (comp.graph, *comp.graph.subgraphs.values())
                                  for n in g.nodes)
        assert ops["aten.cat.default"] == 0 and ops["torchloom.fusion_group"] == 1, ops
    assert symbolic
    torch._dynamo.reset()


def test_rotary_gradients_as_eager():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 16, 32, generator=g, requires_grad=True)
    cos, sin = torch.randn(16, 32, generator=g), torch.randn(16, 32, generator=g)
    ref = q.detach().clone().requires_grad_()
    compiler = Compiler(keep_ir=True)
    compiled = torch.compile(_rotary, backend="torchloom", options={"compiler": compiler})
    out, expected = compiled(q, cos, sin), _rotary(ref, cos, sin)
    torch.testing.assert_close(out, expected)
    (out * out).sum().backward()
    (expected * expected).sum().backward()
    torch.testing.assert_close(q.grad, ref.grad)
    assert _ops(compiler)["aten.cat.default"] == 0


def test_a_concatenation_of_pieces_read_elsewhere_that_a_gemm_reads_stays_a_cat():
    """(An LSTM's gate gradients: the pieces are read elsewhere too, so the concatenation
    is written out either way; as tiles the group would carry outputs of the pieces' shape
    beside a reduction over the whole.)"""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(8, 32, generator=g), torch.randn(8, 96, generator=g)
    w = torch.randn(128, 16, generator=g)

    def fn(a, b, w):
        sa = a.sigmoid()
        c = torch.cat([sa, b.tanh()], 1)
        return c @ w, c.sum(0), sa
    compiler = Compiler(keep_ir=True)
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler})
    torch.testing.assert_close(compiled(a, b, w), fn(a, b, w))
    assert _ops(compiler)["aten.cat.default"] == 1


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.integers(1, 9), st.lists(st.integers(1, 40), min_size=2, max_size=4),
       st.sampled_from([0, 1, -1]), st.sampled_from([torch.float32, torch.float64]),
       st.integers(0, 99))
def test_a_concatenation_of_pieces_nothing_else_reads_is_written_by_their_kernel(
        other, sizes, dim, dtype, seed):
    """Pieces that only the concatenation reads (a fused q/k/v projection's gradients):
    the kernel computing them writes the concatenation that a GEMM and a sum (the bias
    gradient) read, no ``cat`` call; eager's values (the pieces along either dim)."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(seed)
    pieces = [torch.randn((n, other) if dim == 0 else (other, n), generator=g, dtype=dtype)
              for n in sizes]
    width = torch.cat(pieces, dim).shape[1]
    w = torch.randn(width, 8, generator=g, dtype=dtype)

    def fn(w, *pieces):
        c = torch.cat([p.sigmoid() * (i + 1) for i, p in enumerate(pieces)], dim)
        return c @ w, c.sum(0)
    compiler = Compiler(keep_ir=True)
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler},
                             dynamic=False)
    got, want = compiled(w, *pieces), fn(w, *pieces)
    torch.testing.assert_close(got, want)
    ops = _ops(compiler)
    # one kernel, or two where a piece is one row along dim 0 (fusion keeps the sum
    # apart): never a cat call between them
    assert ops["aten.cat.default"] == 0 and ops["torchloom.fusion_group"] <= 2, ops
    assert {c.codegen for c in compiler.compilations[-1].compiled.choices} == {"cpu"}


def test_where_triton_takes_the_cpu_groups_such_a_concatenation_stays_a_cat(monkeypatch):
    """The Triton interpreter (CPU groups on triton) sees the graph CUDA would: the cat a
    GEMM and a sum read stays (as tiles beside the sum a group may carry outputs of the
    pieces' shape, which only cpu renders)."""
    monkeypatch.setenv("TORCHLOOM_TRITON_CPU", "1")
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(4, 8, generator=g), torch.randn(4, 24, generator=g)
    w = torch.randn(32, 8, generator=g)

    def fn(a, b, w):
        c = torch.cat([a.sigmoid(), b.tanh()], 1)
        return c @ w, c.sum(0)
    compiler = Compiler(keep_ir=True)
    assert compiler.context().codegen == "triton"
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler})
    torch.testing.assert_close(compiled(a, b, w), fn(a, b, w))
    ops = _ops(compiler)
    assert ops["aten.cat.default"] == 1, ops
    torch._dynamo.reset()


def test_a_fused_qkv_projection_s_gradients_as_eager_without_a_cat():
    """A transformer block's fused q/k/v projection (one linear to 3 x the width, split in
    three): its backward concatenates the three gradients, which the weight's and the
    input's GEMMs and the bias's sum read. Forward and backward as eager at static and
    symbolic lengths, and no ``cat`` left in any graph."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(11)
    qkv = torch.nn.Linear(32, 96)

    def fn(x):
        q, k, v = qkv(x).split(32, dim=-1)
        s = (q.unflatten(-1, (4, 8)).transpose(1, 2) @
             k.unflatten(-1, (4, 8)).transpose(1, 2).transpose(-1, -2)).softmax(-1)
        return (s @ v.unflatten(-1, (4, 8)).transpose(1, 2)).sum()
    compiler = Compiler(keep_ir=True)
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler})
    for length in (5, 9, 17):
        x = torch.randn(2, length, 32, generator=g)
        xs = [x.clone().requires_grad_() for _ in range(2)]
        qkv.zero_grad()
        compiled(xs[0]).backward()
        got = [xs[0].grad, qkv.weight.grad.clone(), qkv.bias.grad.clone()]
        qkv.zero_grad()
        fn(xs[1]).backward()
        want = [xs[1].grad, qkv.weight.grad, qkv.bias.grad]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(compiler.compilations) >= 4  # static and symbolic, forward and backward
    assert _ops(compiler)["aten.cat.default"] == 0
    torch._dynamo.reset()


@pytest.mark.parametrize("norm", ["layer_norm", "softmax", "amax"])
def test_a_concatenation_a_row_reduction_reads_along_its_dim_stays_a_cat(norm):
    """Swin's patch merging: four strided pieces of one tensor concatenated along the
    channels, read by a layer norm (or a softmax, a maximum over that dim). Decomposed, each
    of the reduction's passes over a row would compute every piece for each element (1.1 ms
    against 0.2 for Inductor's kernel); the concatenation stays, eager's values."""
    torch._dynamo.reset()
    reduce = {"layer_norm": lambda m: torch.nn.functional.layer_norm(m, (m.shape[-1],)),
              "softmax": lambda m: m.softmax(-1),
              "amax": lambda m: m.amax(-1, keepdim=True) * m}[norm]

    def fn(x, b):
        h = x + b
        return reduce(torch.cat([h[:, i::2, j::2] for j in (0, 1) for i in (0, 1)], -1))
    x, b = torch.randn(2, 8, 8, 16), torch.randn(16)
    compiler = Compiler(keep_ir=True)
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, b), fn(x, b), rtol=1e-5, atol=1e-6)
    assert _ops(compiler)["aten.cat.default"] == 1
    assert {c.codegen for c in compiler.compilations[-1].compiled.choices} == {"cpu"}
    torch._dynamo.reset()


def test_a_concatenation_a_sum_over_other_dims_reads_is_decomposed():
    """(A bias gradient's sum over the rows reads each element once: the kernel making the
    pieces writes the concatenation, as for a fused q/k/v projection's gradients.)"""
    torch._dynamo.reset()

    def fn(a, b):
        return torch.cat([a.exp(), b.tanh()], -1).sum(0)
    a, b = torch.randn(64, 16), torch.randn(64, 8)
    compiler = Compiler(keep_ir=True)
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler})
    torch.testing.assert_close(compiled(a, b), fn(a, b), rtol=1e-5, atol=1e-6)
    assert _ops(compiler)["aten.cat.default"] == 0
    torch._dynamo.reset()
