"""The optional ``prepare(groups, registry)`` of the codegen protocol (runtime/executor.py):
before a graph's groups compile, a codegen gets every group it is the first of the chain to
support, the verdicts of the codegens before it are reused (each judges a group once), and a
``prepare`` that raises costs only the batching."""

from __future__ import annotations

import torch
from torchloom.api import parse_graph
from torchloom.tools import EagerCodegen, load_plugins
from torchloom.runtime.executor import CompiledGraph

GRAPH = """graph @g(%x: f32[4], %y: f32[4]) {
  %a = torchloom.fusion_group(%x) : f32[4] region @g0(%p: f32[4]) {
    %t = aten.exp.default(%p) : f32[4]
    return %t
  }
  %b = torchloom.fusion_group(%y) : f32[4] region @g1(%q: f32[4]) {
    %u = aten.neg.default(%q) : f32[4]
    return %u
  }
  %c = torchloom.fusion_group(%a, %b) : f32[4] region @g2(%r: f32[4], %s: f32[4]) {
    %v = aten.mul.Tensor(%r, %s) : f32[4]
    return %v
  }
  return %c
}
"""


class Declines(EagerCodegen):
    """Declines groups whose region has a ``neg``; counts its verdicts."""

    name = "declines"

    def __init__(self):
        self.judged = []

    def supports(self, group, registry):
        from torchloom.api import Reason
        self.judged.append(group.region.name)
        if any(n.op == "aten.neg.default" for n in group.region.nodes):
            return Reason(self.name, "no neg here")
        return None


class Prepares(EagerCodegen):
    name = "prepares"

    def __init__(self, fail: bool = False):
        self.prepared: list[list[str]] = []
        self.fail = fail

    def prepare(self, groups, registry):
        self.prepared.append([g.region.name for g in groups])
        if self.fail:
            raise RuntimeError("cannot batch")


def test_prepare_gets_the_groups_it_is_first_to_support():
    registry = load_plugins().registry
    first, second = Declines(), Prepares()
    compiled = CompiledGraph(parse_graph(GRAPH), registry, [first, second, EagerCodegen()])
    x, y = torch.randn(4), torch.randn(4)
    (got,) = compiled(x, y)
    torch.testing.assert_close(got, torch.exp(x) * -y)
    assert second.prepared == [["g1"]]  # g0 and g2 went to the first codegen
    assert sorted(first.judged) == ["g0", "g1", "g2"]  # once each, not again when compiling
    assert [c.codegen for c in compiled.choices] == ["declines", "prepares", "declines"]


def test_a_failing_prepare_costs_only_the_batching(caplog):
    registry = load_plugins().registry
    codegen = Prepares(fail=True)
    compiled = CompiledGraph(parse_graph(GRAPH), registry, [codegen, EagerCodegen()])
    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(compiled(x, y)[0], torch.exp(x) * -y)
    assert codegen.prepared == [["g0", "g1", "g2"]]
    assert {c.codegen for c in compiled.choices} == {"prepares"}
    assert "could not prepare 3 groups together" in caplog.text
