"""layer_norm without a bias decomposes on the CPU as eager's kernel computes it: ``(x *
rstd - mean * rstd) * 1 + 0``, whose zeros are ``+0.0``, where torch's decomposition
``(x - mean) * rstd`` gives ``-0.0`` for an element ``-0.0`` on a row whose mean is
``+0.0``: ``decomposition_table`` adds ``0.0`` last, on the CPU only and only without a
bias (``fusion.decompose`` and the backend's decompositions before aot_autograd's split
share it). Checked on the IR, and end to end against eager: the sign of every zero, forward
and backward, with and without weight and bias, in every float dtype."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion_testing import run_passes
from torchloom.api import decomposition_table, parse_graph
from torchloom.backend import torchloom_backend
from torchloom.tools import Compiler
from torchloom_fusion.decompose import Decompose

F = torch.nn.functional


@pytest.mark.parametrize("device, affine, zero_added", [
    ("", "bias = none, weight = none", True),
    ("", "bias = none", True),
    (" @cuda:0", "bias = none, weight = none", False),
    ("", "", False),
])
def test_cpu_layer_norm_without_bias_adds_zero_last(registry, device, affine, zero_added):
    inputs = "%x, %w" if affine == "bias = none" else "%x" if affine else "%x, %w, %b"
    t, r = f"f32[6, 16]{device}", f"f32[6, 1]{device}"
    text = f"""graph @g(%x: {t}, %w: f32[16]{device}, %b: f32[16]{device}) {{
      %o, %m, %s = aten.native_layer_norm.default({inputs}) {{{affine}{', ' if affine else ''}eps = 1e-05, normalized_shape = [16]}} : {t}, {r}, {r}
      return %o, %m, %s
    }}"""
    graph = parse_graph(text)
    run_passes(graph, [Decompose()], registry)
    last = graph.outputs[0].producer
    assert "aten.native_layer_norm.default" not in [n.op for n in graph.nodes]
    assert (last.op == "aten.add.Tensor" and last.attrs.get("other") == 0.0 and
            len(last.inputs) == 1) == zero_added


@pytest.mark.parametrize("device, zero_added", [("cpu", True), ("cuda", False), (None, True)])
def test_table_adds_zero_by_the_device_given_or_traced(device, zero_added):
    from torch.fx.experimental.proxy_tensor import make_fx
    op = torch.ops.aten.native_layer_norm.default
    table = decomposition_table([op], device)
    gm = make_fx(lambda x: op(x, [8], None, None, 1e-5), decomposition_table=table)(
        torch.randn(2, 8))
    last = [n for n in gm.graph.nodes if n.op == "call_function"][-1]
    assert (last.target == torch.ops.aten.add.Tensor and last.args[1] == 0.0) == zero_added


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    yield tmp_path_factory.mktemp("layer_norm")
    torch._dynamo.reset()


def _same(actual, expected):
    # eager's x * rstd - mean * rstd (one fma) leaves the product's rounding where x equals
    # the mean, up to |x| rstd 2^-24 (rows of one element: rstd = 1 / sqrt(eps) ~ 316)
    rtol = {torch.bfloat16: 1.6e-2, torch.float32: 1.3e-6}.get(expected.dtype, 1e-7)
    torch.testing.assert_close(actual, expected, equal_nan=True, atol=1e-4, rtol=rtol)
    assert torch.equal(actual.isnan(), expected.isnan())
    zeros = (expected == 0) & (actual == 0)
    assert torch.equal(torch.signbit(actual[zeros]), torch.signbit(expected[zeros]))


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 5), cols=st.sampled_from([1, 3, 8, 17, 40, 64, 130]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
       affine=st.sampled_from(["none", "weight", "bias", "both"]),
       zeros=st.lists(st.integers(0, 10 ** 6), max_size=6), negative_rows=st.booleans(),
       train=st.booleans())
def test_signs_of_zero_match_eager(cache, rows, cols, dtype, affine, zeros, negative_rows,
                                   train):
    torch.manual_seed(rows * 1000 + cols)
    x = torch.randn(rows, cols, dtype=torch.float64).to(dtype)
    flat = x.view(-1)
    for pos in zeros:
        flat[pos % flat.numel()] = -0.0
    if negative_rows:
        x[0] = -0.0  # a whole row of -0.0: mean +0.0, every element normalizes to a zero
        if rows > 1:
            x[1] = torch.tensor([-0.0, 0.0] * cols, dtype=dtype)[:cols]
    w = torch.randn(cols, dtype=dtype) if affine in ("weight", "both") else None
    b = torch.randn(cols, dtype=dtype) if affine in ("bias", "both") else None
    if b is not None:
        b[0] = -0.0

    def fn(x, w, b):
        return F.layer_norm(x, (cols,), w, b)

    comp = Compiler("default", cache_dir=cache, compile_cache=False, strict=True)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": comp}))
    if not train:
        with torch.no_grad():
            _same(compiled(x, w, b), fn(x, w, b))
        return
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    outs = [f(xi, w, b) for f, xi in zip((compiled, fn), xs)]
    _same(outs[0].detach(), outs[1].detach())
    grad = torch.randn_like(outs[1])
    for out in outs:
        out.backward(grad)
    # a row of one element, or of equal elements (a row of zeros): its variance is 0, rstd
    # = 1 / sqrt(eps) ~ 316, and the gradient's terms (each up to rstd |g w|) cancel to a
    # few of their ulps (6.1e-5 for g w = -2.6: rows=1, cols=1, weight only; 9.3e-5 on a
    # row of +-0.0 of 3 elements)
    x64 = x.double()
    rstd = (x64.var(dim=1, unbiased=False) + 1e-5).rsqrt()
    gw = (grad * (1 if w is None else w)).double().abs()
    scale = (rstd[:, None] * gw).max().item()
    base = {torch.float32: (1e-5, 1.3e-6), torch.float64: (1e-7, 1e-7)}.get(dtype, (0, 0))
    atol = max(base[0], 4 * torch.finfo(dtype).eps * scale)
    torch.testing.assert_close(xs[0].grad, xs[1].grad, equal_nan=True,
                               **({"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16
                                  else {"atol": atol, "rtol": base[1]}))
