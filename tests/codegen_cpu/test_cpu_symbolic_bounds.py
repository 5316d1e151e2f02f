"""Scalar arguments that are graph values, not attributes (a clamp bound computed from a
symbolic size under ``dynamic=True``): the C template must use them. The template
builders saw only the attributes, so ``clamp(x, min=0, max=s1 - 1)`` lost its max: the
bicubic ``interpolate`` OpInfo sample then indexed out of bounds, and a plain clamp gave
wrong values silently."""

from __future__ import annotations

import pytest
import torch
from torchloom.backend import torchloom_backend
from torchloom.tools import Compiler


def compiled(fn):
    compiler = Compiler("default", compile_cache=False, strict=True)
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=True, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler})), compiler


def clamp_by_size(x):
    return (x * 3).clamp(min=0, max=x.shape[1] - 3) + 1


def clamp_indices(x, i):
    return x[:, (i - 1).clamp(0, x.shape[1] - 1)] * 2


@pytest.mark.parametrize("sizes", [[(4, 7), (5, 9), (3, 12), (6, 5)]])
def test_a_bound_from_a_symbolic_size_clamps(sizes):
    fn, compiler = compiled(clamp_by_size)
    for shape in sizes:
        x = torch.randn(*shape) * shape[1]
        torch.testing.assert_close(fn(x), clamp_by_size(x))
    choices = [c for comp in compiler.compilations if comp.compiled is not None
               for c in comp.compiled.choices]
    assert "cpu" in {c.codegen for c in choices}, [str(r) for c in choices
                                                     for r in c.fallback_reasons]


def test_clamped_indices_stay_in_bounds():
    fn, _ = compiled(clamp_indices)
    for n in (4, 6, 9):
        x = torch.randn(3, n)
        i = torch.arange(-2, n + 3)
        torch.testing.assert_close(fn(x, i), clamp_indices(x, i))


@pytest.mark.slow
def test_bicubic_interpolate_under_dynamic_shapes():
    f = lambda x, size: torch.nn.functional.interpolate(  # noqa: E731
        x, size, mode="bicubic", align_corners=True)
    fn, _ = compiled(f)
    for shape, size in (((2, 3, 4, 4), (3, 3)), ((2, 3, 6, 5), (5, 4)), ((1, 2, 8, 8), (3, 5))):
        x = torch.randn(*shape)
        torch.testing.assert_close(fn(x, size), f(x, size))


#: views whose start, length or split size is computed from a symbolic size: the frontend
#: passes it as a graph value (an int input of the view), not an attribute. The C and
#: Triton writers read view arguments from the attributes only, so these were computed at
#: start 0 (silently wrong) or crashed while judging (KeyError); now they are declined, or
#: read where the type says (a start before a static end) or at run time (a select's
#: index, a slice between two graph values: test_cpu_run_time_slices.py).
DYNAMIC_VIEWS = {
    "slice_end": lambda x: (x[:, x.shape[1] - 3:x.shape[1] - 1] * 2).exp(),
    "slice_tail": lambda x: x[..., -(x.shape[1] // 2):].sin() + 1,
    "narrow": lambda x: torch.narrow(x, 1, x.shape[1] // 3, 2).cos(),
    "select_last": lambda x: x.select(1, x.shape[1] - 1) * 3,
    "split": lambda x: [t.tanh() for t in torch.split(x, x.shape[1] // 2, dim=1)],
    "chunk": lambda x: sum(c.sigmoid().sum() for c in x.chunk(3, dim=1)),
    "differences": lambda x: x[:, 1:] - x[:, :-1],
    "prefix": lambda x: x[:, :x.shape[1] - 2].relu() * x[:, 2:],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DYNAMIC_VIEWS))
def test_views_with_computed_arguments_match_eager(name, caplog):
    f = DYNAMIC_VIEWS[name]
    fn, compiler = compiled(f)
    for shape in ((4, 8), (6, 11), (3, 5), (2, 20)):
        x = torch.randn(*shape)
        torch.testing.assert_close(fn(x), f(x))
    assert "raised while judging" not in caplog.text
    assert all(c.fallback_reason is None for c in compiler.compilations)


def test_symbolic_output_laid_out_as_a_permuted_input(check):
    """An output with symbolic sizes and strides that are not contiguous (a HF model's
    rotary half, ``-x[..., 8:]`` of a [2, s, 2, 16] tensor seen as [2, 2, s, 16]): the
    launcher allocated it through a contiguity check on the symbolic shape and raised
    TypeError while loading the kernel (the group then ran on eager)."""
    text = """\
graph @g(%x: f32[2, 2, s0, 8] strided["32*s0", 16, 32, 1]) {
  %n = torchloom.fusion_group(%x) : f32[2, 2, s0, 8] strided["16*s0", 8, 16, 1] region @k(%in0: f32[2, 2, s0, 8] strided["32*s0", 16, 32, 1]) {
    %t0 = aten.neg.default(%in0) : f32[2, 2, s0, 8] strided["16*s0", 8, 16, 1]
    return %t0
  }
  return %n
}
"""
    compiled = check.compile(text)
    for s in (3, 1, 7):
        base = torch.randn(2, s, 2, 16).permute(0, 2, 1, 3)[..., 8:]
        (got,) = compiled(base)
        torch.testing.assert_close(got, -base, rtol=0, atol=0)
        assert got.stride() == (16 * s, 8, 16, 1)


def test_a_slice_whose_end_alone_is_computed_is_compiled():
    """``x[:, :n - 2]``: only the end is a graph value, and the output's symbolic type
    already says how many elements it has: the C kernel takes it (T5's attention bias)."""
    f = DYNAMIC_VIEWS["prefix"]
    fn, compiler = compiled(f)
    for shape in ((4, 8), (6, 11), (3, 5)):
        x = torch.randn(*shape)
        torch.testing.assert_close(fn(x), f(x))
    symbolic = [c for comp in compiler.compilations if comp.compiled is not None
                for c in comp.compiled.choices]
    assert symbolic and all(c.codegen == "cpu" for c in symbolic), [
        str(r) for c in symbolic for r in c.fallback_reasons]


#: slices from 0 whose end is an int graph input of its own symbol, on a tensor whose dim
#: is another size (a HF decoder's position ids, ``pos[:, :n]`` of an ``i64[2, s0+1]``
#: made in the graph): the kernel reads the length from that int (it was declined: "size
#: symbol s0 has no value in the kernel").
SLICED_BY_AN_INT = {
    "differences": lambda x, n: (lambda p: (p[:, 1:n + 1] - p[:, :n]) != 1)(
        torch.cumsum(torch.ones(2, n + 1, dtype=torch.int64), -1) * x),
    "rows": lambda x, n: (torch.arange(n + 2, dtype=torch.float32)[:, None] * x)[:n].exp(),
    "last_dim": lambda x, n: (torch.ones(3, n + 1) * x).sin()[..., :n] * 2,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SLICED_BY_AN_INT))
def test_a_slice_length_read_from_an_int_input(name):
    f = SLICED_BY_AN_INT[name]
    fn, compiler = compiled(f)
    for n in (9, 14, 1, 17, 0):
        x = torch.randint(1, 4, (1, 1)) if name == "differences" else torch.randn(1, 1)
        torch.testing.assert_close(fn(x, n), f(x, n))
    choices = [c for comp in compiler.compilations if comp.compiled is not None
               for c in comp.compiled.choices]
    reasons = [str(r) for c in choices for r in c.fallback_reasons if r.codegen == "cpu"]
    assert not any("has no value in the kernel" in r for r in reasons), reasons
    assert "cpu" in {c.codegen for c in choices}, reasons


def _sliced_past_its_end(a, b, n):
    return torch.cat([a, b]).sin().view(2, -1)[:, :n] * 2


def test_a_slice_end_past_the_dim_is_not_read_as_the_dim():
    """``x[:, :n]`` with ``n`` at least the dim is typed with the dim itself (Dynamo's
    guard): the kernel must not take the dim's size from ``n`` (it wrote ``n`` columns of a
    result of 5)."""
    fn, compiler = compiled(_sliced_past_its_end)
    for size, n in [(5, 7), (4, 4), (6, 2), (3, 100), (5, 0)]:
        a, b = torch.randn(size), torch.randn(size)
        torch.testing.assert_close(fn(a, b, n), _sliced_past_its_end(a, b, n))
    choices = [c for comp in compiler.compilations for c in comp.compiled.choices]
    assert "cpu" in {c.codegen for c in choices}


def _positional_conv(a, w0, w1):
    """Wav2Vec2's positional convolution: a strided conv (length s//20 - 1), a padded one
    (length s//20) sliced by one (``SamePad``), GELU, transposed, added."""
    h = torch.nn.functional.conv1d(a, w0, stride=20)
    p = torch.nn.functional.conv1d(h, w1, padding=8, groups=4)[:, :, :-1]
    return h.transpose(1, 2) + torch.nn.functional.gelu(p).transpose(1, 2)


def test_a_stride_naming_part_of_a_dims_expression_compiles():
    """The group's input is [2, 64, s//20 - 1] with strides of s//20 (the slice keeps the
    unsliced length's): s//20 is the size argument plus one, not a symbol the kernel lacks
    (was: "size symbol s0 has no value in the kernel": the group ran on eager)."""
    fn, compiler = compiled(_positional_conv)
    g = torch.Generator().manual_seed(0)
    w0, w1 = torch.randn(64, 1, 40, generator=g), torch.randn(64, 16, 16, generator=g)
    for length in (680, 1600, 2570, 100):
        a = torch.randn(2, 1, length, generator=g)
        torch.testing.assert_close(fn(a, w0, w1), _positional_conv(a, w0, w1))
    used = [c.codegen for comp in compiler.compilations if comp.compiled is not None
            for c in comp.compiled.choices]
    assert used and set(used) == {"cpu"}, used
