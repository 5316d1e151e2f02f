"""oneDNN's linear as a trial's candidate (torchloom.codegen.gemm.ONEDNN): offered for f32
products without a bias or with one per column, its values within rounding of the whole
call's (every shape, layout, bias), taken only where a trial found it faster and its
check found those values, kept for the next process, never where autograd records the
product. Speed is a benchmark's (RESULTS.md): the trials here run on a scripted clock."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.codegen import gemm
from torchloom.codegen.gemm import ONEDNN, ROUNDS, GemmBlocks, Trial, onednn_addmm
from torchloom.codegen.plan import build_function
from torchloom.ir import parse_graph
from torchloom.ops.aten import default_registry

from test_gemm_blocks import Script, mm_graph, node_of, operands

pytestmark = pytest.mark.skipif(not gemm._onednn_linear(),
                                reason="this torch has no oneDNN linear op")


def addmm_graph(bias: str) -> str:
    return f"""\
graph @g(%c: f32[{bias}], %a: f32[512, 256], %b: f32[256, 4096] strided[1, 256]) {{
  %y = aten.addmm.default(%c, %a, %b) : f32[512, 4096]
  return %y
}}"""


def addmm_node(bias: str):
    return next(n for n in parse_graph(addmm_graph(bias)).nodes if n.op == gemm.ADDMM)


def test_offered_for_f32_products_without_a_bias_or_with_one_per_column():
    def candidates(node, **kwargs):
        return GemmBlocks(**kwargs).callable_for(node).__self__.candidates
    assert ONEDNN in candidates(node_of(mm_graph(512, 256, 4096)))
    assert ONEDNN in candidates(addmm_node("4096"))
    assert ONEDNN not in candidates(addmm_node("512, 4096"))  # a bias per element
    assert ONEDNN not in candidates(node_of(mm_graph(512, 256, 4096, dtype="f64")))
    assert ONEDNN not in candidates(node_of(mm_graph(512, 256, 4096)), onednn=False)


@pytest.mark.parametrize("m, k, n", [(512, 256, 1024), (512, 1024, 256), (64, 1024, 1024),
                                     (4000, 128, 256)])
def test_the_only_candidate_of_a_product_with_no_side_for_blocks(m, k, n):
    trial = GemmBlocks().callable_for(node_of(mm_graph(m, k, n))).__self__
    assert max(m, n) < gemm.MIN_SIDE and trial.candidates == [ONEDNN]


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 200), k=st.integers(1, 300), n=st.integers(1, 700),
       transposed=st.booleans(), a_transposed=st.booleans(), bias=st.booleans(),
       seed=st.integers(0, 99))
def test_onednn_gives_the_products_values_within_rounding(m, k, n, transposed, a_transposed,
                                                          bias, seed):
    a, b = operands(m, k, n, torch.float32, transposed, seed)
    if a_transposed:
        a = a.t().contiguous().t()
    c = torch.randn(n) if bias else None
    want = torch.mm(a, b) if c is None else torch.addmm(c, a, b)
    got = onednn_addmm(c, a, b)
    assert got.shape == want.shape and got.is_contiguous()
    assert gemm._within_rounding(got, want)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * (k ** 0.5))


def test_within_rounding_refuses_other_values():
    want = torch.randn(64, 64)
    assert gemm._within_rounding(want + 1e-7, want)
    assert not gemm._within_rounding(want * 1.01, want)
    assert not gemm._within_rounding(want[:, :32], want)
    nan = want.clone()
    nan[3, 4] = float("nan")
    assert gemm._within_rounding(nan.clone(), nan)
    assert not gemm._within_rounding(want, nan)


def onednn_trial(seconds, calls, *, perturb=False):
    """A trial of ``[64, 256] x [256, 4096]`` with oneDNN its one candidate, on a scripted
    clock: (what it settled, the trial, each call's result, the whole product)."""
    settled = []
    key = GemmBlocks().key(node_of(mm_graph(64, 256, 4096)))
    trial = Trial(key, [ONEDNN], lambda k, b: settled.append(b), Script(seconds, 2))
    if perturb:  # off by more than rounding
        trial.variants = [trial.variants[0],
                          lambda *a, **k: onednn_addmm(*a, **k).mul_(1.01)]
    a, b = operands(64, 256, 4096, torch.float32, True)
    got = [trial.mm(a, b) for _ in range(calls)]
    return settled, trial, got, torch.mm(a, b)


def test_taken_where_faster_and_within_rounding():
    calls = 2 * (1 + ROUNDS) + 1  # warm-up, timed rounds, the check
    settled, trial, got, want = onednn_trial(lambda v: 1.0 if v == 0 else 0.5, calls + 2)
    assert settled == [ONEDNN] and trial.decided is onednn_addmm
    assert all(gemm._within_rounding(g, want) for g in got)
    assert torch.equal(got[calls - 1], want)  # the check's call returns the whole product
    # off by more than rounding at its check: whole
    settled, trial, got, want = onednn_trial(lambda v: 1.0 if v == 0 else 0.5, calls + 2,
                                             perturb=True)
    assert settled == [None] and trial.decided is gemm._whole
    assert all(torch.equal(g, want) for g in got[calls - 1:])
    # not faster: whole
    settled, trial, _, _ = onednn_trial(lambda v: 1.0 if v == 0 else 1.5, 20)
    assert settled == [None]


def test_products_autograd_records_are_the_whole_call():
    a, b = operands(64, 256, 4096, torch.float32, True)
    a.requires_grad_()
    got = onednn_addmm(None, a, b)
    assert got.grad_fn is not None and torch.equal(got, torch.mm(a, b))


def test_the_plan_calls_onednn_where_chosen_and_the_choice_is_kept(tmp_path):
    path = tmp_path / "gemm-blocks.json"
    text = addmm_graph("4096")
    node = addmm_node("4096")
    blocks = GemmBlocks(path=path)
    blocks.settle(blocks.key(node), ONEDNN)
    assert json.loads(path.read_text())["chosen"] == {repr(blocks.key(node)): ["onednn", 0]}
    later = GemmBlocks(path=path)  # the next process
    assert later.callable_for(node) is onednn_addmm and not later.trials
    plan = build_function(parse_graph(text), default_registry(), calls=later.callable_for)
    c, a, b = torch.randn(4096), torch.randn(512, 256), torch.randn(4096, 256).t()
    (y,) = plan.fn(c, a, b)
    assert gemm._within_rounding(y, torch.addmm(c, a, b))
