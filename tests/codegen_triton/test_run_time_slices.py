"""A slice whose start and end are both graph values (ints the kernel takes as arguments)
and a select whose index is one, in a Triton kernel over symbolic sizes: the value is read
at run time, a start clamped as Python clamps it, an index counted from the end where it
is negative; the length is the slice's type. Checked on the Triton interpreter at every
start (index) of the dim, negative ones included."""

from __future__ import annotations

import torch

from conftest import group_text
from test_symbolic_sizes import compile_group
from torchloom_codegen_triton import TritonCodegen


def test_a_window_between_two_int_arguments_matches_python_slicing(registry, tmp_path):
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False)
    text = group_text("%b: f32[4, s0], %st: int, %en: int", """
        %v = aten.slice.Tensor(%b, %st, %en) {dim = 1} : f32[4, 3]
        %y = aten.mul.Tensor(%v) {other = 2} : f32[4, 3]""", "%y: f32[4, 3]")
    _, kernel = compile_group(codegen, registry, text)
    for n in (3, 5, 9):
        b = torch.randn(4, n)
        starts = [*range(0, n - 2), *range(-n, -3)]  # (each end start + 3 keeps 3 elements)
        for start in starts:
            want = b[:, start:start + 3] * 2
            assert want.shape[1] == 3
            torch.testing.assert_close(kernel(b, start, start + 3)[0], want, rtol=0, atol=0)


def test_a_select_at_an_int_argument_matches_python_indexing(registry, tmp_path):
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False)
    text = group_text("%b: f32[4, s0], %i: int", """
        %v = aten.select.int(%b, %i) {dim = 1} : f32[4] strided["s0"]
        %y = aten.mul.Tensor(%v) {other = 2} : f32[4]""", "%y: f32[4]")
    _, kernel = compile_group(codegen, registry, text)
    for n in (1, 4, 9):
        b = torch.randn(4, n)
        for index in range(-n, n):
            torch.testing.assert_close(kernel(b, index)[0], b[:, index] * 2, rtol=0, atol=0)
