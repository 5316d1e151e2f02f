"""Structural gates: the ``kernel_gate`` fixture asserts what a compiled callable launches,
exactly and without timing, so it holds under any load, on every commit::

    def test_softmax_is_one_kernel(kernel_gate):
        x = torch.randn(64, 1024)
        kernel_gate(torch.softmax, (x, -1), kernels=1, fusion_groups=1, groups_on_eager=0)

The counts are ``explain``'s (:mod:`torchloom.report`): ``kernels`` launched per call of
every graph, ``fusion_groups``, ``groups_on_eager`` (groups no native codegen took),
``graphs`` (what Dynamo handed over), ``graph_fallbacks`` (graphs that run whole on eager)
and ``bytes_moved`` (read + written by every kernel, explain's traffic model). Any
expectation may be a dict by device class (``{"cpu": 3, "cuda": 1}``; ``"*"`` for the
others): a class the dict does not name is not checked there. The device class is the
first tensor input's device type unless ``device_class`` says otherwise. A workload file
(``def workload()``) may stand in for the callable and its inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

COUNTS = ("kernels", "fusion_groups", "groups_on_eager", "graphs", "graph_fallbacks",
          "bytes_moved")


@attrs.frozen
class KernelCounts:
    kernels: int
    fusion_groups: int
    groups_on_eager: int
    graphs: int
    graph_fallbacks: int
    bytes_moved: int
    device_class: str
    eager_reasons: tuple[str, ...] = ()

    def line(self) -> str:
        return (f"{self.kernels} kernels, {self.fusion_groups} fusion groups, "
                f"{self.groups_on_eager} groups on eager, {self.graphs} graphs "
                f"({self.graph_fallbacks} on eager), {self.bytes_moved} bytes moved "
                f"[{self.device_class}]")


def device_class_of(inputs: Sequence[Any]) -> str:
    import torch
    for x in inputs:
        if isinstance(x, torch.Tensor):
            return x.device.type
    return "cpu"


def expected_for(expected: dict[str, Any], device_class: str) -> dict[str, int]:
    """The expectations that apply to ``device_class``; unknown names are an error."""
    unknown = sorted(set(expected) - set(COUNTS))
    if unknown:
        raise TypeError(f"kernel_gate: unknown expectation(s) {', '.join(unknown)}; "
                        f"expected some of {', '.join(COUNTS)}")
    out = {}
    for name, want in expected.items():
        if isinstance(want, dict):
            want = want.get(device_class, want.get("*"))
        if want is not None:
            out[name] = int(want)
    return out


def compile_and_count(fn, inputs: Sequence[Any], *, pipeline: str = "default",
                      backward: bool | None = None, device_class: str | None = None
                      ) -> KernelCounts:
    """Compile ``fn`` through ``torch.compile(backend="torchloom")``, run it once (and its
    backward when it builds one), and count what its graphs launch."""
    import torch

    from torchloom.backend import torchloom_backend
    from torchloom.compiler import Compiler
    from torchloom.workloads import needs_backward
    from torchloom.report import count_kernels, fusion_groups, kernel_summary
    compiler = Compiler(pipeline, compile_cache=False, strict=True)
    backward = needs_backward(fn, inputs) if backward is None else backward
    torch._dynamo.reset()
    try:
        compiled = torch.compile(fn, backend=lambda gm, ex: torchloom_backend(
            gm, ex, options={"compiler": compiler}))
        args = [t.detach().clone().requires_grad_(t.requires_grad)
                if isinstance(t, torch.Tensor) else t for t in inputs]
        out = compiled(*args)
        if backward:
            outs = out if isinstance(out, (list, tuple)) else [out]
            total = sum(t.float().sum() for t in outs
                        if isinstance(t, torch.Tensor) and t.requires_grad)
            if isinstance(total, torch.Tensor):
                total.backward()
    finally:
        torch._dynamo.reset()
    kernels = groups = on_eager = fallbacks = 0
    reasons: list[str] = []
    for comp in compiler.compilations:
        if comp.fallback_reason is not None:
            fallbacks += 1
            kernels += comp.nodes_before
            continue
        kernels += count_kernels(comp.graph, compiler.registry)
        groups += len(fusion_groups(comp.graph))
        for choice in (comp.compiled or comp.static).choices:
            if choice.codegen == "eager":
                on_eager += 1
                reasons.extend(str(r) for r in choice.fallback_reasons)
    moved = kernel_summary(compiler)["bytes_moved"]
    return KernelCounts(kernels, groups, on_eager, len(compiler.compilations), fallbacks,
                        moved, device_class or device_class_of(inputs), tuple(reasons))


class KernelGate:
    """Callable returned by the ``kernel_gate`` fixture."""

    def __init__(self, record=None):
        self.record = record

    def __call__(self, fn, inputs: Sequence[Any] = (), *, pipeline: str = "default",
                 backward: bool | None = None, device: str = "cpu",
                 device_class: str | None = None, **expected) -> KernelCounts:
        """Compile and count; fail naming every count that differs from its expectation.
        ``fn`` may be a workload file (``inputs`` then come from it, built on ``device``)."""
        if isinstance(fn, (str, Path)):
            from torchloom.workloads import load_workload
            fn, inputs = load_workload(fn, device)
        counts = compile_and_count(fn, inputs, pipeline=pipeline, backward=backward,
                                   device_class=device_class)
        want = expected_for(expected, counts.device_class)
        wrong = [f"{name} {getattr(counts, name)} (expected {value})"
                 for name, value in want.items() if getattr(counts, name) != value]
        verdict = "FAIL" if wrong else "PASS"
        if self.record is not None:
            self.record("perf_gate", f"{verdict}: kernel gate: {counts.line()}")
        if wrong:
            reasons = "".join(f"\n  group on eager: {r}" for r in counts.eager_reasons)
            pytest.fail(f"kernel gate: {'; '.join(wrong)}; compiled: {counts.line()}"
                        f"{reasons}", pytrace=False)
        return counts


@pytest.fixture
def kernel_gate(request) -> KernelGate:
    """Assert what a compiled callable launches:
    ``kernel_gate(fn, inputs, kernels=1, fusion_groups=1, groups_on_eager=0)``."""
    return KernelGate(record=request.getfixturevalue("record_property"))
