"""A checkpointed dropout's mask drawn from its shape (torchloom.frontend.checkpointed_dropout,
run by ``backend.cse_then_min_cut`` before the split): the rewritten graph gives eager's
``native_dropout`` bit for bit (output, mask, the generator afterwards), only recomputed
CPU f32/f64 dropouts are rewritten, and the backward of a checkpointed pre-norm block no
longer recomputes the product whose output only the dropout reads."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.fx
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint

from torchloom.frontend import checkpointed_dropout
from torchloom.tools import Compiler

NATIVE = torch.ops.aten.native_dropout.default


def dropout_graph(shape, dtype, p, train=True, tag=CheckpointPolicy.PREFER_RECOMPUTE,
                  device="cpu", layout=torch.contiguous_format):
    """A graph ``x -> native_dropout(x, p, train)`` with fake values, as aot_autograd's
    joint graph has them, the dropout tagged ``tag``."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    with FakeTensorMode() as mode:
        x.meta["val"] = mode.from_tensor(torch.empty(shape, dtype=dtype, device=device)
                                         .to(memory_format=layout))
        drop = graph.call_function(NATIVE, (x, p, train))
        drop.meta["val"] = NATIVE(x.meta["val"], p, train)
    if tag is not None:
        drop.meta["recompute"] = tag
    outs = []
    for i in (0, 1):
        item = graph.call_function(__import__("operator").getitem, (drop, i))
        item.meta["val"] = drop.meta["val"][i]
        outs.append(item)
    graph.output(tuple(outs))
    return graph


def run(graph, x, seed):
    torch.manual_seed(seed)
    out, mask = torch.fx.GraphModule(torch.nn.Module(), graph)(x)
    return out, mask, torch.get_rng_state()


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3),
       dtype=st.sampled_from([torch.float32, torch.float64]),
       p=st.sampled_from([0.0, 0.1, 0.5, 1 / 3, 0.9, 1.0]), seed=st.integers(0, 10 ** 6))
def test_the_rewritten_dropout_is_eagers_bit_for_bit(shape, dtype, p, seed):
    graph = dropout_graph(shape, dtype, p)
    assert checkpointed_dropout.masks_from_shapes(graph) == 1
    assert NATIVE not in {n.target for n in graph.nodes}
    x = torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    x.view(-1)[0] = float("nan")
    x.view(-1)[-1] = -0.0
    got, want = run(graph, x, seed), run(dropout_graph(shape, dtype, p), x, seed)
    assert got[1].dtype == torch.bool and torch.equal(got[1], want[1])
    as_int = {torch.float32: torch.int32, torch.float64: torch.int64}[dtype]
    assert torch.equal(got[0].view(as_int), want[0].view(as_int))  # NaN, -0.0: the bits
    assert torch.equal(got[2], want[2])


@pytest.mark.parametrize("case", [
    dict(dtype=torch.bfloat16), dict(dtype=torch.float16), dict(train=False),
    dict(tag=None), dict(tag=CheckpointPolicy.MUST_SAVE), dict(shape=(0, 4)),
    dict(device="meta"),
    # eager's mask takes a channels-last input's layout, drawn in its memory order
    dict(shape=(2, 3, 5, 4), layout=torch.channels_last)])
def test_what_it_leaves(case):
    args = {**dict(shape=(4, 6), dtype=torch.float32, p=0.2), **case}
    graph = dropout_graph(args.pop("shape"), args.pop("dtype"), args.pop("p"), **args)
    assert not checkpointed_dropout.rewritable(graph)
    assert checkpointed_dropout.masks_from_shapes(graph) == 0


class PreNorm(torch.nn.Module):
    """GPT-2's MLP half: ``x + dropout(fc2(gelu(fc1(norm(x)))))``, checkpointed."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Sequential(
            torch.nn.LayerNorm(32), torch.nn.Linear(32, 64), torch.nn.GELU(),
            torch.nn.Linear(64, 32), torch.nn.Dropout(0.2)) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = x + checkpoint(layer, x, use_reentrant=False)
        return torch.nn.functional.layer_norm(x, (32,))


def step(model, fn, dtype):
    """(output, gradients, generator state after) of one step of ``fn`` from seed 5."""
    x = torch.randn(3, 20, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    torch.manual_seed(5)
    out = fn(x)
    out.sum().backward()
    return out.detach(), [p.grad for p in model.parameters()], torch.get_rng_state()


def compiled_step(tmp_path, rewrite: bool, dtype):
    """The compiled step's results, and the number of matrix products in its backward."""
    torch.manual_seed(0)
    model = PreNorm().to(dtype)
    compiler = Compiler("default", cache_dir=tmp_path / str(rewrite), compile_cache=False,
                        keep_ir=True)
    torch._dynamo.reset()
    from torchloom.backend import torchloom_backend
    fn = torch.compile(model, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    results = step(model, fn, dtype)
    torch._dynamo.reset()
    forward, backward = compiler.compilations  # (the backward compiles after its forward)
    assert [c.codegen for comp in (forward, backward) for c in comp.compiled.choices
            if c.codegen != "cpu"] == []  # every group typed and compiled
    products = sum(str(backward.before_ir).count(f"aten.{op}.default(")
                   for op in ("mm", "addmm"))
    return results, products


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_recomputation_no_longer_repeats_the_product_before_the_dropout(
        tmp_path, monkeypatch, dtype):
    with monkeypatch.context() as patched:
        patched.setattr(checkpointed_dropout, "rewritable", lambda graph: False)
        before, before_products = compiled_step(tmp_path, False, dtype)
    after, after_products = compiled_step(tmp_path, True, dtype)
    # per layer: fc1 recomputed (the gelu's input), fc2 only before the rewrite (the
    # dropout's input), and the four gradient products of the layer's weights and input;
    # after it, the last layer's fc2 still is: the final norm's input is recomputed from
    # it (the split's choice: GPT-2's last block alike)
    assert (before_products, after_products) == (2 * (2 + 4), 2 * (1 + 4) + 1)
    torch.manual_seed(0)
    model = PreNorm().to(dtype)
    eager = step(model, model, dtype)
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}
    for got in (after, before):
        assert torch.equal(got[2], eager[2])  # as many draws as eager's
        torch.testing.assert_close(got[0], eager[0], **tolerance)  # eager's masks
        for g, w in zip(got[1], eager[1]):
            torch.testing.assert_close(g, w, **tolerance)


@pytest.mark.parametrize("grad", [True, False])
def test_a_checkpointed_dropout_without_gradients_compiles(tmp_path, grad):
    """No input needs a gradient (a frozen model in training mode; ``no_grad``): the graph
    has no backward, and aot_autograd's pass for loss-and-backward graphs refuses its
    checkpointed random ops with every backend; torchloom compiles it (eager's masks)."""
    def f(x):
        return checkpoint(lambda a: torch.nn.functional.dropout(a.sin(), 0.3, True) * 2, x,
                          use_reentrant=False)

    compiler = Compiler("default", cache_dir=tmp_path, compile_cache=False)
    torch._dynamo.reset()
    from torchloom.backend import torchloom_backend
    fn = torch.compile(f, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    x = torch.randn(6, 40)
    runs = []
    for call in (f, fn):
        torch.manual_seed(2)
        with torch.set_grad_enabled(grad):
            runs.append((call(x), torch.get_rng_state()))
    torch._dynamo.reset()
    (want, w_state), (got, g_state) = runs
    assert torch.equal(g_state, w_state) and torch.equal(got == 0, want == 0)
    torch.testing.assert_close(got, want)
    assert compiler.compilations and all(c.fallback_reason is None
                                         for c in compiler.compilations)
