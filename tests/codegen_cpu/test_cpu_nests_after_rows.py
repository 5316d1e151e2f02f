"""Groups whose outputs the reduction's nest cannot hold ran on eager (issue 41's zoo):
Llama's and Qwen2's backward sum the gradient over the repeated key/value heads and slice
half of each head for the rotary embedding (an output of another element count than the
reduced shape's and the rows'); a value that reads a row result at other rows (a
permutation; a reshape that only regroups the rows now reads its own row); Whisper's
layer_norm backward whose input gradient leaves the group transposed.
The first two are written as the reduction's nest (storing the reduction results, as
outputs or scratch) and pointwise nests after it (``nests.after_the_rows``, tried by
``nests.write_plan``); a permuted output of the reduced shape's element count is stored in
its memory order, where its values read their own rows
(placement.OutputPlacement.place_output)."""

from __future__ import annotations

import pytest
import torch
from torchloom.codegen import nests

from conftest import codegens, compiled


def summed_heads_sliced(g):
    s = g.sum(2)
    half = s.shape[-1] // 2
    return s[..., :half] * 2, torch.tanh(s[..., half:]) + 1, s, g * 0.5


def row_max_read_transposed(x):
    m = x.amax(-1, keepdim=True)
    a, b = x.shape[0], x.shape[1]
    t = m.reshape(b, a, 1) * x[:1, :, :1].reshape(b, 1, 1)
    return t, m, torch.exp(x - m)


def row_max_read_permuted(x):
    m = x.amax(-1, keepdim=True)
    b = x.shape[1]
    t = m.squeeze(-1).t().unsqueeze(-1) * x[:1, :, :1].reshape(b, 1, 1)
    return t, m, torch.exp(x - m)


def norm_backward_transposed(x, g, w):
    """Whisper's: a layer_norm-like backward over the rows of [B, T, C], its input
    gradient returned as [B, C, T] (a permuted view) with the weight gradient's sums."""
    mean = x.mean(-1, keepdim=True)
    xc = x - mean
    gw = g * w
    dx = gw * x.shape[-1] - gw.sum(-1, keepdim=True) - xc * (gw * xc).sum(-1, keepdim=True)
    return torch.nn.functional.gelu(dx.permute(0, 2, 1)), (g * xc).sum((0, 1)), g.sum((0, 1))


SHAPES_5D = [(1, 2, 4, 6, 8), (2, 1, 3, 5, 2), (1, 1, 1, 1, 4), (3, 2, 2, 7, 6)]
SHAPES_3D = [(4, 6, 5), (1, 3, 8), (2, 1, 1), (3, 5, 17)]


def _check(f, args, tmp_path):
    compiler, fn = compiled(f, tmp_path)
    got, want = fn(*args), f(*args)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, equal_nan=True)
    return codegens(compiler)


@pytest.mark.parametrize("shape", SHAPES_5D)
def test_outputs_of_another_count_after_the_reduction(tmp_path, shape):
    g = torch.randn(shape)
    g.view(-1)[0] = float("nan")
    assert _check(summed_heads_sliced, [g], tmp_path) == ["cpu"]


@pytest.mark.parametrize("shape", SHAPES_3D)
def test_row_results_read_at_other_rows_after_the_reduction(tmp_path, shape):
    x = torch.randn(shape)
    assert _check(row_max_read_transposed, [x], tmp_path) == ["cpu"]
    assert _check(row_max_read_permuted, [x], tmp_path / "permuted") == ["cpu"]


@pytest.mark.parametrize("shape", SHAPES_3D + [(1, 512, 32)])
def test_a_transposed_output_is_stored_in_its_memory_order(tmp_path, shape):
    x, g, w = torch.randn(shape), torch.randn(shape), torch.randn(shape[-1])
    assert set(_check(norm_backward_transposed, [x, g, w], tmp_path)) == {"cpu"}


def test_these_groups_were_on_eager_without_the_plan(tmp_path, monkeypatch):
    """The nests after the rows are what compiles them (not some other form)."""
    monkeypatch.setattr(nests, "after_the_rows", lambda *args: None)
    assert _check(summed_heads_sliced, [torch.randn(1, 2, 4, 6, 8)], tmp_path) == ["eager"]
    assert _check(row_max_read_permuted, [torch.randn(4, 6, 5)],
                  tmp_path / "b") == ["eager"]
    # a reshape that regroups the rows ([4, 6] as [6, 4]) reads each row result at its
    # own row (x0 = x / 6, x1 = x % 6 again: ValueWalk.same_elements): the row nest holds it
    assert _check(row_max_read_transposed, [torch.randn(4, 6, 5)],
                  tmp_path / "c") == ["cpu"]


def test_the_transposed_output_was_on_eager_in_logical_order(tmp_path, monkeypatch):
    from torchloom.codegen import placement
    monkeypatch.setattr(placement, "memory_order", lambda t: tuple(range(len(t.shape))))
    x, g, w = torch.randn(1, 512, 32), torch.randn(1, 512, 32), torch.randn(32)
    # (the nests after the rows and columns take it since session 37: without them)
    assert _check(norm_backward_transposed, [x, g, w], tmp_path / "after") == ["cpu"]
    monkeypatch.setattr(nests, "after_the_rows", lambda *args: None)
    assert "eager" in _check(norm_backward_transposed, [x, g, w], tmp_path)
