"""Rows over symbolic dims walked by nested loops (row_nest.py): a nest whose row
coordinates would divide by a size known only at the call loops once per dim instead
(``collapse`` on threads), and computes the same elements as eager at every size."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchloom.api import stmt

from conftest import compare, group_text, thread_count
from torchloom_codegen_cpu import row_nest

#: the head split of attention: [2, s0, 4, 8] read as [2, 4, s0, 8], made contiguous
HEADS = group_text("%x: f32[2, s0, 4, 8]", """
    %t = aten.transpose.int(%x) {dim0 = 1, dim1 = 2} : f32[2, 4, s0, 8] strided["32*s0", 8, 32, 1]
    %c = aten.clone.default(%t) {memory_format = #contiguous_format} : f32[2, 4, s0, 8]""",
                   "%c: f32[2, 4, s0, 8]")

#: a row reduction over the last dim of that transposed view: rows [2, 4, s0]
HEAD_SUMS = group_text("%x: f32[2, s0, 4, 8]", """
    %t = aten.transpose.int(%x) {dim0 = 1, dim1 = 2} : f32[2, 4, s0, 8] strided["32*s0", 8, 32, 1]
    %e = aten.exp.default(%t) : f32[2, 4, s0, 8] strided["32*s0", 8, 32, 1]
    %s = aten.sum.dim_IntList(%e) {dim = [-1]} : f32[2, 4, s0]""", "%s: f32[2, 4, s0]")

#: s0 = 0, 1, small, the stack's 66, and rows enough for threads (the nest's threshold)
LENGTHS = [0, 1, 2, 7, 66, 600]


@pytest.mark.parametrize("text, loops", [(HEADS, 3), (HEAD_SUMS, 3)])
def test_rows_over_a_symbolic_dim_nest_and_match_eager(check, monkeypatch, text, loops):
    """Nested, the kernel computes every element as the single loop did (bit for bit)
    and as eager does (the head split exactly; the sums of exp within eager's rounding:
    its own order of the 8 terms, as before nesting)."""
    source = check.source(text)
    assert f"collapse({loops})" in source, source
    assert "/ S_0" not in source and "% S_0" not in source, source  # no division by a size
    compiled = check.compile(text)
    monkeypatch.setattr(row_nest, "loops", lambda w, body: None)
    flat = check.compile(text)
    assert "collapse" not in check.source(text)
    for threads, s in itertools.product((1, 2), LENGTHS):
        x = torch.randn(2, s, 4, 8)
        with thread_count(threads):
            got = compiled(x)
            compare(got, flat(x), exact=True)
            compare(got, check.reference(text, x), exact=text == HEADS, rtol=1e-6, atol=1e-6)


def test_constant_rows_keep_one_loop(check):
    """Static sizes divide by constants (a multiply and a shift): no nesting."""
    text = HEADS.replace("s0", "5").replace('"32*5"', "160")
    source = check.source(text)
    assert "collapse" not in source
    x = torch.randn(2, 5, 4, 8)
    compare(check.compile(text)(x), check.reference(text, x), exact=True)


def test_rows_that_read_no_coordinate_keep_one_loop(check):
    """A contiguous walk reads its rows at ``x`` alone: nothing divides, nothing nests."""
    text = group_text("%x: f32[2, s0, 8]", """
        %e = aten.exp.default(%x) : f32[2, s0, 8]""", "%e: f32[2, s0, 8]")
    assert "collapse" not in check.source(text)


def test_nested_needs_a_division_by_a_size_and_a_coordinate_read():
    size = str
    body = [stmt.Declare("int64_t", "x0", "x / (4 * S_0)"),
            stmt.Store(stmt.Element("out", "x"), "x0")]
    assert row_nest.nested(body, "x", (2, 4, "S_0"), size) is not None
    assert row_nest.nested(body, "x", (2, 4, 3), size) is None  # constants only
    assert row_nest.nested(body, "x", ("S_0", 4), size) is None  # only the first symbolic
    assert row_nest.nested(body[1:], "x", (2, 4, "S_0"), size) is None  # no coordinate read
    (one,), (shared,) = row_nest.nested(body, "x", (2, 1, 4, "S_0"), size)
    assert [one.var, one.body[0].var, one.body[0].body[0].var] == ["x0", "x2", "x3"]
    assert "collapse(3)" in shared.annotation.text()
    assert row_nest.divides_by_sizes((1, "S_0", 1, 8)) is False
    assert row_nest.divides_by_sizes((3, 1, "S_1")) is True


def _dim(factors) -> str:
    """An IR dim of the product of ``factors`` (ints and symbol names)."""
    const = 1
    names = []
    for f in factors:
        if isinstance(f, int):
            const *= f
        else:
            names.append(f)
    if not names:
        return str(const)
    text = "*".join(([str(const)] if const != 1 else []) + names)
    return text if text in ("s0", "s1") else f'"{text}"'


@st.composite
def permuted_clone(draw):
    """A 4-d input of two symbolic dims among constants, permuted and made contiguous
    (optionally summed over its last dim), with its concrete shape."""
    shape = draw(st.permutations(["s0", "s1", 3, 2]))
    perm = draw(st.permutations(range(4)))
    sizes = {"s0": draw(st.sampled_from([0, 1, 5, 33])), "s1": draw(st.sampled_from([1, 4, 17]))}
    strides = [_dim(shape[d + 1:]) for d in range(4)]
    out = [_dim([shape[p]]) for p in perm]
    permuted = f"f32[{', '.join(out)}] strided[{', '.join(strides[p] for p in perm)}]"
    lines = [f"%p = aten.permute.default(%x) {{dims = [{', '.join(map(str, perm))}]}} : "
             f"{permuted}",
             f"%c = aten.clone.default(%p) {{memory_format = #contiguous_format}} : "
             f"f32[{', '.join(out)}]"]
    result = f"%c: f32[{', '.join(out)}]"
    if draw(st.booleans()):
        lines.append(f"%s = aten.sum.dim_IntList(%p) {{dim = [-1]}} : f32[{', '.join(out[:-1])}]")
        result += f", %s: f32[{', '.join(out[:-1])}]"
    text = group_text(f"%x: f32[{', '.join(_dim([d]) for d in shape)}]", "\n".join(lines), result)
    return text, [sizes.get(d, d) for d in shape]


@pytest.mark.slow
@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(permuted_clone())
def test_permuted_symbolic_tensors_match_eager(check, case):
    text, shape = case
    compiled = check.compile(text)
    x = torch.randn(shape)
    for threads in (1, 2):
        with thread_count(threads):
            compare(compiled(x), check.reference(text, x), rtol=1e-5, atol=1e-5)
