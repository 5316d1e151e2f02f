"""``laid_out_as``: what a kernel reading fixed strides is handed (the cpu and triton
launchers, the codegen a renderer makes): the tensor itself where its strides are the
kernel's, else a copy laid out so, even where the kernel's strides let elements share
memory (an input the graph expanded, handed materialised)."""

import pytest
import torch

from torchloom.api import laid_out_as


def test_the_tensor_itself_where_its_strides_are_read_as_they_are():
    a = torch.randn(3, 4)
    assert laid_out_as(a, (4, 1)) is a
    row = a[:1]  # (a dim of one: any stride reads it)
    assert laid_out_as(row, (99, 1)) is row


def test_a_copy_at_other_strides():
    a = torch.randn(3, 4)
    b = laid_out_as(a, (1, 3))
    assert b.stride() == (1, 3) and torch.equal(a, b)


@pytest.mark.parametrize(("shape", "strides", "make"), [
    ((1, 5), (0, 0), lambda: torch.full((1, 5), 3.0)),
    ((4, 3), (0, 1), lambda: torch.tensor([[1.0, 2.0, 3.0]]).expand(4, 3).contiguous()),
    ((2, 3, 4), (4, 0, 1), lambda: torch.randn(2, 1, 4).expand(2, 3, 4).contiguous()),
    ((0, 3), (0, 1), lambda: torch.empty(0, 3)),
])
def test_strides_whose_elements_share_memory(shape, strides, make):
    a = make()
    b = laid_out_as(a, strides)
    assert b.shape == a.shape and b.stride() == strides
    assert torch.equal(a, b)
