"""What a survey of Hugging Face architectures beyond the zoo (tiny models from configs,
training steps and inference through ``torch.compile(backend="torchloom")`` against
eager; session 37) found, reduced to the pattern each came from.

- Phi-3, Mixtral, EfficientNet and MobileViT train with a gated activation over one half
  of a projection (``gate, up = h.chunk(2, -1)``; ``act(gate) * up``). Once the lengths
  become symbolic, ``fusion.decompose`` keeps ``silu_backward`` whole (its input, a half of
  the projection, is strided: decompositions at symbolic sizes take contiguous inputs
  only), and the cpu codegen had no template for it: the group ran on eager, saying
  ``op aten.silu_backward.default is not in its op table``.
- MobileViT unfolds its feature maps into patches with sizes from ``math.ceil``, which the
  IR cannot spell (``?``); ``canonicalize`` folded the clone that makes a transposed
  tensor contiguous (its type printed like its input's), and the view after it failed at
  run time at the second image size (tests/builtin/test_canonicalize.py has the graph).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torchloom.backend import torchloom_backend
from torchloom.tools import Compiler


def _swiglu(gu: torch.Tensor, act) -> torch.Tensor:
    gate, up = gu.chunk(2, dim=-1)
    return act(gate) * up


def _groups_on_eager(compiler: Compiler) -> list[list[str]]:
    return [[str(r) for r in ch.fallback_reasons if r.codegen == "cpu"]
            for c in compiler.compilations for ch in c.compiled.choices
            if ch.codegen == "eager"]


@pytest.mark.slow
@pytest.mark.parametrize("act", [F.silu, F.gelu, torch.sigmoid, torch.tanh, F.mish],
                         ids=lambda a: a.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gated_activation_gradient_at_symbolic_lengths_compiles(act, dtype):
    compiler = Compiler("default", compile_cache=False)
    torch._dynamo.reset()
    f = torch.compile(lambda gu: _swiglu(gu, act), backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    g = torch.Generator().manual_seed(0)
    for n in (4, 5, 9):  # the second length makes the graphs symbolic
        x = (torch.randn(n, 3, 16, generator=g) * 4).to(dtype)
        x[0, 0, :3] = torch.tensor([0.0, -0.0, 30.0])  # edges of the sigmoid
        weight = torch.randn(n, 3, 8, generator=g).to(dtype)
        got_x = x.clone().requires_grad_()
        (f(got_x) * weight).sum().backward()
        want_x = x.clone().requires_grad_()
        (_swiglu(want_x, act) * weight).sum().backward()
        torch.testing.assert_close(got_x.grad, want_x.grad)
    assert len(compiler.compilations) >= 3  # forward and backward, and symbolic ones
    assert _groups_on_eager(compiler) == []


def test_silu_backward_matches_eager_on_edge_values():
    """The template alone, as eager computes it: dy * s * (1 + x * (1 - s)), s the
    sigmoid, in f32 for bf16 (one rounding) and in f64 for f64."""
    values = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1.0, -1.0, 20.0, -20.0, 88.0, -88.0,
                           89.0, -89.0, 104.0, -104.0, 3.4e38, -3.4e38, float("inf"),
                           float("-inf"), float("nan")])
    g = torch.Generator().manual_seed(1)
    f = torch.compile(torch.ops.aten.silu_backward.default, backend="torchloom")
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = torch.cat([values, torch.randn(4000, generator=g) * 6]).to(dtype)
        dy = torch.randn(x.shape, generator=g).to(dtype)
        dy[: len(values)] = 1.5
        torch._dynamo.reset()
        torch.testing.assert_close(f(dy, x), torch.ops.aten.silu_backward(dy, x),
                                   equal_nan=True)


def _fold(x: torch.Tensor) -> torch.Tensor:
    """MobileViT's unfolding into 2x2 patches and folding back, reduced."""
    b, c, h, w = x.shape
    nh, nw = int(math.ceil(h / 2)), int(math.ceil(w / 2))
    y = x.reshape(b * c * nh, 2, nw, 2).transpose(1, 2)
    y = y.reshape(b, c, nh * nw, 4).transpose(1, 3)
    y = y.reshape(b, 4, nh * nw, c) + 1
    y = y.transpose(1, 3).reshape(b * c * nh, nw, 2, 2).transpose(1, 2)
    return y.reshape(b, c, h, w) * 2


@pytest.mark.slow
def test_patches_of_ceil_sizes_fold_back():
    torch._dynamo.reset()
    f = torch.compile(_fold, backend="torchloom", dynamic=True)
    g = torch.Generator().manual_seed(2)
    for shape in ((2, 16, 6, 6), (1, 8, 4, 10), (3, 4, 8, 8)):
        x = torch.randn(shape, generator=g)
        torch.testing.assert_close(f(x), _fold(x))
