"""Eager's dropout from the same random stream (torchloom_codegen_cpu.random_stream): the
mask, the output and the generator's state afterwards are eager's ``native_dropout``'s, bit
for bit, from any state (offsets inside a 624-word block, odd ones, block boundaries), for
every p in [0, 1] and f32/f64/bf16 values with NaN, inf and signed zeros; calls it does not take
are eager's op (same results, same errors); a compiled training step calls it for its
dropout nodes (no ``native_dropout`` reaches torch) and matches eager's step."""

from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from torchloom.runtime.executor import CompiledGraph, library_calls
from torchloom.tools import EagerCodegen
from torchloom.api import parse_graph
from torchloom_codegen_cpu import random_stream

from conftest import compiled

NATIVE = torch.ops.aten.native_dropout.default
SPECIALS = (float("nan"), float("inf"), float("-inf"), -0.0, 0.0, -1e-30, 3e38)


DROPOUT_NODE = """\
graph @g(%x: f32[300, 70]) {
  %y, %m = aten.native_dropout.default(%x) {p = 0.2, train = true} : f32[300, 70], b8[300, 70]
  %z = aten.mul.Tensor(%y, %x) : f32[300, 70]
  return %z, %m
}"""


@pytest.fixture(scope="module")
def dropout(codegen, registry):
    """What the codegen offers the plan for a dropout node."""
    return codegen.library_call(next(iter(parse_graph(DROPOUT_NODE).nodes)), registry)


def drawn_from(seed: int, before: int, fn):
    """``fn()`` run after seeding and drawing ``before`` floats (one 32-bit word each),
    with the generator's state after it and the next draws."""
    torch.manual_seed(seed)
    torch.rand(before)
    result = fn()
    return result, torch.default_generator.get_state(), torch.rand(7), torch.randn(5)


def assert_c_path(dropout, x, p):
    """The call runs the C function (not eager's op, which would pass trivially)."""
    assert random_stream._fast(x, p, True) and x.dtype in dropout._loaded()


def assert_same(got, want):
    (go, gm), g_state, g_rand, g_randn = got
    (wo, wm), w_state, w_rand, w_randn = want
    assert gm.dtype == wm.dtype == torch.bool and torch.equal(gm, wm)
    assert go.dtype == wo.dtype and go.stride() == wo.stride() and gm.stride() == wm.stride()
    assert bits_equal(go, wo)
    assert torch.equal(g_state, w_state)
    assert torch.equal(g_rand, w_rand) and torch.equal(g_randn, w_randn)


def bits_equal(a, b) -> bool:
    """Bit for bit (NaN where the other has NaN, the sign of every zero); bool as is; bf16
    NaN as NaN (eager's vector and scalar loops give it different bits)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    if a.dtype == torch.bfloat16:
        nan = a.isnan()
        if not torch.equal(nan, b.isnan()):
            return False
        a, b = a.masked_fill(nan, 0), b.masked_fill(nan, 0)
    as_int = {torch.float32: torch.int32, torch.float64: torch.int64,
              torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]
    return torch.equal(a.detach().contiguous().view(as_int), b.detach().contiguous().view(as_int))


def values(shape, dtype, seed):
    x = torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    flat = x.view(-1)
    for i, v in enumerate(SPECIALS[:flat.numel()]):
        flat[(i * 7919) % flat.numel()] = v
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 1 / 3, 0.9, 1.0, 1e-300, 1 - 2 ** -53])
@pytest.mark.parametrize("shape, before", [
    ((1,), 0), ((3, 700), 1), ((5, 313), 311), ((312,), 623), ((624,), 624),
    ((2, 4, 77, 33), 1000), ((1, 4, 512, 64), 5)])
def test_dropout_is_eagers_bit_for_bit(dropout, dtype, p, shape, before):
    x = values(shape, dtype, before)
    assert_c_path(dropout, x, p)
    want = drawn_from(before, before, lambda: NATIVE(x, p, True))
    got = drawn_from(before, before, lambda: dropout(x, p, True))
    assert_same(got, want)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), before=st.integers(0, 3000), seed=st.integers(0, 2 ** 32 - 1),
       p=st.floats(0, 1),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
       train=st.sampled_from([True, None]))
def test_dropout_is_eagers_from_any_state(dropout, n, before, seed, p, dtype, train):
    x = values((n,), dtype, seed)
    assert_c_path(dropout, x, p)
    want = drawn_from(seed, before, lambda: NATIVE(x, p, train))
    got = drawn_from(seed, before, lambda: dropout(x, p, train))
    assert_same(got, want)


def test_a_draw_after_a_normal_sample_keeps_its_cached_half(dropout):
    """torch.randn of an odd count leaves a cached normal sample in the state record:
    it must survive the round trip through the C side."""
    x = values((1000,), torch.float32, 3)

    def fn(drop):
        torch.manual_seed(4)
        torch.randn(3, dtype=torch.float64)
        torch.randn(1)
        return drop(x, 0.25, True), torch.randn(3, dtype=torch.float64), torch.randn(3)
    (go, gm), *g_next = fn(dropout)
    (wo, wm), *w_next = fn(NATIVE)
    assert bits_equal(gm, wm) and bits_equal(go, wo)
    assert all(torch.equal(a, b) for a, b in zip(g_next, w_next))


@pytest.mark.parametrize("case", ["transposed", "f16", "empty", "eval", "int",
                                  "requires_grad"])
def test_calls_it_does_not_take_are_eagers(dropout, case):
    x = values((64, 48), torch.float32, 1)
    train = True
    if case == "transposed":
        x = x.t()
    elif case == "f16":
        x = x.to(torch.float16)
    elif case == "empty":
        x = x[:0]
    elif case == "eval":
        train = False
    elif case == "int":
        x = torch.arange(12).view(3, 4)
    elif case == "requires_grad":
        x = x.clone().requires_grad_()
    assert not random_stream._fast(x, 0.3, train)

    def run(fn):
        try:
            return drawn_from(9, 3, lambda: fn(x, 0.3, train)), None
        except RuntimeError as exc:
            return None, str(exc)
    got, g_error = run(dropout)
    want, w_error = run(NATIVE)
    assert g_error == w_error
    if want is not None:
        (go, gm), g_state, *_ = got
        (wo, wm), w_state, *_ = want
        assert bits_equal(go, wo) and bits_equal(gm, wm)
        assert torch.equal(g_state, w_state) and go.requires_grad == wo.requires_grad


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
def test_a_probability_outside_0_1_raises_as_eager(dropout, p):
    x = values((10,), torch.float32, 2)
    with pytest.raises(RuntimeError) as want:
        NATIVE(x, p, True)
    with pytest.raises(RuntimeError) as got:
        dropout(x, p, True)
    assert str(got.value) == str(want.value)


def test_a_state_record_it_cannot_read_is_left_untouched(dropout):
    fn = dropout._loaded()[torch.float32]
    x = torch.randn(100)
    out, mask = torch.empty_like(x), torch.empty(100, dtype=torch.bool)
    for left, nxt in [(0, 0), (626, 0), (100, 600), (1, 625)]:
        record = torch.default_generator.get_state()
        head = torch.tensor([left], dtype=torch.int32).view(torch.uint8)
        record[8:12] = head
        record[16:24] = torch.tensor([nxt], dtype=torch.int64).view(torch.uint8)
        before = record.clone()
        assert fn(record.data_ptr(), x.data_ptr(), out.data_ptr(), mask.data_ptr(), 100,
                  0.5, ctypes.c_float(2.0)) == 1
        assert torch.equal(record, before)


class Counting(TorchDispatchMode):
    """Counts eager's dropout kernels: ``native_dropout`` and ``bernoulli_`` (eager's
    ``F.dropout`` on the CPU draws its mask with it)."""

    def __init__(self):
        super().__init__()
        self.dropouts = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.dropouts += func in (NATIVE, torch.ops.aten.bernoulli_.float)
        return func(*args, **(kwargs or {}))


def test_the_plan_calls_it_for_a_dropout_node(registry, codegen):
    graph = parse_graph(DROPOUT_NODE)
    plan = CompiledGraph(graph, registry, [codegen, EagerCodegen()])
    reference = CompiledGraph(parse_graph(DROPOUT_NODE), registry, [EagerCodegen()])
    x = values((300, 70), torch.float32, 5)
    with Counting() as counted:
        got = drawn_from(1, 17, lambda: plan(x))
    assert counted.dropouts == 0  # the C function, not torch's op
    want = drawn_from(1, 17, lambda: reference(x))
    assert all(bits_equal(a, b) for a, b in zip(got[0], want[0]))
    assert torch.equal(got[1], want[1])
    offered = library_calls(None, [codegen], registry)
    assert [offered(n) is not None for n in graph.nodes] == [True, False]


def test_a_codegen_whose_offer_raises_costs_only_its_offer(registry, caplog):
    class Broken:
        name = "broken"

        def library_call(self, node, registry):
            raise ValueError("boom")

    class Offering:
        name = "offering"

        def library_call(self, node, registry):
            return "the call"
    graph = parse_graph("graph @g(%x: f32[4]) {\n  %y = aten.neg.default(%x) : f32[4]\n"
                        "  return %y\n}")
    calls = library_calls(None, [Broken(), Offering()], registry)
    assert [calls(n) for n in graph.nodes] == ["the call"]
    assert "codegen 'broken' failed offering a call for aten.neg.default: boom" in caplog.text


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(48, 64), torch.nn.Linear(64, 48)

    def forward(self, x):
        h = F.dropout(torch.tanh(self.a(x)), 0.25, training=self.training)
        scores = torch.softmax(h @ h.transpose(-1, -2) / 8, -1)
        return self.b(F.dropout(scores, 0.1, training=self.training) @ h)


def test_a_compiled_training_step_draws_eagers_masks(tmp_path):
    torch.manual_seed(0)
    model = Model()
    compiler, fn = compiled(model, tmp_path)
    x = torch.randn(2, 96, 48)
    fn(x).sum().backward()  # compiled (its tracing runs torch's ops on fake tensors)
    model.zero_grad()
    for step in range(2):
        runs = []
        for f in (model, fn):
            torch.manual_seed(step)
            with torch.profiler.profile() as profiled:  # (a dispatch mode stops dynamo)
                out = f(x)
                out.square().mean().backward()
            drops = sum(e.count for e in profiled.key_averages()
                        if e.key in ("aten::native_dropout", "aten::bernoulli_"))
            runs.append((out.detach(), [p.grad.clone() for p in model.parameters()],
                         torch.rand(3), drops))
            model.zero_grad()
        (want, w_grads, w_next, eager_drops), (got, g_grads, g_next, compiled_drops) = runs
        assert eager_drops == 2 and compiled_drops == 0
        assert torch.equal(g_next, w_next)  # the stream advanced as eager's
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for g, w in zip(g_grads, w_grads):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    assert [c.codegen for comp in compiler.compilations for c in comp.compiled.choices] \
        and all(c.codegen == "cpu" for comp in compiler.compilations
                for c in comp.compiled.choices)


@pytest.mark.parametrize("dtype, dynamic", [(torch.float32, True), (torch.bfloat16, False)])
def test_compiled_dropouts_draw_eagers_stream_at_every_size(tmp_path, dtype, dynamic):
    """Symbolic sizes (one kernel and one plan for every length) and bf16 values: the
    kept elements, the values (eager's ``F.dropout`` scales its mask first, so values are
    compared within a rounding) and the stream afterwards are eager's."""
    def fn(x):
        return F.dropout(torch.sin(x) * 2, 0.3, True) + 1

    _, compiled_fn = compiled(fn, tmp_path, dynamic=dynamic)
    for n in (5, 64, 1000):
        x = torch.randn(n, 37).to(dtype)
        runs = []
        for f in (fn, compiled_fn):
            torch.manual_seed(n)
            runs.append((f(x), torch.rand(5)))
        (want, w_next), (got, g_next) = runs
        assert torch.equal(g_next, w_next) and torch.equal(got == 1, want == 1)
        torch.testing.assert_close(got, want, **({} if dtype == torch.float32 else
                                                 {"rtol": 1e-2, "atol": 1e-2}))
