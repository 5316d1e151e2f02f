"""Two forms the combined optimizer step brought: a pointwise walk over every element at
once where each tensor is dense and of the walk's shape (or one element), so a short
innermost dim (a depthwise conv's 7) no longer bounds the SIMD loop; and a function's plain
nests sharing one parallel region (``team.py``), each ending at a barrier. Values are
eager's in each; in-place pairs still hold."""

from __future__ import annotations

import pytest
import torch
from torchloom.testing.reductions import group_text

from conftest import thread_count


@pytest.mark.parametrize("shape", [(96, 7), (3, 5, 7, 7), (2, 4100), (33, 1, 65)])
def test_dense_tensors_of_one_shape_are_walked_flat(check, shape):
    dims = ", ".join(map(str, shape))
    text = group_text(f"%x: f32[{dims}], %y: f32[{dims}], %s: f32[]", """
        %a = aten.mul.Tensor(%x, %s) : f32[DIMS]
        %b = aten.addcmul.default(%a, %y, %y) {value = 0.5} : f32[DIMS]""".replace(
        "DIMS", dims), f"%b: f32[{dims}]")
    source = check.source(text)
    numel = 1
    for d in shape:
        numel *= d
    assert "in_x[j]" in source and "out_b[j]" in source  # the walk's index is the element's
    inputs = (torch.randn(shape), torch.randn(shape), torch.tensor(1.5))
    with thread_count(2):
        check(text, *inputs)


def test_a_broadcast_operand_keeps_the_row_walk(check):
    text = group_text("%x: f32[96, 7], %w: f32[7]", """
        %a = aten.mul.Tensor(%x, %w) : f32[96, 7]""", "%a: f32[96, 7]")
    source = check.source(text)
    assert "in_x[j]" not in source and "x * 7 + j" in source
    check(text, torch.randn(96, 7), torch.randn(7))


CASES = {
    # three unrelated updates and a scalar one: a nest each, largest first
    "updates": (group_text(
        "%p: f32[300, 200], %g: f32[300, 200], %q: f32[64, 7, 7], %h: f32[64, 7, 7], "
        "%r: f32[50], %k: f32[50], %s: f32[]", """
        %a = aten.sub.Tensor(%p, %g) : f32[300, 200]
        %b = aten.mul.Tensor(%h) {other = 0.5} : f32[64, 7, 7]
        %c = aten.sub.Tensor(%q, %b) : f32[64, 7, 7]
        %d = aten.addcmul.default(%r, %k, %k) {value = 0.1} : f32[50]
        %e = aten.add.Tensor(%s) {other = 1} : f32[]""",
        "%a: f32[300, 200], %c: f32[64, 7, 7], %d: f32[50], %e: f32[]"),
        lambda: (torch.randn(300, 200), torch.randn(300, 200), torch.randn(64, 7, 7),
                 torch.randn(64, 7, 7), torch.randn(50), torch.randn(50), torch.tensor(3.0))),
}


@pytest.mark.parametrize("threads", [1, 2])
def test_plain_nests_share_one_parallel_region(check, threads):
    text, inputs = CASES["updates"]
    kernel = check.codegen.generate(check.compile(text).choices[0].node, check.registry)
    source = kernel.source
    assert source.count("#pragma omp parallel") == 1 and "#pragma omp for" in source
    assert "#pragma omp single" in source  # the step count: one element, one thread
    assert kernel.metadata["nests"] == 4
    given = inputs()
    with thread_count(threads):
        check(text, *given)
        # every output written over its own input, as an optimizer step's plan does
        pairs = {tuple(p) for p in kernel.metadata["inplace"]}
        assert {(0, 0), (2, 1), (4, 2), (6, 3)} <= pairs
        launcher = check.codegen.load(kernel, check.registry)
        want = check.reference(text, *given)
        args = [a.clone() for a in given]
        got = launcher.into((args[0], args[2], args[4], args[6]), *args)
        for g, w, a in zip(got, want, (args[0], args[2], args[4], args[6])):
            assert g.data_ptr() == a.data_ptr()
            torch.testing.assert_close(g, w)
