"""The ``kernel_gate`` fixture (core/torchloom/testing/kernelgate.py): exact counts of what
a compiled callable launches, per device class, failing with the counts that differ."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchloom.testing.kernelgate import KernelGate, expected_for

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[2]


def scaled_softmax(x):
    return torch.softmax(x * 2, -1)


def test_counts_of_a_fused_softmax(kernel_gate):
    x = torch.randn(64, 256)
    counts = kernel_gate(scaled_softmax, (x,), kernels=1, fusion_groups=1, groups_on_eager=0,
                         graphs=1, graph_fallbacks=0, bytes_moved=64 * 256 * 4 * 2)
    assert counts.device_class == "cpu" and counts.eager_reasons == ()


def test_expectations_per_device_class(kernel_gate):
    x = torch.randn(64, 256)
    # the cuda figure is not checked on a CPU tensor; "*" stands for classes not named
    counts = kernel_gate(scaled_softmax, (x,), kernels={"cuda": 7, "*": 1},
                         fusion_groups={"cuda": 9})
    assert counts.kernels == 1


def test_a_workload_file_stands_in_for_the_callable(kernel_gate):
    counts = kernel_gate(ROOT / "examples" / "gelu_bookend.py", kernels=1, fusion_groups=1,
                         groups_on_eager=0)
    assert counts.graphs == 1


def test_a_wrong_count_fails_naming_it():
    with pytest.raises(pytest.fail.Exception,
                       match=r"kernel gate: kernels 1 \(expected 2\); compiled: 1 kernels, "
                             r"1 fusion groups, 0 groups on eager"):
        KernelGate()(scaled_softmax, (torch.randn(8, 16),), kernels=2, fusion_groups=1)


def test_unknown_expectations_are_an_error():
    with pytest.raises(TypeError, match="unknown expectation.*kernel_count"):
        expected_for({"kernel_count": 1}, "cpu")


def test_the_verdict_line_is_in_the_summary(pytester):
    pytester.makepyfile(test_structure="""
import torch

def test_softmax(kernel_gate):
    kernel_gate(lambda x: torch.softmax(x * 2, -1), (torch.randn(8, 16),), kernels=1)
""")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*- perf gates -*", "test_structure.py::test_softmax: PASS: "
                                 "kernel gate: 1 kernels, 1 fusion groups, 0 groups on eager*"])
