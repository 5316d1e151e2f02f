"""Shared helpers for the triton codegen tests.

CPU groups run under the Triton interpreter, which the codegen uses for CPU groups only when
asked: an autouse fixture sets TORCHLOOM_TRITON_CPU=1 for every test here. ``check`` compiles a hand-written fusion-group graph with the
triton codegen, runs it, and compares every output with the eager codegen's.
"""

from __future__ import annotations

import attrs
import pytest
import torch
from torchloom.api import Graph, TensorType, parse_graph, verify
from torchloom.testing.reductions import group_text  # noqa: F401  (tests import it from here)
from torchloom.tools import EagerCodegen, load_plugins
from torchloom.runtime.executor import CompiledGraph

pytest.importorskip("triton")

from torchloom_codegen_triton import TritonCodegen  # noqa: E402


@pytest.fixture(autouse=True)
def _triton_on_cpu(monkeypatch):
    """These tests run CPU groups in the Triton interpreter (an explicit opt-in)."""
    monkeypatch.setenv("TORCHLOOM_TRITON_CPU", "1")


@pytest.fixture(scope="session")
def registry():
    return load_plugins().registry


@pytest.fixture
def codegen(tmp_path):
    return TritonCodegen(cache_dir=tmp_path, autotune=False)


def on_device(graph: Graph, device: str) -> Graph:
    """Move every tensor type of ``graph`` (regions included) to ``device``."""
    def retype(v):
        if isinstance(v.type, TensorType):
            v.type = attrs.evolve(v.type, device=device)

    def walk(g: Graph):
        for v in g.inputs:
            retype(v)
        for n in g.nodes:
            for v in n.outputs:
                retype(v)
            if n.region is not None:
                walk(n.region)
    walk(graph)
    return graph


class Checker:
    def __init__(self, registry, codegen, device="cpu"):
        self.registry, self.codegen, self.device = registry, codegen, device

    def __call__(self, text: str, *inputs, exact: bool = False, **tolerances):
        """Run ``text`` on triton and on eager; assert the outputs agree; return
        (triton outputs, compiled graph)."""
        inputs = tuple(x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs)
        graph = on_device(parse_graph(text), self.device)
        verify(graph, self.registry)  # the hand-written types must be what torch infers
        compiled = CompiledGraph(graph, self.registry, [self.codegen, EagerCodegen()])
        assert [c.codegen for c in compiled.choices] == ["triton"] * len(compiled.choices), [
            str(r) for c in compiled.choices for r in c.fallback_reasons]
        got = compiled(*inputs)
        if self.device != "cpu":  # a second call takes the compiled kernel's fast launcher
            got = compiled(*inputs)
        reference = CompiledGraph(on_device(parse_graph(text), self.device), self.registry,
                                  [EagerCodegen()])
        want = reference(*inputs)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            if exact:
                torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
            else:
                torch.testing.assert_close(g, w, equal_nan=True, **tolerances)
        return got, compiled


@pytest.fixture
def check(registry, codegen):
    return Checker(registry, codegen)
