"""Next-row prefetch of row reductions (reduction.prefetch_next_row): which kernels ask for
it, of which input, and that results stay eager's (a prefetch changes no value; the last
row's is skipped)."""

from __future__ import annotations

import re

import pytest
import torch
from torchloom.api import parse_graph
from torchloom.testing.reductions import group_text

from conftest import softmax_text as softmax

PREFETCH = re.compile(r"__builtin_prefetch\(&(\w+)\[\(x \+ 1\) \* (\d+) \+ p\], 0, 2\)")


def add_norm(rows: int, cols: int) -> str:
    """(x + r) - mean(x + r): two row inputs; the prefetch takes the first."""
    return group_text(f"%x: f32[{rows}, {cols}], %r: f32[{rows}, {cols}]", f"""
        %a = aten.add.Tensor(%x, %r) : f32[{rows}, {cols}]
        %m = aten.mean.dim(%a) {{dim = [-1], keepdim = true}} : f32[{rows}, 1]
        %y = aten.sub.Tensor(%a, %m) : f32[{rows}, {cols}]""", f"%y: f32[{rows}, {cols}]")


def prefetches(codegen, registry, text: str) -> list[tuple[str, int]]:
    source = codegen.generate(next(parse_graph(text).nodes), registry).source
    return [(name, int(n)) for name, n in PREFETCH.findall(source)]


@pytest.mark.parametrize("dtype, rows, cols, want", [
    ("f32", 64, 1024, [("in_a", 1024)]),  # 4 KB rows
    ("f32", 9, 3001, [("in_a", 3001)]),  # longer and odd: the first page of the next row
    ("f64", 33, 512, [("in_a", 512)]),
    ("f32", 64, 1000, []),  # under 4 KB: the hardware prefetcher keeps up
    ("f32", 1, 4096, []),  # one row: no next one
])
def test_softmax_rows_prefetch_their_successor(codegen, registry, check, dtype, rows, cols,
                                               want):
    text = softmax(dtype, rows, cols)
    assert prefetches(codegen, registry, text) == want
    torch.manual_seed(0)
    x = torch.randn(rows, cols, dtype=getattr(torch, {"f32": "float32", "f64": "float64"}[dtype]))
    x[-1, :7] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-40, 80])
    check(text, x * 8)


def test_two_row_inputs_prefetch_the_first_only(codegen, registry, check):
    text = add_norm(32, 2048)
    assert prefetches(codegen, registry, text) == [("in_x", 2048)]
    torch.manual_seed(1)
    check(text, torch.randn(32, 2048), torch.randn(32, 2048), atol=1e-5, rtol=1e-5)


def test_no_prefetch_for_strided_rows_or_symbolic_shapes(codegen, registry, check):
    transposed = group_text("%a: f32[1024, 64]", """
        %t = aten.t.default(%a) : f32[64, 1024]
        %m = aten.amax.default(%t) {dim = [-1], keepdim = true} : f32[64, 1]
        %y = aten.sub.Tensor(%t, %m) : f32[64, 1024]""", "%y: f32[64, 1024]")
    assert prefetches(codegen, registry, transposed) == []
    check(transposed, torch.randn(1024, 64))
    assert prefetches(codegen, registry, softmax("f32", "s0", 1024)) == []
