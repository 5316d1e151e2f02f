"""Slices whose start and end are both graph values (``x[:, n // 4 : n // 4 + 3]``,
``narrow`` at a computed start), selects whose index is one (``x[:, n - 1]``) and splits
whose split size is one (``split(x, n // 2)``, ``chunk`` along a symbolic dim) under
symbolic sizes: the kernel reads the value at run time (an int argument), a slice's start
clamped as Python clamps it, a negative index counted from the end, split output k at k
times the size; the lengths are the types'. They ran on the eager codegen before ("slice
with a start and an end known only at run time", "... takes index (split_size) from a
graph value")."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from torchloom.api import expr
from torchloom.backend import torchloom_backend
from torchloom.codegen.indexing import SYMBOLS, IndexMath
from torchloom.ir.symbols import evaluate
from torchloom.tools import Compiler


def _compiled(fn):
    compiler = Compiler("default", compile_cache=False, strict=True)
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=True, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler})), compiler


#: name -> (function, its inputs at a size n)
CASES = {
    "window": (lambda x: (x[:, x.shape[1] // 4: x.shape[1] // 4 + 3] * 2).sin(),
               lambda n: (torch.randn(3, n),)),
    "narrow_at_a_size": (lambda x, y: torch.narrow(x, 1, y.shape[0], 5).exp() + 1,
                         lambda n: (torch.randn(4, 3 * n + 5), torch.randn(n))),
    "rows": (lambda x: x[x.shape[0] // 3: x.shape[0] // 3 + 2].cos() * x.shape[0],
             lambda n: (torch.randn(n + 3, 5),)),
    "from_the_end": (lambda x: x[:, -(x.shape[1] // 2): -(x.shape[1] // 2) + 2] - 1,
                     lambda n: (torch.randn(2, n),)),
    "step_two": (lambda x: x[:, x.shape[1] // 4: x.shape[1] // 4 + 6: 2].tanh(),
                 lambda n: (torch.randn(3, n + 6),)),
    "summed": (lambda x: x[:, x.shape[1] // 2: x.shape[1] // 2 + 4].sum(1) + 1,
               lambda n: (torch.randn(5, n),)),
    "softmax": (lambda x: (lambda w: (w - w.amax(-1, keepdim=True)).exp()
                           / (w - w.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True))(
                               x[:, x.shape[1] // 3: x.shape[1] // 3 + 7]),
                lambda n: (torch.randn(6, n + 7),)),
    "three_dims": (lambda x: x[:, :, x.shape[2] // 2: x.shape[2] // 2 + 2].sigmoid()
                   * x[:, :, :2],
                   lambda n: (torch.randn(2, 3, n),)),
    "select_last": (lambda x: x.select(1, x.shape[1] - 1) * 3 + x[:, 0],
                    lambda n: (torch.randn(4, n),)),
    "select_row": (lambda x: x[x.shape[0] - 2].sin() * x[x.shape[0] // 2],
                   lambda n: (torch.randn(n, 6),)),
    "split": (lambda x: [t.tanh() * (k + 1) for k, t in enumerate(
        torch.split(x, x.shape[1] // 2, dim=1))], lambda n: (torch.randn(3, n),)),
    "chunk_rows": (lambda x: [c.sigmoid().sum(0) for c in x.chunk(3, dim=0)],
                   lambda n: (torch.randn(n, 4),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_view_at_run_time_ints_compiles_and_matches_eager(name):
    f, inputs = CASES[name]
    fn, compiler = _compiled(f)
    torch.manual_seed(0)
    for n in (8, 13, 21, 9, 40):
        args = inputs(n)
        torch.testing.assert_close(fn(*args), f(*args))
    choices = [c for comp in compiler.compilations if comp.compiled is not None
               for c in comp.compiled.choices]
    reasons = [str(r) for c in choices for r in c.fallback_reasons if r.codegen == "cpu"]
    assert choices and all(c.codegen == "cpu" for c in choices), reasons


def test_the_gradient_through_such_a_slice_matches_eager():
    def f(x):
        n = x.shape[1]
        return (x[:, n // 4: n // 4 + 3] * 2).sin().sum()
    fn, _ = _compiled(f)
    for n in (8, 12, 17):
        x = torch.randn(3, n, requires_grad=True)
        y = x.detach().clone().requires_grad_()
        fn(x).backward()
        f(y).backward()
        torch.testing.assert_close(x.grad, y.grad)


def test_a_select_at_an_int_argument_matches_python_indexing(check):
    """The group as the frontend hands it: every index of the dim, negative ones too."""
    compiled = check.compile("""\
graph @g(%b: f32[4, s0], %i: int) {
  %y = torchloom.fusion_group(%b, %i) : f32[4] region @k(%in0: f32[4, s0], %in1: int) {
    %v = aten.select.int(%in0, %in1) {dim = 1} : f32[4] strided["s0"]
    %w = aten.mul.Tensor(%v) {other = 2} : f32[4]
    return %w
  }
  return %y
}
""")
    for n in (1, 4, 9):
        b = torch.randn(4, n)
        for index in range(-n, n):
            (got,) = compiled(b, index)
            torch.testing.assert_close(got, b[:, index] * 2, rtol=0, atol=0)


@given(start=st.integers(-40, 40), size=st.integers(0, 30))
def test_the_run_time_start_is_clamped_as_python_clamps_it(start, size):
    text = str(IndexMath(SYMBOLS, {"s0": "s0"}).run_time_index(expr.Name("v"), "s0", clamp=True))
    assert evaluate(text, {"v": start, "s0": size}) == slice(start, None).indices(size)[0]
    static = str(IndexMath(SYMBOLS).run_time_index(expr.Name("v"), size, clamp=True))
    assert evaluate(static, {"v": start}) == slice(start, None).indices(size)[0]


def test_a_window_between_two_int_arguments_matches_python_slicing(check):
    """The group as the frontend hands it (two int inputs), at every start that gives a
    slice of the type's length, negative ones included, with steps of 1 and 2."""
    for step, width in ((1, 3), (2, 5)):
        compiled = check.compile(f"""\
graph @g(%b: f32[4, s0], %st: int, %en: int) {{
  %y = torchloom.fusion_group(%b, %st, %en) : f32[4, 3] region @k(%in0: f32[4, s0], %in1: int, %in2: int) {{
    %v = aten.slice.Tensor(%in0, %in1, %in2) {{dim = 1, step = {step}}} : f32[4, 3] strided["s0", {step}]
    %w = aten.mul.Tensor(%v) {{other = 2}} : f32[4, 3]
    return %w
  }}
  return %y
}}
""")
        for n in (width, 6, 11):
            b = torch.randn(4, n)
            for start in [*range(0, n - width + 1), *range(-n, -width)]:
                want = b[:, start:start + width:step] * 2
                assert want.shape[1] == 3
                (got,) = compiled(b, start, start + width)
                torch.testing.assert_close(got, want, rtol=0, atol=0)


@given(index=st.integers(-30, 29), size=st.integers(1, 30))
def test_a_run_time_index_wraps_as_python_indexing(index, size):
    assume(-size <= index < size)  # (else eager raises; Dynamo's guards keep it out)
    text = str(IndexMath(SYMBOLS, {"s0": "s0"}).run_time_index(expr.Name("v"), "s0", clamp=False))
    assert evaluate(text, {"v": index, "s0": size}) == range(size)[index]
