"""Index math (indexing.py): the coordinate expressions of every view rule, evaluated as
Python at every element, must address the element torch's own view returns."""

from __future__ import annotations

import itertools

import pytest
import torch

from torchloom_codegen_triton.indexing import (address, delinear, linear, reshape,
                                               view_coords)


def _eval_coords(exprs, names, values):
    env = dict(zip(names, values))
    return tuple(eval(e, {}, env) for e in exprs)  # noqa: S307 - our own generated text


VIEWS = [  # (rule, attrs, input shape, torch view of x)
    ("reshape", {}, (4, 6), lambda x: x.view(2, 12)),
    ("reshape", {}, (2, 3, 4), lambda x: x.view(6, 4)),
    ("reshape", {}, (6, 4), lambda x: x.view(2, 3, 2, 2)),
    ("reshape", {}, (3, 1, 4), lambda x: x.view(3, 4)),
    ("reshape", {}, (3, 4), lambda x: x.view(1, 3, 1, 4, 1)),
    ("permute", {"dims": (2, 0, 1)}, (2, 3, 4), lambda x: x.permute(2, 0, 1)),
    ("transpose", {"dim0": 0, "dim1": -1}, (2, 3, 4), lambda x: x.transpose(0, -1)),
    ("expand", {}, (3, 1), lambda x: x.expand(2, 3, 5)),
    ("slice", {"dim": 1, "start": 2, "end": 9, "step": 3}, (2, 10), lambda x: x[:, 2:9:3]),
    ("slice", {"dim": 0, "start": -3, "end": None, "step": 1}, (5, 2), lambda x: x[-3:]),
    ("select", {"dim": 1, "index": -2}, (3, 4, 2), lambda x: x[:, -2]),
    ("split", {"dim": 1, "split_size": 3}, (2, 8), lambda x: x.split(3, 1)[2]),
    ("split_with_sizes", {"dim": 0, "split_sizes": (1, 3, 2)}, (6, 2),
     lambda x: x.split_with_sizes((1, 3, 2), 0)[1]),
    ("unbind", {"dim": 1}, (2, 3, 4), lambda x: x.unbind(1)[2]),
]


@pytest.mark.parametrize("rule,attrs,in_shape,view", VIEWS,
                         ids=[f"{v[0]}-{i}" for i, v in enumerate(VIEWS)])
def test_view_coordinates_address_the_viewed_element(rule, attrs, in_shape, view):
    x = torch.arange(int(torch.tensor(in_shape).prod())).view(in_shape)
    y = view(x)
    output = {"split": 2, "split_with_sizes": 1, "unbind": 2}.get(rule, 0)
    names = [f"c{i}" for i in range(y.dim())]
    exprs = view_coords(rule, tuple(names), attrs, tuple(y.shape), in_shape, {}, output)
    for idx in itertools.product(*(range(d) for d in y.shape)):
        assert x[_eval_coords(exprs, names, idx)] == y[idx]


def test_delinear_and_linear_round_trip():
    shape = (3, 1, 4, 5)
    exprs = delinear("i", shape)
    assert exprs[1] == "0"
    for i in range(60):
        coords = tuple(eval(e, {}, {"i": i}) for e in exprs)  # noqa: S307
        assert coords == tuple(torch.unravel_index(torch.tensor(i), shape))
        names = ("a", "b", "c", "d")
        assert eval(linear(names, shape), {}, dict(zip(names, coords))) == i  # noqa: S307


def test_known_linear_index_is_reused():
    known = {(("x0", "x1"), (4, 6)): "xindex"}
    assert linear(("x0", "x1"), (4, 6), known) == "xindex"
    assert reshape(("x0", "x1"), (4, 6), (24,), known) == ("xindex",)
    # a dense but permuted layout is addressed in memory order
    assert address(("x1", "x0"), (1, 6), (6, 4), {(("x0", "x1"), (4, 6)): "xindex"}) == "xindex"


def test_strided_address_matches_torch():
    x = torch.arange(60).view(3, 4, 5).permute(2, 0, 1)[1:, :, ::2]
    exprs = address(("a", "b", "c"), x.stride(), x.shape)
    flat = x.storage_offset()
    for idx in itertools.product(*(range(d) for d in x.shape)):
        off = eval(exprs, {}, dict(zip("abc", idx)))  # noqa: S307
        assert torch.arange(60)[flat + off] == x[idx]
