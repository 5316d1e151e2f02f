"""``canonicalize`` on attention's additive masks: a float mask of zeros (a zero factory's
result, or a view of one) adds nothing to the scores, so the attention node runs without it,
forward and backward; every other mask stays (nonzero fills, boolean masks, masks computed
or handed in)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchloom.ir import parse_graph
from torchloom.ops.aten import default_registry
from torchloom.passes.base import PassContext
from torchloom.passes.builtin.canonicalize import Canonicalize
from torchloom.runtime.executor import build_function
from torchloom.testing.golden import golden

ATTN = "aten._scaled_dot_product_flash_attention_for_cpu.default"
BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
QKV = "%q: f32[1, 2, 8, 16], %k: f32[1, 2, 8, 16], %v: f32[1, 2, 8, 16]"
OUT = "f32[1, 2, 8, 16], f32[1, 2, 8] strided[16, 1, 2]"


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, 8, 16, generator=g) for _ in range(3)]


def test_a_mask_of_zeros_is_dropped():
    result = golden(Canonicalize(), f"""
        graph @g({QKV}) {{
          %m = aten.zeros.default() {{device = #cpu, dtype = #f32, size = [1, 2, 8, 8]}} : f32[1, 2, 8, 8]
          %o, %l = {ATTN}(%q, %k, %v, %m) {{dropout_p = 0.0, is_causal = false, scale = 0.25}} : {OUT}
          return %o
        }}
    """, f"""
        graph @g({QKV}) {{
          %m = aten.zeros.default() {{device = #cpu, dtype = #f32, size = [1, 2, 8, 8]}} : f32[1, 2, 8, 8]
          %o, %l = {ATTN}(%q, %k, %v) {{dropout_p = 0.0, is_causal = false, scale = 0.25}} : {OUT}
          return %o
        }}
    """, _inputs())
    assert result.stats == {"folded": 1}


def test_a_view_of_a_zero_fill_is_dropped_in_the_backward_too():
    # full(-0.0) broadcast over heads and queries: adding -0.0 changes no score either
    result = golden(Canonicalize(), f"""
        graph @g({QKV}, %go: f32[1, 2, 8, 16]) {{
          %z = aten.full.default() {{device = #cpu, dtype = #f32, fill_value = -0.0, size = [1, 1, 1, 8]}} : f32[1, 1, 1, 8]
          %m = aten.expand.default(%z) {{size = [1, 2, 8, 8]}} : f32[1, 2, 8, 8] strided[8, 0, 0, 1]
          %o, %l = {ATTN}(%q, %k, %v, %m) {{dropout_p = 0.0, is_causal = false, scale = 0.25}} : {OUT}
          %gq, %gk, %gv = {BACKWARD}(%go, %q, %k, %v, %o, %l, %m) {{dropout_p = 0.0, is_causal = false, scale = 0.25}} : f32[1, 2, 8, 16] strided[256, 16, 32, 1], f32[1, 2, 8, 16] strided[256, 16, 32, 1], f32[1, 2, 8, 16] strided[256, 16, 32, 1]
          return %o, %gq, %gk, %gv
        }}
    """, f"""
        graph @g({QKV}, %go: f32[1, 2, 8, 16]) {{
          %z = aten.full.default() {{device = #cpu, dtype = #f32, fill_value = -0.0, size = [1, 1, 1, 8]}} : f32[1, 1, 1, 8]
          %m = aten.expand.default(%z) {{size = [1, 2, 8, 8]}} : f32[1, 2, 8, 8] strided[8, 0, 0, 1]
          %o, %l = {ATTN}(%q, %k, %v) {{dropout_p = 0.0, is_causal = false, scale = 0.25}} : {OUT}
          %gq, %gk, %gv = {BACKWARD}(%go, %q, %k, %v, %o, %l) {{dropout_p = 0.0, is_causal = false, scale = 0.25}} : f32[1, 2, 8, 16] strided[256, 16, 32, 1], f32[1, 2, 8, 16] strided[256, 16, 32, 1], f32[1, 2, 8, 16] strided[256, 16, 32, 1]
          return %o, %gq, %gk, %gv
        }}
    """, _inputs() + [torch.randn(1, 2, 8, 16)])
    assert result.stats == {"folded": 2}


@pytest.mark.parametrize("mask", [
    # a nonzero fill is a real bias
    "%m = aten.full.default() {device = #cpu, dtype = #f32, fill_value = 0.5, "
    "size = [1, 2, 8, 8]} : f32[1, 2, 8, 8]",
    # computed from zeros, not a view of them
    "%z = aten.zeros.default() {device = #cpu, dtype = #f32, size = [1, 2, 8, 8]} : f32[1, 2, 8, 8]\n"
    "          %m = aten.exp.default(%z) : f32[1, 2, 8, 8]",
])
def test_other_masks_stay(mask):
    text = f"""
        graph @g({QKV}) {{
          {mask}
          %o, %l = {ATTN}(%q, %k, %v, %m) {{dropout_p = 0.0, is_causal = false, scale = 0.25}} : {OUT}
          return %o
        }}
    """
    result = golden(Canonicalize(), text, text, _inputs())
    assert result.stats == {"folded": 0}


def test_a_boolean_mask_of_zeros_stays():
    # it hides every key (the composite: the CPU kernel takes float masks only)
    text = f"""
        graph @g({QKV}) {{
          %m = aten.zeros.default() {{device = #cpu, dtype = #b8, size = [1, 2, 8, 8]}} : b8[1, 2, 8, 8]
          %o = aten.scaled_dot_product_attention.default(%q, %k, %v, %m) {{scale = 0.25}} : f32[1, 2, 8, 16]
          return %o
        }}
    """
    assert golden(Canonicalize(), text, text, _inputs()).stats == {"folded": 0}


def test_the_composite_s_mask_of_zeros_is_dropped():
    result = golden(Canonicalize(), f"""
        graph @g({QKV}) {{
          %m = aten.zeros.default() {{device = #cpu, dtype = #f32, size = [8, 8]}} : f32[8, 8]
          %o = aten.scaled_dot_product_attention.default(%q, %k, %v, %m) {{scale = 0.25}} : f32[1, 2, 8, 16]
          return %o
        }}
    """, f"""
        graph @g({QKV}) {{
          %m = aten.zeros.default() {{device = #cpu, dtype = #f32, size = [8, 8]}} : f32[8, 8]
          %o = aten.scaled_dot_product_attention.default(%q, %k, %v) {{scale = 0.25}} : f32[1, 2, 8, 16]
          return %o
        }}
    """, _inputs())
    assert result.stats == {"folded": 1}


def test_a_mask_of_another_dtype_stays():
    # eager's kernel refuses a mask whose dtype is not the query's: that error is kept
    graph = parse_graph(f"""
        graph @g({QKV}) {{
          %m = aten.zeros.default() {{device = #cpu, dtype = #f64, size = [1, 2, 8, 8]}} : f64[1, 2, 8, 8]
          %o, %l = {ATTN}(%q, %k, %v, %m) {{dropout_p = 0.0, is_causal = false, scale = 0.25}} : {OUT}
          return %o
        }}
    """)
    result = Canonicalize().run(graph, PassContext(registry=default_registry()))
    assert result.stats == {"folded": 0}
    assert len(next(n for n in graph.nodes if n.op == ATTN).inputs) == 4


def test_a_mask_handed_in_stays():
    text = f"""
        graph @g({QKV}, %m: f32[1, 2, 8, 8]) {{
          %o, %l = {ATTN}(%q, %k, %v, %m) {{dropout_p = 0.0, is_causal = false, scale = 0.25}} : {OUT}
          return %o
        }}
    """
    golden(Canonicalize(), text, text, _inputs() + [torch.zeros(1, 2, 8, 8)])


FILLS = [0.0, -0.0, 0, 1e-30, -1.0, -math.inf, math.nan]


@settings(max_examples=30, deadline=None)
@given(fill=st.sampled_from(FILLS), heads=st.integers(1, 3), queries=st.integers(1, 9),
       keys=st.integers(1, 9), broadcast=st.booleans(), causal=st.booleans(),
       seed=st.integers(0, 2**16))
def test_drops_exactly_the_masks_of_zeros_and_keeps_the_values(fill, heads, queries, keys,
                                                              broadcast, causal, seed):
    """Any fill, shape and broadcast: the mask goes iff every element is zero, and the
    results are eager's (NaN where eager's are)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, queries, 16, generator=g)
    k, v = (torch.randn(1, heads, keys, 16, generator=g) for _ in range(2))
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=causal, attn_mask=torch.full((1, heads, queries, keys), fill, dtype=torch.float32),
        scale=0.25)
    shape = [1, 1, 1, keys] if broadcast else [1, heads, queries, keys]
    strides = f" strided[{keys}, 0, 0, 1]" if broadcast else ""
    view = (f"%m = aten.expand.default(%z) {{size = [1, {heads}, {queries}, {keys}]}} : "
            f"f32[1, {heads}, {queries}, {keys}]{strides}" if broadcast else
            f"%m = aten.alias.default(%z) : f32{shape}")
    lse_strides = ", ".join(map(str, lse.stride()))
    graph = parse_graph(f"""
        graph @g(%q: f32[1, {heads}, {queries}, 16], %k: f32[1, {heads}, {keys}, 16], %v: f32[1, {heads}, {keys}, 16]) {{
          %z = aten.full.default() {{size = {shape}, fill_value = {fill!r}, dtype = #f32, device = #cpu}} : f32{shape}
          {view}
          %o, %l = {ATTN}(%q, %k, %v, %m) {{dropout_p = 0.0, is_causal = {str(causal).lower()}, scale = 0.25}} : f32[1, {heads}, {queries}, 16], f32[1, {heads}, {queries}] strided[{lse_strides}]
          return %o
        }}
    """)
    registry = default_registry()
    result = Canonicalize().run(graph, PassContext(registry=registry))
    attention = next(n for n in graph.nodes if n.op == ATTN)
    assert (len(attention.inputs) == 3) == (fill == 0)
    assert result.stats["folded"] == (1 if fill == 0 else 0)
    got, = build_function(graph, registry).fn(q, k, v)
    torch.testing.assert_close(got, o, equal_nan=True)
