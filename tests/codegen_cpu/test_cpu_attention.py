"""Causal attention by blocks (torchloom_codegen_cpu.attention): the forward's output and
logsumexp and the backward's three gradients are eager's ``_scaled_dot_product_flash_
attention_for_cpu`` ones within float rounding, with eager's layouts, for causal flags and
additive masks that hide whole blocks (causal, finfo.min or -inf, sliding windows, padded
keys), grouped key heads, partial blocks and transposed layouts; calls it does not take are
eager's op; a compiled training step runs it (no eager attention reaches torch)."""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.api import parse_graph
from torchloom.runtime.executor import library_calls
from torchloom_codegen_cpu import attention

from conftest import Counting, compiled

ATEN = torch.ops.aten
FORWARD = ATEN._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = ATEN._scaled_dot_product_flash_attention_for_cpu_backward.default
MIN = torch.finfo(torch.float32).min


@pytest.fixture(scope="module")
def blocked(codegen):
    """The codegen's attention, its two libraries built and checked."""
    found = codegen._attention
    for direction in ("forward", "backward"):
        assert found._loaded(direction) is not None, \
            f"torch's sgemm_ or the attention {direction} library is missing"
    return found


def qkv(B, H, Hk, Lq, Lk, D, layout="bshd", seed=0):
    """Query, key, value and an output gradient; ``bshd``: heads transposed out of
    ``[B, L, H, D]`` (what models pass), ``bhsd``: contiguous."""
    g = torch.Generator().manual_seed(seed)

    def make(heads, length):
        if layout == "bshd":
            return torch.randn(B, length, heads, D, generator=g).transpose(1, 2)
        return torch.randn(B, heads, length, D, generator=g)
    return make(H, Lq), make(Hk, Lk), make(Hk, Lk), make(H, Lq)


def causal_mask(Lq, Lk, hidden=MIN):
    return torch.full((Lq, Lk), hidden).triu(1)


def hidden_share(mask) -> float:
    """The share of the 64 x 64 blocks of a 2-D mask whose every value is <= -1e30."""
    Lq, Lk = mask.shape
    dead = [bool((mask[i:i + 64, j:j + 64] <= -1e30).all()) for i in range(0, Lq, 64)
            for j in range(0, Lk, 64)]
    return sum(dead) / len(dead)


def check(blocked, q, k, v, go, mask=None, causal=False, scale=None):
    """Runs both sides, asserting that the blocked path ran and agrees with eager."""
    assert attention._fast(q, k, v, (), 0.0, causal, mask)
    with Counting(FORWARD, BACKWARD) as counted:
        got = blocked.forward(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
    assert counted.calls == 0, "eager's op ran"
    want = FORWARD(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
    for a, b in zip(got, want):  # (outputs are averages of unit values: sums of 64-200
        assert a.stride() == b.stride()  # terms in another order differ by up to ~1e-5)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with Counting(FORWARD, BACKWARD) as counted:
        grads = blocked.backward(go, q, k, v, *want, 0.0, causal, attn_mask=mask, scale=scale)
    assert counted.calls == 0, "eager's op ran"
    wants = BACKWARD(go, q, k, v, *want, 0.0, causal, attn_mask=mask, scale=scale)
    for a, b in zip(grads, wants):
        assert a.stride() == b.stride()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5)


def test_each_direction_builds_its_own_library_at_its_first_call(codegen):
    """Inference builds the forward's library only; the backward's comes at the first
    backward call; each library holds its own direction's function."""
    asked = []

    def library(direction):
        asked.append(direction)
        return codegen._build(attention.source(direction))
    found = attention.Attention(library)
    q, k, v, go = qkv(1, 4, 2, 130, 130, 32, seed=3)
    with torch.no_grad():
        found.forward(q, k, v, 0.0, True)  # built, loaded and checked against eager's op
        with Counting(FORWARD, BACKWARD) as counted:
            out, lse = found.forward(q, k, v, 0.0, True)
        assert asked == ["forward"] and counted.calls == 0
        for a, b in zip((out, lse), FORWARD(q, k, v, 0.0, True)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        found.backward(go, q, k, v, out, lse, 0.0, True)
        assert asked == ["forward", "backward"]
        with Counting(FORWARD, BACKWARD) as counted:
            grads = found.backward(go, q, k, v, out, lse, 0.0, True)
        assert asked == ["forward", "backward"] and counted.calls == 0
        for a, b in zip(grads, BACKWARD(go, q, k, v, out, lse, 0.0, True)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5)
    forward = ctypes.CDLL(str(library("forward")))
    backward = ctypes.CDLL(str(library("backward")))
    assert hasattr(forward, "tl_attn_fwd_f32") and not hasattr(forward, "tl_attn_bwd_f32")
    assert hasattr(backward, "tl_attn_bwd_f32") and not hasattr(backward, "tl_attn_fwd_f32")
    with pytest.raises(ValueError, match="sideways"):
        attention.source("sideways")


SHAPES = [  # B, H, Hk, Lq, Lk, D
    (1, 8, 2, 512, 512, 32), (1, 4, 4, 200, 200, 64), (2, 3, 3, 77, 77, 16),
    (1, 2, 1, 130, 130, 8), (2, 4, 2, 65, 65, 80), (1, 1, 1, 1, 1, 16), (1, 2, 2, 64, 64, 1),
    (1, 2, 2, 100, 160, 32), (1, 2, 1, 160, 100, 32), (3, 1, 1, 129, 129, 48)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_causal_flag_matches_eager(blocked, shape, layout):
    q, k, v, go = qkv(*shape, layout=layout)
    check(blocked, q, k, v, go, causal=True)


@pytest.mark.parametrize("shape", [s for s in SHAPES  # (a quarter hidden: 160 x 100 is eager's)
                                   if hidden_share(causal_mask(s[3], s[4])) >= 0.25])
@pytest.mark.parametrize("hidden", [MIN, float("-inf")])
def test_causal_masks_match_eager(blocked, shape, hidden):
    q, k, v, go = qkv(*shape, seed=1)
    mask = causal_mask(shape[3], shape[4], hidden)
    check(blocked, q, k, v, go, mask=mask[None, None])  # [1, 1, Lq, Lk], as models pass
    check(blocked, q, k, v, go, mask=mask)  # 2-D
    biased = mask + torch.randn(shape[3], shape[4]) * (mask == 0)  # a bias where seen
    check(blocked, q, k, v, go, mask=biased.expand(shape[0], shape[1], -1, -1), scale=0.3)


def test_sliding_windows_and_padded_keys_match_eager(blocked):
    q, k, v, go = qkv(2, 4, 4, 300, 300, 32, seed=2)
    i = torch.arange(300)
    window = torch.where((i[None] <= i[:, None]) & (i[None] > i[:, None] - 100), 0.0, MIN)
    check(blocked, q, k, v, go, mask=window)
    padded = torch.zeros(2, 1, 1, 300)
    padded[:, :, :, 180:] = MIN  # every query sees the first 180 keys (BERT's padding)
    padded[1, :, :, 120:] = float("-inf")
    check(blocked, q, k, v, go, mask=padded)
    per_head = torch.stack([torch.stack([causal_mask(300, 300), window, padded[b, 0].expand(
        300, 300), causal_mask(300, 300, float("-inf"))]) for b in range(2)])
    per_head[1, 0, :, 250:] = MIN  # each batch and head its own mask and map
    check(blocked, q, k, v, go, mask=per_head.contiguous())


def test_a_row_whose_mask_hides_every_key_is_eagers(blocked):
    """A query row that sees no key gets eager's answer (a uniform row over finfo.min
    values, NaN for -inf), never what the skipped blocks would have changed."""
    q, k, v, go = qkv(1, 2, 2, 200, 200, 16, seed=3)
    for hidden in (MIN, float("-inf")):
        mask = causal_mask(200, 200, hidden)
        mask[150] = hidden
        got = blocked.forward(q, k, v, 0.0, False, attn_mask=mask)
        want = FORWARD(q, k, v, 0.0, False, attn_mask=mask)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-6, equal_nan=True)


def test_nan_and_inf_inputs_give_eagers_rows(blocked):
    q, k, v, go = qkv(1, 2, 2, 150, 150, 16, seed=4)
    q[0, 1, 70, 3] = float("nan")
    k[0, 0, 100, 0] = float("inf")
    got = blocked.forward(q, k, v, 0.0, True)
    want = FORWARD(q, k, v, 0.0, True)
    assert torch.equal(got[0].isnan(), want[0].isnan())
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5, equal_nan=True)


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 2), Hk=st.integers(1, 3), group=st.integers(1, 3),
       Lq=st.integers(1, 200), Lk=st.integers(1, 200), D=st.sampled_from([4, 16, 24, 64]),
       masked=st.booleans(), seed=st.integers(0, 1000))
def test_any_shape_matches_eager(blocked, B, Hk, group, Lq, Lk, D, masked, seed):
    q, k, v, go = qkv(B, Hk * group, Hk, Lq, Lk, D, seed=seed)
    mask = causal_mask(Lq, Lk)
    if masked and hidden_share(mask) >= 0.25:
        check(blocked, q, k, v, go, mask=mask)
    elif masked:  # too little to skip: eager's op, forward and backward
        assert calls_eager(blocked, q, k, v, 0.0, False, attn_mask=mask)
        assert backward_calls_eager(blocked, go, q, k, v, mask)
    else:
        check(blocked, q, k, v, go, causal=True)


def test_masks_hiding_under_a_quarter_of_the_blocks_are_eagers(blocked):
    """BERT's padded tail of an eighth of the keys: eager's op, forward and backward (with
    64 keys a block the blocked path was slower than eager's 512 there)."""
    q, k, v, go = qkv(1, 4, 4, 512, 512, 64, seed=5)
    padded = torch.zeros(1, 1, 1, 512)
    padded[..., 448:] = MIN
    assert hidden_share(padded[0, 0].expand(512, 512)) == 1 / 8
    assert calls_eager(blocked, q, k, v, 0.0, False, attn_mask=padded)
    assert backward_calls_eager(blocked, go, q, k, v, padded)
    padded[..., 384:] = MIN  # a quarter: the blocked path
    check(blocked, q, k, v, go, mask=padded)


def calls_eager(blocked, *args, **kwargs):
    with Counting(FORWARD, BACKWARD) as counted:
        got = blocked.forward(*args, **kwargs)
    want = FORWARD(*args, **kwargs)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    return counted.calls == 1


def backward_calls_eager(blocked, go, q, k, v, mask):
    out = FORWARD(q, k, v, 0.0, False, attn_mask=mask)
    with Counting(FORWARD, BACKWARD) as counted:
        got = blocked.backward(go, q, k, v, *out, 0.0, False, attn_mask=mask)
    want = BACKWARD(go, q, k, v, *out, 0.0, False, attn_mask=mask)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    return counted.calls == 1


def test_calls_it_does_not_take_are_eagers_op(blocked):
    q, k, v, go = qkv(1, 2, 2, 100, 100, 16)
    full = causal_mask(100, 100)
    assert calls_eager(blocked, q, k, v, 0.0, False)  # no causal mask: eager was as fast
    assert calls_eager(blocked, q, k, v, 0.0, False, attn_mask=torch.zeros(100, 100))
    for bad in (full.bool(), full.double()):  # masks eager's op refuses: its error
        with pytest.raises(RuntimeError) as want:
            FORWARD(q, k, v, 0.0, False, attn_mask=bad)
        with pytest.raises(RuntimeError) as got:
            blocked.forward(q, k, v, 0.0, False, attn_mask=bad)
        assert str(got.value) == str(want.value)
    assert calls_eager(blocked, q.double(), k.double(), v.double(), 0.0, True)
    # a strided last dim (eager's own values vary from call to call there)
    with Counting(FORWARD, BACKWARD) as counted:
        blocked.forward(q[..., ::2], k[..., ::2], v[..., ::2], 0.0, True)
    assert counted.calls == 1
    assert calls_eager(blocked, q, k, v, 0.0, True, attn_mask=full)  # both: eager decides
    assert calls_eager(blocked, q, k, v, 0.0, False, attn_mask=full[:, -1:])  # broadcast keys
    small = causal_mask(40, 40)
    assert calls_eager(blocked, q[:, :, :40], k[:, :, :40], v[:, :, :40], 0.0, False,
                       attn_mask=small)  # one block: nothing to skip
    with pytest.raises(RuntimeError, match="dropout"):  # eager's op refuses dropout
        blocked.forward(q, k, v, 0.2, True)
    x = q.clone().requires_grad_()
    assert calls_eager(blocked, x, k, v, 0.0, True)


ATTENTION_NODE = """\
graph @g(%q: f32[1, 4, 128, 16], %k: f32[1, 4, 128, 16], %v: f32[1, 4, 128, 16]) {
  %o, %l = aten._scaled_dot_product_flash_attention_for_cpu.default(%q, %k, %v) \
{dropout_p = 0.0, is_causal = CAUSAL} : f32[1, 4, 128, 16], f32[1, 4, 128]
  return %o, %l
}"""


@pytest.mark.parametrize("causal, offered", [("true", True), ("false", False)])
def test_the_codegen_offers_it_for_causal_nodes(registry, codegen, causal, offered):
    graph = parse_graph(ATTENTION_NODE.replace("CAUSAL", causal))
    calls = library_calls(None, [codegen], registry)
    assert [calls(n) is not None for n in graph.nodes] == [offered]


class Attention(torch.nn.Module):
    """Grouped-query attention as language models write it: a causal flag, or the causal
    mask materialised with finfo.min (Llama's and Qwen2's in transformers)."""

    def __init__(self, masked: bool, H=8, Hk=2, D=32):
        super().__init__()
        self.masked, self.H, self.Hk, self.D = masked, H, Hk, D
        self.q = torch.nn.Linear(128, H * D)
        self.kv = torch.nn.Linear(128, 2 * Hk * D)

    def forward(self, x):
        B, L, _ = x.shape
        q = self.q(x).view(B, L, self.H, self.D).transpose(1, 2)
        k, v = (t.transpose(1, 2) for t in self.kv(x).view(B, L, 2, self.Hk, self.D).unbind(2))
        if self.masked:
            k, v = (t.repeat_interleave(self.H // self.Hk, 1) for t in (k, v))
            mask = causal_mask(L, L)[None, None]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return o.transpose(1, 2).reshape(B, L, -1)


@pytest.mark.parametrize("masked", [False, True])
def test_a_compiled_training_step_runs_it(tmp_path, masked):
    torch.manual_seed(0)
    model = Attention(masked)
    _, fn = compiled(model, tmp_path)
    x = torch.randn(2, 300, 128)
    fn(x).sum().backward()  # compiled (its tracing runs torch's ops on fake tensors)
    model.zero_grad()
    runs = []
    for f in (model, fn):
        with torch.profiler.profile() as profiled:  # (a dispatch mode stops dynamo)
            out = f(x)
            out.square().mean().backward()
        eager_calls = sum(e.count for e in profiled.key_averages()
                          if "_scaled_dot_product_flash_attention_for_cpu" in e.key)
        runs.append((out.detach(), [p.grad.clone() for p in model.parameters()], eager_calls))
        model.zero_grad()
    (want, w_grads, eager_calls), (got, g_grads, compiled_calls) = runs
    assert eager_calls == 2 and compiled_calls == 0
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for g, w in zip(g_grads, w_grads):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-5)


def test_the_forward_s_library_builds_beside_the_graph_s(monkeypatch, tmp_path):
    """Compiling a causal attention for inference, cold: when the graph's own library
    starts building (``prepare``), the attention's forward library is already building on
    its thread (two compilers at once); the backward's is never built; eager's values."""
    from torchloom_codegen_cpu.codegen import CpuCodegen
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "cold"))
    builds = []
    real = CpuCodegen._build

    def build(self, source):
        kind = "attention" if "#define TL_ATTN_" in source else "graph"
        if not self.directory().is_relative_to(tmp_path):  # (an earlier test's thread)
            return real(self, source)
        builds.append((kind, threading.current_thread().name, self._attention.started_ahead()))
        return real(self, source)
    monkeypatch.setattr(CpuCodegen, "_build", build)
    torch.manual_seed(0)
    model = Attention(masked=False).eval()

    def step(x):
        return torch.tanh(model(torch.relu(x) * 2.0)) + 1.0
    _, fn = compiled(step, tmp_path)
    x = torch.randn(2, 300, 128)
    with torch.no_grad():
        got, want = fn(x), step(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    graph_builds = [b for b in builds if b[0] == "graph"]
    attention_builds = [b for b in builds if b[0] == "attention"]
    assert graph_builds and graph_builds[0][2] == ["forward"]  # already started
    assert [b[1] for b in attention_builds] == ["torchloom-attention-forward"]


@pytest.mark.parametrize("where", ["key", "value"])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_keys_or_values_give_eagers_op(blocked, where, bad):
    """A block the mask hides whole is skipped only where every key and value is finite:
    eager's op multiplies them (by 0), so an inf or NaN there makes rows NaN; and rows of
    infinite scores follow its own rules. With one, the call is eager's op's."""
    q, k, v, go = qkv(1, 2, 2, 200, 200, 16, seed=5)
    mask = causal_mask(200, 200)  # 6 of 16 blocks hidden whole: the blocked path's
    (k if where == "key" else v)[0, 1, 190, 3] = bad  # key 190: hidden from rows 0-189
    with torch.no_grad():
        want = FORWARD(q, k, v, 0.0, False, attn_mask=mask)
        wants = BACKWARD(go, q, k, v, *want, 0.0, False, attn_mask=mask)
        assert bool(want[0].isnan().any())  # the case is one where eager gives NaN
        with Counting(FORWARD, BACKWARD) as counted:
            got = blocked.forward(q, k, v, 0.0, False, attn_mask=mask)
            grads = blocked.backward(go, q, k, v, *want, 0.0, False, attn_mask=mask)
    assert counted.calls == 2, "eager's op did not run"
    for a, b in zip((*got, *grads), (*want, *wants)):
        assert torch.equal(a, b) or torch.equal(a.isnan(), b.isnan())
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    # finite keys and values: the same blocks are skipped as before (values unchanged)
    q, k, v, go = qkv(1, 2, 2, 200, 200, 16, seed=5)
    check(blocked, q, k, v, go, mask)


def _both_directions(blocked, q, k, v, go, mask, backward=True, lse_atol=2e-5):
    """The blocked forward and backward (from eager's forward) against eager's: NaN where
    eager's are, values within float rounding elsewhere (the logsumexp within
    ``lse_atol``: the rounding of its largest score, which the two sides sum in other
    orders)."""
    with torch.no_grad():
        want = FORWARD(q, k, v, 0.0, False, attn_mask=mask)
        got = blocked.forward(q, k, v, 0.0, False, attn_mask=mask)
        grads = blocked.backward(go, q, k, v, *want, 0.0, False, attn_mask=mask) \
            if backward else ()
        wants = BACKWARD(go, q, k, v, *want, 0.0, False, attn_mask=mask) if backward else ()
    for i, (a, b) in enumerate(zip((*got, *grads), (*want, *wants))):
        assert torch.equal(a.isnan(), b.isnan())
        torch.testing.assert_close(a, b, rtol=1e-4, atol=lse_atol if i == 1 else 2e-5,
                                   equal_nan=True)
    return want


@pytest.mark.parametrize("hidden", [float("-inf"), MIN])
def test_a_nan_in_the_mask_is_never_skipped(blocked, hidden):
    """A NaN among a block's hiding values, or among a block of zeros, makes its rows NaN
    in eager's op: the block is computed (a min/max over the block ignores NaN)."""
    q, k, v, go = qkv(1, 2, 2, 256, 256, 16, seed=7)
    mask = causal_mask(256, 256, hidden)
    mask[10, 200] = float("nan")  # in a block hidden otherwise
    mask[200, 20] = float("nan")  # in a block of zeros
    want = _both_directions(blocked, q, k, v, go, mask)
    assert bool(want[0][0, :, 10].isnan().all()) and bool(want[0][0, :, 200].isnan().all())


def test_a_finite_hiding_value_is_skipped_only_below_every_score(blocked):
    """-1e30 hides a key only while scores are far smaller: a key whose score is ~1e30
    beats it in eager's op, and the blocked path then computes the block (or calls eager's
    op), never skipping it."""
    q, k, v, go = qkv(1, 1, 1, 256, 256, 16, seed=8)
    q = q.abs() + 0.1
    k[0, 0, 200] = 1e30  # every query's score for key 200 is ~1e30 * sum(q) / 4
    mask = causal_mask(256, 256, -1e30)  # (gradients: see the next test's last lines)
    want = _both_directions(blocked, q, k, v, go, mask, backward=False)
    torch.testing.assert_close(want[0][0, 0, 10], v[0, 0, 200])  # (eager: key 200 wins)
    # a hiding value of -inf hides it whatever its score: those blocks are skipped again
    q, k, v, go = qkv(1, 1, 1, 256, 256, 16, seed=8)
    check(blocked, q, k, v, go, causal_mask(256, 256, float("-inf")))


@pytest.mark.parametrize("where", ["query", "grad_out", "out"])
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_query_side_values_give_eagers_values(blocked, where, bad):
    """A hidden key's weights are 0: eager's op multiplies them by the queries (forward)
    and by the output's gradient and the output (backward), so an inf or NaN there makes
    the hidden keys' scores or gradients NaN, which a skip would hide."""
    q, k, v, go = qkv(1, 2, 2, 200, 200, 16, seed=9)
    mask = causal_mask(200, 200, float("-inf"))
    with torch.no_grad():
        out, lse = FORWARD(q, k, v, 0.0, False, attn_mask=mask)
    {"query": q, "grad_out": go, "out": out}[where][0, 1, 5, 3] = bad
    with torch.no_grad():
        got = blocked.forward(q, k, v, 0.0, False, attn_mask=mask)
        want = FORWARD(q, k, v, 0.0, False, attn_mask=mask)
        grads = blocked.backward(go, q, k, v, out, lse, 0.0, False, attn_mask=mask)
        wants = BACKWARD(go, q, k, v, out, lse, 0.0, False, attn_mask=mask)
    pairs = [*zip(grads, wants), *([] if where == "query" else zip(got, want))]
    for a, b in pairs:
        assert torch.equal(a.isnan(), b.isnan())
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5, equal_nan=True)


_MASKED = st.sampled_from([0.0, float("-inf"), MIN, -1e30, -3e29, float("nan"), float("inf"),
                          1.5, -2.0])
_VALUES = st.sampled_from([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.5, -2.0])


@settings(max_examples=100, deadline=None)
@given(blocks=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), _MASKED),
                       min_size=0, max_size=6),
       spots=st.lists(st.tuples(st.integers(0, 4), _MASKED, _VALUES), min_size=0, max_size=4),
       big=st.sampled_from([1.0, 1e25, 1e30]), seed=st.integers(0, 2 ** 16))
def test_masks_and_values_of_any_kind_give_eagers_values(blocked, blocks, spots, big, seed):
    """Causal finfo.min masks with whole 64 x 64 blocks set to any special value, single
    values anywhere set to one (mask: any of ``_MASKED``; query, key, value, output
    gradient: any of ``_VALUES``), one key scaled up to 1e30: the blocked path's results
    (whichever way it takes) are eager's, NaN where eager's are. (Gradients only at unit
    scale: where a score reaches 1e25, its rounding alone is 1e18, and either side's
    exponential of it less the logsumexp overflows or vanishes by that.)"""
    q, k, v, go = qkv(1, 2, 2, 256, 256, 8, seed=seed % 97)
    k[0, :, seed % 256] *= big
    mask = causal_mask(256, 256)
    g = torch.Generator().manual_seed(seed)
    for i, j, value in blocks:
        mask[i * 64:(i + 1) * 64, j * 64:(j + 1) * 64] = value
    for which, masked, value in spots:
        t = (mask, q, k, v, go)[which]
        at = tuple(int(torch.randint(0, n, (1,), generator=g)) for n in t.shape)
        t[at] = masked if which == 0 else value
    if not attention._fast(q, k, v, (), 0.0, False, mask):
        return
    # a score of a key scaled by ``big`` is a sum of 8 products of that size: its rounding,
    # in either side's order, is up to ~8 * 2^-24 * big (a logsumexp of 3e21 from products
    # of 1e25 differed by 3.5e17, 1.2e-4 of it: seed 1465)
    _both_directions(blocked, q, k, v, go, mask, backward=big == 1.0,
                     lse_atol=2e-5 if big == 1.0 else 1e-6 * big)


@pytest.mark.parametrize("where", ["key", "value", "grad_out", "out"])
def test_a_causal_flag_with_values_not_finite_gives_eagers_values(blocked, where):
    """Eager's causal blocks of 512 keys multiply the hidden keys' zero weights too: a NaN
    value or key hidden from a row makes it NaN (every row, at 300 tokens), and a NaN
    output gradient makes the hidden keys' gradients NaN; the blocked path then runs
    eager's op."""
    q, k, v, go = qkv(1, 2, 1, 300, 300, 16, seed=11)
    with torch.no_grad():
        out, lse = FORWARD(q, k, v, 0.0, True)
    {"key": k, "value": v, "grad_out": go, "out": out}[where][0, 0, 150, 3] = float("nan")
    with torch.no_grad():
        got = blocked.forward(q, k, v, 0.0, True)
        grads = blocked.backward(go, q, k, v, out, lse, 0.0, True)
        want = FORWARD(q, k, v, 0.0, True)
        wants = BACKWARD(go, q, k, v, out, lse, 0.0, True)
    for a, b in zip((*got, *grads), (*want, *wants)):
        assert torch.equal(a.isnan(), b.isnan())
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5, equal_nan=True)


@settings(max_examples=60, deadline=None)
@given(spots=st.lists(st.tuples(st.integers(0, 3), _VALUES), min_size=0, max_size=3),
       L=st.integers(65, 300), seed=st.integers(0, 2 ** 16))
def test_a_causal_flag_and_values_of_any_kind_give_eagers_values(blocked, spots, L, seed):
    """A causal flag with single values of the query, key, value or output gradient set to
    inf, NaN or a signed zero: eager's results either way the blocked path goes."""
    q, k, v, go = qkv(1, 2, 1, L, L, 8, seed=seed % 89)
    g = torch.Generator().manual_seed(seed)
    for which, value in spots:
        t = (q, k, v, go)[which]
        t[tuple(int(torch.randint(0, n, (1,), generator=g)) for n in t.shape)] = value
    with torch.no_grad():
        want = FORWARD(q, k, v, 0.0, True)
        wants = BACKWARD(go, q, k, v, *want, 0.0, True)
        got = blocked.forward(q, k, v, 0.0, True)
        grads = blocked.backward(go, q, k, v, *want, 0.0, True)
    for a, b in zip((*got, *grads), (*want, *wants)):
        assert torch.equal(a.isnan(), b.isnan())
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5, equal_nan=True)
