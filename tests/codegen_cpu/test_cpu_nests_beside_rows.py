"""A group whose one reduction sums a slice of an output that holds more elements than the
reduction's rows (ViT's backward: the token gradient ``[2, 65, 192]`` and the class token's
bias gradient summed over its ``[2, 1, 192]`` slice) ran on eager ("output %t5 ... has
neither the elements of the reduced shape nor those of a row", issue 41): such outputs are
written by a pointwise nest of their own, the reduction's nest reads them back
(``torchloom.codegen.nests.plan``)."""

from __future__ import annotations

import pytest
import torch

from conftest import codegens, compiled


def token_gradient_and_class_token_sum(a, b, c):
    t = a + b * c
    return t, t[:, :1].sum(0, keepdim=True), t[:, 1:] * 2


@pytest.mark.parametrize("shape", [(2, 65, 192), (3, 2, 5), (1, 1, 8), (2, 9, 1), (5, 3, 33)])
def test_outputs_beside_the_rows_get_a_nest_of_their_own(tmp_path, shape):
    args = [torch.randn(shape), torch.randn(shape[:2] + (1,)), torch.randn(shape)]
    compiler, fn = compiled(token_gradient_and_class_token_sum, tmp_path)
    for g, w in zip(fn(*args), token_gradient_and_class_token_sum(*args)):
        torch.testing.assert_close(g, w)
    assert codegens(compiler) == ["cpu"]


def test_a_reduction_over_a_strided_slice_with_edge_values(tmp_path):
    def f(x, y):
        t = torch.tanh(x) * y
        return t, t[:, ::3].amax(1), t.exp()
    x, y = torch.randn(4, 10, 7), torch.randn(4, 10, 7)
    x[0, 0, 0], x[1, 3, 2], y[2, 6, 6] = float("nan"), float("inf"), -0.0
    compiler, fn = compiled(f, tmp_path)
    for g, w in zip(fn(x, y), f(x, y)):
        torch.testing.assert_close(g, w, equal_nan=True)
    assert codegens(compiler) == ["cpu"]
