"""Which int inputs of a fusion group are sizes (``torchloom.api.int_sizes``), read by
both codegens and ``fusion.size-carriers``, and which tensor inputs are read for their
shape alone (``unread_inputs``)."""

from __future__ import annotations

from torchloom.api import int_sizes, parse_graph, unread_inputs
from torchloom.testing.reductions import group_text


def _region(params: str, body: str, results: str):
    graph = parse_graph(group_text(params, body, results))
    return next(n for n in graph.nodes if n.op == "torchloom.fusion_group").region


def test_an_int_typed_as_a_size_and_a_view_size_are_sizes():
    region = _region("%x: f32[s0, 8], %m: int, %n: int[s3]", """
        %v = aten.view.default(%x, %m) {size = [$1, 2, 4]} : f32[s0, 2, 4]""",
                     "%v: f32[s0, 2, 4]")
    assert int_sizes(region) == [(2, "s3"), (1, "s0")]


def test_a_slice_end_from_an_int_is_no_size():
    """``x.view(2, -1)[:, :n]`` with ``n`` past the dim is typed ``f32[2, s0]``: the dim is
    the input's, not ``n`` (reading ``s0`` from ``n`` wrote 7 columns of a 5-column result)."""
    region = _region('%p: f32[2, s0], %n: int', """
        %v = aten.slice.Tensor(%p, %n) {dim = 1, start = 0} : f32[2, s0]""", "%v: f32[2, s0]")
    assert int_sizes(region) == []


def test_a_slice_start_from_an_int_is_no_size():
    """``bias[:, n:]``: the int is where the slice starts, not its length."""
    region = _region("%b: f32[4, 64], %st: int, %x: f32[4, s1]", """
        %v = aten.slice.Tensor(%b, %st) {dim = 1, end = 64} : f32[4, s1]
        %y = aten.add.Tensor(%x, %v) : f32[4, s1]""", "%y: f32[4, s1]")
    assert int_sizes(region) == []


def test_an_input_nothing_reads_is_unread():
    region = _region("%x: f32[s0], %c: f32[s1, 3], %n: int", """
        %y = aten.mul.Tensor(%x) {other = 2} : f32[s0]""", "%y: f32[s0]")
    assert unread_inputs(region) == frozenset({1})
