"""A pointwise group whose outputs have different element counts (fusion returns a
broadcast operand beside the full result: HF GPT-2 / Llama / T5 groups under automatic
dynamic shapes) is one C function of one nest per element count; it was declined
("pointwise outputs with different element counts") and ran on eager.

``half_of_the_last_dim`` also caught a name clash: a value named ``x`` was bound as
``x1``, the name of a row coordinate, and the C did not compile (values named like
coordinates are now bound as ``vx1``)."""

from __future__ import annotations

import pytest
import torch
from torchloom.testing.reductions import group_text

CASES = {
    "row_and_full": (group_text("%x: f32[4, 8], %w: f32[4, 1]", """
        %b = aten.sin.default(%w) : f32[4, 1]
        %e = aten.exp.default(%x) : f32[4, 8]
        %y = aten.mul.Tensor(%e, %b) : f32[4, 8]""", "%y: f32[4, 8], %b: f32[4, 1]"),
        lambda: (torch.randn(4, 8), torch.randn(4, 1))),
    "three_counts_bf16": (group_text("%x: bf16[2, 3, 16], %w: bf16[3, 16], %v: bf16[16]", """
        %a = aten.add.Tensor(%w, %v) : bf16[3, 16]
        %t = aten.tanh.default(%v) : bf16[16]
        %y = aten.mul.Tensor(%x, %a) : bf16[2, 3, 16]""",
        "%y: bf16[2, 3, 16], %a: bf16[3, 16], %t: bf16[16]"),
        lambda: (torch.randn(2, 3, 16, dtype=torch.bfloat16),
                 torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(16, dtype=torch.bfloat16))),
    "half_of_the_last_dim": (group_text("%x: f32[2, 2, 8, 16]", """
        %h = aten.slice.Tensor(%x) {dim = 3, start = 8, end = 16} : f32[2, 2, 8, 8]
        %n = aten.neg.default(%h) : f32[2, 2, 8, 8]
        %c = aten.abs.default(%x) : f32[2, 2, 8, 16]""", "%n: f32[2, 2, 8, 8], %c: f32[2, 2, 8, 16]"),
        lambda: (torch.randn(2, 2, 8, 16),)),
}


#: (input, output) pairs written in place: the full result over ``x``, ``b`` over ``w``
#: (read last in its own nest), ``t`` over ``v`` (read by all three nests, last by its own);
#: none where a slice of ``x`` is read
EXPECTED_PAIRS = {"row_and_full": [(0, 0), (1, 1)],
                  "three_counts_bf16": [(0, 0), (1, 1), (2, 2)],
                  "half_of_the_last_dim": []}


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_of_several_element_counts_are_one_function(check, name):
    text, inputs = CASES[name]
    _, compiled = check(text, *inputs())
    (choice,) = compiled.choices
    kernel = check.codegen.generate(choice.node, check.registry)
    counts = {len(o["shape"]) and torch.Size(o["shape"]).numel() for o in kernel.metadata["outputs"]}
    assert kernel.metadata["nests"] == len(counts) > 1
    # an output may be written over an input whose last read (in its nest or an earlier
    # one: each nest ends before the next starts) comes before the output's first store
    pairs = [tuple(p) for p in kernel.metadata["inplace"]]
    assert pairs == EXPECTED_PAIRS[name]
    launcher = check.codegen.load(kernel, check.registry)
    given = inputs()
    want = check.reference(text, *given)
    for chosen in [[p] for p in pairs] + [pairs]:
        args = [a.clone() for a in given]
        outs = [None] * len(want)
        for i, j in chosen:
            outs[j] = args[i].view(want[j].shape)
        got = launcher.into(tuple(outs), *args)
        for i, j in chosen:
            assert got[j].data_ptr() == args[i].data_ptr()
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)


def test_symbolic_counts_are_told_apart_at_run_time(check):
    text = group_text("%x: f32[s0, 8], %w: f32[s0, 1]", """
        %b = aten.sigmoid.default(%w) : f32[s0, 1]
        %y = aten.mul.Tensor(%x, %b) : f32[s0, 8]""", "%y: f32[s0, 8], %b: f32[s0, 1]")
    compiled = check.compile(text)
    assert check.codegen.generate(compiled.choices[0].node, check.registry).metadata["nests"] == 2
    for rows in (1, 5, 0, 33):
        x, w = torch.randn(rows, 8), torch.randn(rows, 1)
        got = compiled(x, w)
        for g, e in zip(got, check.reference(text, x, w)):
            torch.testing.assert_close(g, e)
