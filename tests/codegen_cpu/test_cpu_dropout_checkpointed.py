"""Eager's dropout stream under activation checkpointing: a checkpointed layer's dropout is
``run_and_save_rng_state(native_dropout, x, p, train)`` in the forward and
``run_with_rng_state(state, native_dropout, x, p, train)`` in its recomputation
(aot_autograd's partitioner wraps it). The cpu codegen's dropout library takes both
(random_stream.Dropout.saving/replaying), and the ``bernoulli.p`` masks the frontend draws
for recomputed dropouts (frontend.checkpointed_dropout) wrapped alike: the state, the
mask, the output and the generator afterwards are the wrappers' own, bit for bit; a
compiled checkpointed step runs no eager dropout kernel, forward or recomputation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.checkpoint import checkpoint

from torchloom.api import parse_graph
from torchloom_codegen_cpu import random_stream

from conftest import codegens, compiled
from test_cpu_dropout_stream import bits_equal, values

NATIVE = torch.ops.aten.native_dropout.default
SAVE = torch.ops.higher_order.run_and_save_rng_state
REPLAY = torch.ops.higher_order.run_with_rng_state

WRAPPED = """\
graph @g(%x: {t}[6, 50], %s: u8[5056]) {{
  %r = higher_order.run_and_save_rng_state(%x) {{args = [#op:{op}, $0, 0.2, true]}} : any
  %q = higher_order.run_with_rng_state(%s, %x) {{args = [$0, #op:{op}, $1, 0.2, true]}} : any
  return %r, %q
}}"""
#: the wrapped ``bernoulli.p`` (frontend.checkpointed_dropout's mask) and a plain one
MASKS = """\
graph @g(%x: {t}[6, 50], %s: u8[5056]) {{
  %r = higher_order.run_and_save_rng_state(%x) {{args = [#op:aten.bernoulli.p, $0, 0.8]}} : any
  %q = higher_order.run_with_rng_state(%s, %x) {{args = [$0, #op:aten.bernoulli.p, $1, 0.8]}} : any
  %b = aten.bernoulli.p(%x) {{p = 0.8}} : {t}[6, 50]
  return %r, %q, %b
}}"""


def nodes(text):
    return list(parse_graph(text).nodes)


def test_the_wrapped_forms_are_known_by_their_arguments():
    saving, replaying = nodes(WRAPPED.format(t="f32", op="aten.native_dropout.default"))
    assert random_stream.form(saving)[:2] == ("saving", saving.inputs[0])
    assert random_stream.form(replaying)[:2] == ("replaying", replaying.inputs[1])
    saving, replaying, plain = nodes(MASKS.format(t="f64"))
    assert [random_stream.form(n)[:2] for n in (saving, replaying, plain)] == [
        ("saving", saving.inputs[0]), ("replaying", replaying.inputs[1]),
        ("bernoulli", plain.inputs[0])]
    # another random op, bernoulli with dropout's arguments, a keyword, an argument out
    # of its place: not the stream's
    for op in ("aten.rand_like.default", "aten.bernoulli.p"):
        assert [random_stream.form(n) for n in nodes(WRAPPED.format(t="f32", op=op))] == \
            [None, None]
    for changed in (WRAPPED.replace("0.2, true]}", "0.2, true], kwargs = [[\"x\", 1]]}"),
                    WRAPPED.replace("[#op:{op}, $0, 0.2, true]", "[#op:{op}, 0.5, $0, true]"),
                    WRAPPED.replace("[$0, #op:{op}, $1, 0.2, true]",
                                    "[$1, #op:{op}, $1, 0.2, true, 1]")):
        got = [random_stream.form(n) for n in nodes(
            changed.format(t="f32", op="aten.native_dropout.default"))]
        assert None in got, changed


@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16", "f16"])
def test_the_codegen_offers_the_library_for_the_dtypes_it_draws(codegen, registry, dtype):
    offered = [codegen.library_call(n, registry) for n in
               nodes(WRAPPED.format(t=dtype, op="aten.native_dropout.default"))]
    assert [o is not None for o in offered] == [dtype != "f16"] * 2


@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16", "f16"])
def test_the_codegen_offers_the_library_for_the_masks_it_draws(codegen, registry, dtype):
    offered = [codegen.library_call(n, registry) for n in nodes(MASKS.format(t=dtype))]
    assert [o is not None for o in offered] == [dtype in ("f32", "f64")] * 3


@pytest.fixture(scope="module")
def library(codegen, registry):
    saving, replaying = (codegen.library_call(n, registry) for n in nodes(
        WRAPPED.format(t="f32", op="aten.native_dropout.default")))
    return saving, replaying


def record_after(seed: int, before: int) -> torch.Tensor:
    torch.manual_seed(seed)
    torch.rand(before)
    return torch.get_rng_state()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), before=st.integers(0, 1500),
       n=st.integers(1, 3000), p=st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
def test_saving_and_replaying_are_the_wrappers_bit_for_bit(library, seed, before, n, p,
                                                           dtype):
    saving, replaying = library
    x = values((n,), dtype, seed % 1000)
    assert random_stream._fast(x, p, True)
    runs = []
    for save, replay in ((saving, replaying), (SAVE, REPLAY)):
        torch.set_rng_state(record_after(seed, before))
        state, (out, mask) = save(NATIVE, x, p, True)
        kept = state.clone()
        torch.rand(11)  # the generator moves on before the recomputation
        now = torch.get_rng_state()
        again, again_mask = replay(state, NATIVE, x, p, True)
        assert torch.equal(state, kept)  # the saved state is read, not advanced
        assert torch.equal(torch.get_rng_state(), now)  # the generator left as it was
        runs.append((state, out, mask, again, again_mask, torch.rand(3)))
    for got, want in zip(*runs):
        assert got.dtype == want.dtype and bits_equal(got, want)
    assert bits_equal(runs[0][1], runs[0][3]) and torch.equal(runs[0][2], runs[0][4])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), before=st.integers(0, 1500),
       shape=st.lists(st.integers(1, 60), min_size=1, max_size=3),
       p=st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_masks_are_the_wrappers_and_bernoullis_bit_for_bit(library, seed, before, shape, p,
                                                           dtype):
    saving, replaying = library
    x = values([*shape[:-1], 2 * shape[-1]], dtype, seed % 1000)[..., ::2]  # (a view: only
    # its shape and dtype are read)
    op = torch.ops.aten.bernoulli.p
    runs = []
    for save, replay in ((saving, replaying), (SAVE, REPLAY)):
        torch.set_rng_state(record_after(seed, before))
        state, mask = save(op, x, p)
        torch.rand(3)
        now = torch.get_rng_state()
        again = replay(state, op, x, p)
        assert torch.equal(torch.get_rng_state(), now)
        runs.append((state, mask, again, torch.rand(3)))
    for got, want in zip(*runs):
        assert got.dtype == want.dtype and got.stride() == want.stride() and \
            bits_equal(got, want)


def test_a_plain_bernoulli_is_eagers(codegen, registry):
    plain = codegen.library_call(nodes(MASKS.format(t="f32"))[2], registry)
    x = torch.empty(33, 70)
    runs = []
    for fn in (plain, torch.ops.aten.bernoulli.p):
        torch.manual_seed(9)
        runs.append((fn(x, 0.3), torch.rand(5)))
        torch.manual_seed(9)  # with a generator of its own: eager's op
        runs.append((fn(x, 0.3, generator=torch.Generator().manual_seed(2)), torch.rand(5)))
    for got, want in zip(runs[:2], runs[2:]):
        assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("x", [values((40, 6), torch.float16, 3),  # a dtype it does not draw
                               values((6, 40), torch.float32, 4).t(),  # not contiguous
                               torch.empty(0, 5)])  # no element
def test_calls_it_does_not_take_are_the_wrappers(library, x):
    saving, replaying = library
    runs = []
    for save, replay in ((saving, replaying), (SAVE, REPLAY)):
        torch.manual_seed(5)
        state, (out, mask) = save(NATIVE, x, 0.3, True)
        runs.append((state, out, mask, *replay(state, NATIVE, x, 0.3, True),
                     torch.rand(2)))
    for got, want in zip(*runs):
        assert bits_equal(got, want)


class Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(
            torch.nn.Linear(24, 64), torch.nn.GELU(), torch.nn.Dropout(0.2),
            torch.nn.Linear(64, 24), torch.nn.Dropout(0.1)) for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = torch.nn.functional.layer_norm(x + checkpoint(block, x, use_reentrant=False),
                                               (24,))
        return x


def test_a_checkpointed_step_runs_no_eager_dropout(tmp_path):
    torch.manual_seed(0)
    model = Blocks()
    compiler, fn = compiled(model, tmp_path)
    x = torch.randn(4, 33, 24)
    fn(x).sum().backward()  # compiled (tracing runs torch's ops on fake tensors)
    model.zero_grad()
    runs = []
    for f in (model, fn):
        torch.manual_seed(3)
        with torch.profiler.profile() as profiled:
            out = f(x)
            (out * torch.linspace(-1, 1, 24)).sum().backward()
        drops = sum(e.count for e in profiled.key_averages()
                    if e.key in ("aten::native_dropout", "aten::bernoulli_"))
        runs.append((out.detach(), [p.grad.clone() for p in model.parameters()],
                     torch.rand(4), drops))
        model.zero_grad()
    (want, w_grads, w_next, eager_drops), (got, g_grads, g_next, compiled_drops) = runs
    assert eager_drops == 8 and compiled_drops == 0  # eager: 4 dropouts, each recomputed
    assert torch.equal(g_next, w_next)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(g_grads, w_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    graphs = [g for comp in compiler.compilations
              for g in (comp.compiled.graph, *comp.compiled.graph.subgraphs.values())]
    ops = {n.op for g in graphs for n in g.walk()}  # (the two blocks share a subgraph)
    assert {random_stream.SAVING, random_stream.REPLAYING} <= ops
    assert set(codegens(compiler)) == {"cpu"}  # no group on eager
