"""The column form with outputs of another view of the reduced shape (columns.py): GELU's
gradient in a Hugging Face training step is stored as ``[2, 256, 1024]`` beside its bias
gradient, a column sum over the ``[512, 1024]`` view. Such groups ran on eager ("reductions
over dims [0] ... feed other ops of the group": the column form took only outputs of the
reduced shape itself, and the row form would read every row with a stride); three per
GPT-2 training step (issue 41)."""

from __future__ import annotations

import pytest
import torch

from conftest import codegens, compiled
from torchloom.api import reductions
from torchloom_codegen_cpu.columns import SPLIT_ROWS


def gelu_tanh_backward_with_bias_grad(a, b, c):
    t = torch.tanh(c)
    g = (a * 0.5 * b + (1 + t) * b) * 0.7978845608028654
    return g, g.reshape(-1, g.shape[-1]).sum(0, keepdim=True), g.reshape(-1, g.shape[-1]).sum(0)


@pytest.mark.parametrize("shape", [(2, 256, 1024), (3, 5, 33), (1, 7, 16), (4, 1, 17),
                                   (2, 3, 1)])
def test_gradient_and_its_column_sum_in_one_cpu_kernel(tmp_path, shape):
    args = [torch.randn(shape) for _ in range(3)]
    compiler, fn = compiled(gelu_tanh_backward_with_bias_grad, tmp_path)
    got, want = fn(*args), gelu_tanh_backward_with_bias_grad(*args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-4)
    assert codegens(compiler) == ["cpu"]
    if shape[-1] > 1:  # (columns of one element: the row form)
        sources = [p.read_text() for p in tmp_path.rglob("*.src")]
        rows = shape[0] * shape[1]
        # one walk over the rows into column accumulators; a long one (sums in double)
        # split into the threads' shares of rows (columns.split_by_rows)
        walk = "for (int64_t r = r0; r < r1; r++) {" if rows >= SPLIT_ROWS and \
            rows > reductions.F32_SUM_COUNT else f"for (int64_t r = 0; r < {rows}; r++) {{"
        assert any(walk in s and "acc_sum" in s for s in sources), sources


def test_a_view_output_of_other_order_is_not_taken_by_the_column_form(tmp_path):
    """A transposed view of the reduced elements is not "element i goes to i": it stays
    out of the column walk (whatever form takes it, the values are eager's)."""
    def f(x):
        g = torch.sigmoid(x)
        return g.t().contiguous() * 2, g.sum(0)
    x = torch.randn(64, 48)
    _, fn = compiled(f, tmp_path)
    for g, w in zip(fn(x), f(x)):
        torch.testing.assert_close(g, w)
