"""The README's perf-gate examples run as written (a pytest session of their own, in a
process of its own) and print the verdict lines the README shows."""

from __future__ import annotations

import re
from pathlib import Path

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> tuple[str, str]:
    section = ROOT.joinpath("README.md").read_text().split("### Perf gates\n")[1]
    section = section.split("\n### ")[0]
    (name, code), = re.findall(r"```python\n# (test_\w+\.py)\n(.*?)```", section, re.S)
    return name, code


def test_readme_perf_gate_examples_pass(pytester):
    name, code = readme_example()
    pytester.makepyfile(**{name.removesuffix(".py"): code})
    # a process of its own, as a user runs it: inside this one (pytester's in-process run)
    # the compiled softmax measured 0.5x eager where the same file run alone measures 1.7x
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=2)  # an inconclusive gate warns, a failing one fails
    result.stdout.fnmatch_lines([
        "*- perf gates -*",
        f"{name}::test_compiled_softmax_beats_eager: * torchloom *x eager [[]*, *[]] "
        "(95% hodges-lehmann, * rounds*), requires >= 1x*",
        f"{name}::test_compiled_softmax_is_one_kernel: PASS: kernel gate: 1 kernels, "
        "1 fusion groups, 0 groups on eager, 1 graphs (0 on eager), 2097152 bytes moved "
        "[[]cpu[]]"], consecutive=False)
