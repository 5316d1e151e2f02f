"""What a survey of Hugging Face architectures beyond the zoo (tiny models from configs,
training steps and inference through ``torch.compile(backend="torchloom")`` against
eager; session 37) found, reduced to the pattern each came from.

- Phi-3, Mixtral, EfficientNet and MobileViT train with a gated activation over one half
  of a projection (``gate, up = h.chunk(2, -1)``; ``act(gate) * up``). Once the lengths
  become symbolic, ``fusion.decompose`` keeps ``silu_backward`` whole (its input, a half of
  the projection, is strided: decompositions at symbolic sizes take contiguous inputs
  only), and the cpu codegen had no template for it: the group ran on eager, saying
  ``op aten.silu_backward.default is not in its op table``.
- SegFormer embeds patches with a strided convolution and normalises them flattened: at
  dynamic sizes its layer_norm gradient reads an input whose dim is ``A*B`` (the conv's
  output sizes, ``(s0-1)//4 + 1`` and so on) and whose stride is ``16*A*B``: the stride
  held no argument as a whole (``size symbol s0 has no value in the kernel``); a product
  holding all of an argument's factors is now that argument times the rest.
- MobileViT unfolds its feature maps into patches with sizes from ``math.ceil``, which the
  IR cannot spell (``?``); ``canonicalize`` folded the clone that makes a transposed
  tensor contiguous (its type printed like its input's), and the view after it failed at
  run time at the second image size (tests/builtin/test_canonicalize.py has the graph).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torchloom.backend import torchloom_backend
from torchloom.api import ScalarType, parse_graph, verify
from torchloom.runtime.executor import CompiledGraph
from torchloom.testing.reductions import group_text
from conftest import compare
from torchloom.tools import EagerCodegen
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


def test_patches_of_ceil_sizes_fold_back_on_cpu():
    """MobileViT's fold at dynamic sizes, forward and backward: every group compiles on
    cpu (sizes from ``math.ceil`` are ``CeilToInt(IntTrueDiv(h, 2))``, views and
    broadcasts whose sizes agree under Dynamo's guards only, and the backward's groups
    need the image's sizes, passed as ``int[sN]`` carriers by fusion.size-carriers)."""
    compiler = Compiler("default", compile_cache=False)
    torch._dynamo.reset()
    f = torch.compile(_fold, dynamic=True, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    g = torch.Generator().manual_seed(2)
    for shape in ((2, 16, 6, 6), (1, 8, 4, 10), (3, 4, 8, 8), (2, 8, 10, 4)):
        x = torch.randn(shape, generator=g)
        weight = torch.randn(shape, generator=g)
        got, want = x.clone().requires_grad_(), x.clone().requires_grad_()
        out = f(got)
        torch.testing.assert_close(out, _fold(want))
        (out * weight).sum().backward()
        (_fold(want) * weight).sum().backward()
        torch.testing.assert_close(got.grad, want.grad)
    assert _groups_on_eager(compiler) == []
    carried = [v.type for c in compiler.compilations for n in c.compiled.graph.nodes
               if n.op == "torchloom.fusion_group" for v in n.region.inputs if not v.uses]
    assert carried and all(isinstance(t, ScalarType) and t.size for t in carried)


def _norm_gradient(p: str, row: str, n: int) -> str:
    """The input gradient of a layer_norm over the last dim of ``f32[{p}]`` (row sums of
    ``f32[{row}]``, ``n`` elements a row), ``%t8``, as aot_autograd writes it."""
    return f"""
    %t0 = aten.mul.Tensor(%g, %w) : f32[{p}]
    %t1 = aten.mul.Tensor(%t0) {{other = {n}}} : f32[{p}]
    %t2 = aten.sum.dim_IntList(%t0) {{dim = [2], keepdim = true}} : f32[{row}]
    %t3 = aten.mul.Tensor(%t0, %xh) : f32[{p}]
    %t4 = aten.sum.dim_IntList(%t3) {{dim = [2], keepdim = true}} : f32[{row}]
    %t5 = aten.mul.Tensor(%xh, %t4) : f32[{p}]
    %t6 = aten.sub.Tensor(%t1, %t2) : f32[{p}]
    %t7 = aten.sub.Tensor(%t6, %t5) : f32[{p}]
    %t8 = aten.mul.Tensor(%rstd, %t7) : f32[{p}]"""


#: OPT's layer_norm gradient beside its dropout's (training with dropout): the row sums
#: of [2, 8, 32] read back through the [16, 32] view the dropout gradient takes
OPT_DROPOUT = group_text(
    "%g: f32[2, 8, 32], %w: f32[32], %xh: f32[2, 8, 32], %rstd: f32[2, 8, 1], "
    "%mask: b8[16, 32]", _norm_gradient("2, 8, 32", "2, 8, 1", 32) + """
    %t9 = aten.view.default(%t8) {size = [16, 32]} : f32[16, 32]
    %t10 = aten.native_dropout_backward.default(%t9, %mask) {scale = 1.25} : f32[16, 32]
    %t11 = aten.sum.dim_IntList(%g) {dim = [0, 1]} : f32[32]
    %t12 = aten.mul.Tensor(%g, %xh) : f32[2, 8, 32]
    %t13 = aten.sum.dim_IntList(%t12) {dim = [0, 1]} : f32[32]""",
    "%t10: f32[16, 32], %t8: f32[2, 8, 32], %t11: f32[32], %t13: f32[32]")


def test_row_results_read_through_a_view_that_regroups_the_rows(check):
    """``(x / 8, x % 8, 0)`` is row ``x`` of ``[2, 8]``: the cpu writer declared ``x0 =
    x / 8`` and ``x1 = x % 8`` (was declined: ``reduction result %t2 is read at other
    elements than its row``)."""
    g = torch.Generator().manual_seed(3)
    inputs = (torch.randn(2, 8, 32, generator=g), torch.randn(32, generator=g),
              torch.randn(2, 8, 32, generator=g), torch.rand(2, 8, 1, generator=g) + 0.5,
              torch.rand(16, 32, generator=g) > 0.2)
    check(OPT_DROPOUT, *inputs)
    # a read at other rows (the row sums transposed, then flattened) is no row's result:
    # declined, or computed right
    other = OPT_DROPOUT.replace(
        "%t10 = aten.native_dropout_backward.default(%t9, %mask) {scale = 1.25} : f32[16, 32]",
        "%p = aten.permute.default(%t2) {dims = [1, 0, 2]} : f32[8, 2, 1] strided[1, 8, 1]\n"
        "    %pc = aten.clone.default(%p) {memory_format = #contiguous_format} : f32[8, 2, 1]\n"
        "    %pv = aten.view.default(%pc) {size = [16, 1]} : f32[16, 1]\n"
        "    %t9b = aten.add.Tensor(%t9, %pv) : f32[16, 32]\n"
        "    %t10 = aten.native_dropout_backward.default(%t9b, %mask) {scale = 1.25} : "
        "f32[16, 32]")
    assert other != OPT_DROPOUT
    graph = parse_graph(other)
    verify(graph, check.registry)
    compiled = CompiledGraph(graph, check.registry, [check.codegen, EagerCodegen()])
    reasons = [str(r) for c in compiled.choices for r in c.fallback_reasons]
    assert [c.codegen for c in compiled.choices] == ["cpu"] or any(
        "other elements than its row" in r for r in reasons), reasons
    for got, want in zip(compiled(*inputs), check.reference(other, *inputs)):
        torch.testing.assert_close(got, want)


#: Mixtral's RMSNorm gradient (row sums) with its weight gradient (column sums), the input
#: gradient also repeated for two experts ([16, 2, 32]: neither the reduced shape's
#: element count nor a row's)
MIXTRAL_INPUTS = "%g: f32[2, 8, 32], %w: f32[32], %h: f32[2, 8, 32], %rstd: f32[2, 8, 1]"
MIXTRAL_EXPERTS = """
    %t0 = aten.mul.Tensor(%g, %w) : f32[2, 8, 32]
    %t1 = aten.mul.Tensor(%t0, %h) : f32[2, 8, 32]
    %t2 = aten.mul.Tensor(%t0, %rstd) : f32[2, 8, 32]
    %t3 = aten.sum.dim_IntList(%t1) {dim = [2], keepdim = true} : f32[2, 8, 1]
    %t6 = aten.pow.Tensor_Scalar(%rstd) {exponent = 3} : f32[2, 8, 1]
    %t7 = aten.mul.Scalar(%t3) {other = -0.5} : f32[2, 8, 1]
    %t8 = aten.mul.Tensor(%t7, %t6) : f32[2, 8, 1]
    %t9 = aten.expand.default(%t8) {size = [2, 8, 32]} : f32[2, 8, 32] strided[8, 1, 0]
    %t10 = aten.div.Scalar(%t9) {other = 32} : f32[2, 8, 32]
    %t12 = aten.mul.Scalar(%h) {other = 2.0} : f32[2, 8, 32]
    %t13 = aten.mul.Tensor(%t10, %t12) : f32[2, 8, 32]
    %t14 = aten.add.Tensor(%t2, %t13) : f32[2, 8, 32]
    %t15 = aten.view.default(%t14) {size = [16, 32]} : f32[16, 32]
    %t16 = aten.unsqueeze.default(%t15) {dim = 1} : f32[16, 1, 32]
    %t17 = aten.expand.default(%t16) {size = [16, 2, 32]} : f32[16, 2, 32] strided[32, 0, 1]
    %t18 = aten.clone.default(%t17) {memory_format = #contiguous_format} : f32[16, 2, 32]
    %t19 = aten.mul.Tensor(%h, %rstd) : f32[2, 8, 32]
    %t20 = aten.mul.Tensor(%g, %t19) : f32[2, 8, 32]
    %t21 = aten.sum.dim_IntList(%t20) {dim = [0, 1], keepdim = true} : f32[1, 1, 32]"""


@pytest.mark.parametrize("outputs", ["all", "no row output"])
def test_outputs_of_another_count_after_row_and_column_nests(check, outputs):
    """A pointwise nest after the row and column nests writes ``[16, 2, 32]``, reading the
    input gradient back (or, where that is no output, the row sums from a scratch array)
    (was declined: ``output %t18 of shape [16, 2, 32] has neither the elements of the
    reduced shape [2, 8, 32] nor those of a row``)."""
    results = ["%t18: f32[16, 2, 32]", "%t14: f32[2, 8, 32]", "%t21: f32[1, 1, 32]"]
    if outputs == "no row output":
        del results[1]
    text = group_text(MIXTRAL_INPUTS, MIXTRAL_EXPERTS, ", ".join(results))
    g = torch.Generator().manual_seed(4)
    inputs = (torch.randn(2, 8, 32, generator=g), torch.randn(32, generator=g),
              torch.randn(2, 8, 32, generator=g), torch.rand(2, 8, 1, generator=g) + 0.5)
    check(text, *inputs)
    source = check.source(text)
    assert ("scratch_t3" in source) == (outputs == "no row output"), source


#: Swin's layer_norm gradient (row sums, and the weight and bias gradients' column sums)
#: with the residual added, then partitioned into windows: [2, 64, 16] read as
#: [2, 2, 4, 2, 4, 16] with dims 2 and 3 swapped, copied contiguous (the row sums read at
#: other rows)
SWIN_INPUTS = ("%g: f32[2, 64, 16], %w: f32[16], %xh: f32[2, 64, 16], %rstd: f32[2, 64, 1], "
               "%res: f32[2, 64, 16]")
SWIN_WINDOWS = _norm_gradient("2, 64, 16", "2, 64, 1", 16) + """
    %t9 = aten.add.Tensor(%res, %t8) : f32[2, 64, 16]
    %t10 = aten.view.default(%t9) {size = [2, 2, 4, 2, 4, 16]} : f32[2, 2, 4, 2, 4, 16]
    %t11 = aten.transpose.int(%t10) {dim0 = 2, dim1 = 3} : f32[2, 2, 2, 4, 4, 16] strided[1024, 512, 64, 128, 16, 1]
    %t12 = aten.clone.default(%t11) {memory_format = #contiguous_format} : f32[2, 2, 2, 4, 4, 16]
    %t13 = aten.sum.dim_IntList(%g) {dim = [0, 1]} : f32[16]
    %t14 = aten.mul.Tensor(%g, %xh) : f32[2, 64, 16]
    %t15 = aten.sum.dim_IntList(%t14) {dim = [0, 1]} : f32[16]"""  # noqa: E501


@pytest.mark.parametrize("outputs", ["with the gradient", "windows only"])
def test_row_results_read_at_other_rows_beside_column_sums(check, outputs):
    """Every output no reduction computes (the input gradient, its windows) is written by a
    pointwise nest after the row and column nests, from the row sums those store in
    scratch arrays (was declined: ``reduction result %t2 is read at other elements than
    its row``)."""
    results = ["%t12: f32[2, 2, 2, 4, 4, 16]", "%t9: f32[2, 64, 16]", "%t13: f32[16]",
               "%t15: f32[16]"]
    if outputs == "windows only":
        del results[1]
    text = group_text(SWIN_INPUTS, SWIN_WINDOWS, ", ".join(results))
    g = torch.Generator().manual_seed(5)
    inputs = (torch.randn(2, 64, 16, generator=g), torch.randn(16, generator=g),
              torch.randn(2, 64, 16, generator=g), torch.rand(2, 64, 1, generator=g) + 0.5,
              torch.randn(2, 64, 16, generator=g))
    check(text, *inputs)
    source = check.source(text)
    assert "scratch_t2" in source and "scratch_t4" in source, source



class _PatchEmbed(torch.nn.Module):
    """SegFormer's overlapping patch embedding: a strided conv, flattened, normalised."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 7, stride=4, padding=3)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, img):
        x = self.conv(img)
        batch, c, h, w = x.shape
        x = self.norm(x.flatten(2).transpose(1, 2))
        return x.reshape(batch, h, w, c).permute(0, 3, 1, 2).contiguous()


def test_patch_embedding_gradient_at_dynamic_sizes_compiles():
    compiler = Compiler("default", compile_cache=False)
    torch._dynamo.reset()
    torch.manual_seed(6)
    eager = _PatchEmbed()
    torch.nn.init.uniform_(eager.norm.weight, 0.5, 1.5)
    model = copy.deepcopy(eager)
    f = torch.compile(model, dynamic=True, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    for h, w in ((32, 36), (21, 40), (9, 9)):
        img = torch.randn(2, 3, h, w)
        weight = torch.randn(2, 16, (h - 1) // 4 + 1, (w - 1) // 4 + 1)
        got, want = img.clone().requires_grad_(), img.clone().requires_grad_()
        (f(got) * weight).sum().backward()
        (eager(want) * weight).sum().backward()
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-4)
    for (name, a), b in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4, msg=name)
    assert len(compiler.compilations) == 2  # forward and backward, symbolic from the start
    assert _groups_on_eager(compiler) == []


_GRID = "CeilToInt(IntTrueDiv((((s1-1)//16))+1,2))*CeilToInt(IntTrueDiv((((s2-1)//16))+1,2))"


def test_heads_over_a_patch_grid_of_an_image_size_no_input_holds(check):
    """MobileViT's attention at dynamic image sizes (its backward): the width ``s1`` is no
    dim of any input, only inside the patch grid ``G`` (a dim: a whole-expression size
    argument); the heads' permuted strides hold ``G`` with the batch's ``4*s0``
    (``(4*s0)*G``): each whole is its own argument (was "size symbol s1 has no value")."""
    rows = f'"4*s0", "{_GRID}"'  # the heads' rows: batch times heads, the patch grid
    strided = f'strided["24*Max(1,{_GRID})", 12, "12*Max(1,{_GRID})", 1]'
    text = group_text(f'%x: f32["8*s0", "{_GRID}", 12], %a: int, %b: int', f"""
        %v = aten.view.default(%x, %a, %b) {{size = [$1, 2, $2, 12]}} : f32["4*s0", 2, "{_GRID}", 12]
        %p = aten.permute.default(%v) {{dims = [0, 2, 1, 3]}} : f32[{rows}, 2, 12] {strided}
        %c = aten.clone.default(%p) {{memory_format = #contiguous_format}} : f32[{rows}, 2, 12]
        %m, %r = aten.var_mean.correction(%c) {{correction = 0, dim = [3], keepdim = true}} : \
            f32[{rows}, 2, 1], f32[{rows}, 2, 1]
        %y = aten.sub.Tensor(%c, %r) : f32[{rows}, 2, 12]""",
                      f'%c: f32[{rows}, 2, 12], %y: f32[{rows}, 2, 12], %m: f32[{rows}, 2, 1]')
    compiled = check.compile(text)
    for batch, h, w in [(1, 32, 32), (2, 48, 40), (1, 100, 17), (3, 16, 200)]:
        grid = math.ceil(((w - 1) // 16 + 1) / 2) * math.ceil(((h - 1) // 16 + 1) / 2)
        x = torch.randn(8 * batch, grid, 12)
        compare(compiled(x, 4 * batch, grid), check.reference(text, x, 4 * batch, grid))
