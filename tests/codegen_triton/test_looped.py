"""looped.py: a looped reduction reads its row once per dependency level -- online
softmax (max and rescaled sum in one pass), Welford's var/mean, independent reductions
sharing a pass -- on the Triton interpreter against eager (edge values included), and
the bytes each plan reads."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import Checker, group_text
from torchloom_codegen_triton import TritonCodegen


def softmax(rows: int, cols: int) -> str:
    return group_text(f"%a: f32[{rows}, {cols}]", f"""
        %x = aten.amax.default(%a) {{dim = [-1], keepdim = true}} : f32[{rows}, 1]
        %s = aten.sub.Tensor(%a, %x) : f32[{rows}, {cols}]
        %e = aten.exp.default(%s) : f32[{rows}, {cols}]
        %t = aten.sum.dim_IntList(%e) {{dim = [-1], keepdim = true}} : f32[{rows}, 1]
        %y = aten.div.Tensor(%e, %t) : f32[{rows}, {cols}]""",
        f"%y: f32[{rows}, {cols}], %t: f32[{rows}, 1], %x: f32[{rows}, 1]")


def layer_norm(rows: int, cols: int, correction: int = 0) -> str:
    return group_text(f"%a: f32[{rows}, {cols}], %w: f32[{cols}]", f"""
        %v, %m = aten.var_mean.correction(%a) {{dim = [-1], correction = {correction}, keepdim = true}} : f32[{rows}, 1], f32[{rows}, 1]
        %ve = aten.add.Tensor(%v) {{other = 1e-05}} : f32[{rows}, 1]
        %r = aten.rsqrt.default(%ve) : f32[{rows}, 1]
        %c = aten.sub.Tensor(%a, %m) : f32[{rows}, {cols}]
        %n = aten.mul.Tensor(%c, %r) : f32[{rows}, {cols}]
        %y = aten.mul.Tensor(%n, %w) : f32[{rows}, {cols}]""",  # noqa: E501
        f"%y: f32[{rows}, {cols}], %v: f32[{rows}, 1], %m: f32[{rows}, 1]")


def two_sums(rows: int, cols: int) -> str:
    """Two independent row sums and an output that needs both (layer-norm backward)."""
    return group_text(f"%a: f32[{rows}, {cols}], %b: f32[{rows}, {cols}]", f"""
        %p = aten.mul.Tensor(%a, %b) : f32[{rows}, {cols}]
        %s1 = aten.sum.dim_IntList(%a) {{dim = [1], keepdim = true}} : f32[{rows}, 1]
        %s2 = aten.sum.dim_IntList(%p) {{dim = [1], keepdim = true}} : f32[{rows}, 1]
        %u = aten.mul.Tensor(%b, %s2) : f32[{rows}, {cols}]
        %y = aten.sub.Tensor(%u, %s1) : f32[{rows}, {cols}]""", f"%y: f32[{rows}, {cols}]")


@pytest.fixture
def looped(registry, tmp_path):
    """Rows longer than 8 elements loop in chunks."""
    return Checker(registry, TritonCodegen(cache_dir=tmp_path, autotune=False,
                                           max_persistent=8))


def plan(check, compiled):
    return check.codegen.generate(compiled.choices[0].node, check.registry)


@pytest.mark.parametrize("text,inputs,reads", [
    (softmax(5, 37), lambda g: (torch.randn(5, 37, generator=g) * 8,), 2),
    (layer_norm(4, 45), lambda g: (torch.randn(4, 45, generator=g) * 3 + 50,
                                   torch.randn(45, generator=g)), 2),
    # a feeds the sums only (one pass), b the sums and the output (two)
    (two_sums(3, 29), lambda g: (torch.randn(3, 29, generator=g),
                                 torch.randn(3, 29, generator=g)), 3)],
    ids=["softmax", "layer_norm", "two_sums"])
def test_a_looped_row_is_read_at_most_twice(looped, text, inputs, reads):
    args = inputs(torch.Generator().manual_seed(5))
    _, compiled = looped(text, *args, atol=1e-5, rtol=1e-5)
    kernel = plan(looped, compiled)
    assert kernel.source.count("for roff in range(") == 2  # statistics, then the outputs
    rows, cols = args[0].shape
    full = rows * cols * 4
    small = sum(a.numel() * 4 for a in args if a.numel() < rows * cols)
    assert kernel.metadata["bytes_read"] == reads * full + small


def test_online_softmax_edge_rows_match_eager(looped):
    x = torch.randn(6, 19)
    x[0] = float("-inf")                      # every element -inf: eager gives NaN
    x[1, 3] = float("nan")                    # a NaN: the row is NaN
    x[2, 5] = float("inf")                    # +inf: NaN where inf - inf, 0 elsewhere
    x[3, :10] = float("-inf")                 # -inf first, finite later: rescaled
    x[4] = 1e30                               # huge equal values
    x[5, 18] = 80.0                           # the max in the last chunk
    looped(softmax(6, 19), x, atol=1e-6, rtol=1e-5)


def test_welford_var_edge_rows_match_eager(looped):
    text = group_text("%a: f32[5, 21]", """
        %v = aten.var.correction(%a) {dim = [-1], correction = 1} : f32[5]
        %s = aten.std.correction(%a) {dim = [-1], correction = 0} : f32[5]""",
        "%v: f32[5], %s: f32[5]")
    x = torch.randn(5, 21) * 1e-3 + 1e4       # a large mean, small spread
    x[1, 2] = float("nan")
    x[2, 7] = float("inf")
    x[3] = 2.5                                # constant: exactly 0
    looped(text, x, atol=1e-3, rtol=1e-4)


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 9), cols=st.integers(9, 70), which=st.sampled_from(
    ["softmax", "layer_norm", "two_sums"]), scale=st.sampled_from([1.0, 30.0]))
def test_random_looped_reductions_match_eager(looped, rows, cols, which, scale):
    g = torch.Generator().manual_seed(rows * 100 + cols)
    a = torch.randn(rows, cols, generator=g) * scale
    if which == "softmax":
        looped(softmax(rows, cols), a, atol=1e-6, rtol=1e-5)
    elif which == "layer_norm":
        looped(layer_norm(rows, cols, correction=1), a, torch.randn(cols, generator=g),
               atol=1e-4, rtol=1e-4)
    else:
        looped(two_sums(rows, cols), a, torch.randn(rows, cols, generator=g), atol=1e-4,
               rtol=1e-4)
