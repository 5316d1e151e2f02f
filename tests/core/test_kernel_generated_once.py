"""Each codegen judges a group structure once and generates each unique kernel once: groups
of the same structure (12 identical layers) reuse the first one's verdict and kernel, and
``--dump``, ``explain``'s kernel details and its HTML page read the source the kernel cache
stored instead of generating it again."""

from __future__ import annotations

import types

import torch
from torchloom.api import Reason, hookimpl, parse_graph
from torchloom.runtime.cache import KernelCache
from torchloom.runtime.executor import CompiledGraph
from torchloom.tools import Compiler, EagerCodegen, load_plugins

#: three groups of one structure (exp then mul) and one other (neg)
GRAPH = """graph @g(%x: f32[8], %y: f32[8]) {
  %a = torchloom.fusion_group(%x, %y) : f32[8] region @g0(%p: f32[8], %q: f32[8]) {
    %t = aten.exp.default(%p) : f32[8]
    %u = aten.mul.Tensor(%t, %q) : f32[8]
    return %u
  }
  %b = torchloom.fusion_group(%a, %y) : f32[8] region @g1(%p1: f32[8], %q1: f32[8]) {
    %t1 = aten.exp.default(%p1) : f32[8]
    %u1 = aten.mul.Tensor(%t1, %q1) : f32[8]
    return %u1
  }
  %c = torchloom.fusion_group(%b) : f32[8] region @g2(%r: f32[8]) {
    %v = aten.neg.default(%r) : f32[8]
    return %v
  }
  %d = torchloom.fusion_group(%c, %y) : f32[8] region @g3(%p3: f32[8], %q3: f32[8]) {
    %t3 = aten.exp.default(%p3) : f32[8]
    %u3 = aten.mul.Tensor(%t3, %q3) : f32[8]
    return %u3
  }
  return %d
}
"""


def expected(x, y):
    return torch.exp(-(torch.exp(torch.exp(x) * y) * y)) * y


class Counting(EagerCodegen):
    """Counts its verdicts and generated kernels by region; declines ``neg`` groups."""

    name = "counting"

    def __init__(self):
        self.judged: list[str] = []
        self.generated: list[str] = []

    def supports(self, group, registry):
        self.judged.append(group.region.name)
        if any(n.op == "aten.neg.default" for n in group.region.nodes):
            return Reason(self.name, "no neg here")
        return None

    def generate(self, group, registry):
        self.generated.append(group.region.name)
        return super().generate(group, registry)


def test_each_structure_is_judged_and_generated_once():
    registry = load_plugins().registry
    counting = Counting()
    compiled = CompiledGraph(parse_graph(GRAPH), registry, [counting, EagerCodegen()],
                             KernelCache())
    x, y = torch.randn(8), torch.randn(8)
    torch.testing.assert_close(compiled(x, y)[0], expected(x, y))
    assert counting.judged == ["g0", "g2"]  # g1 and g3 share g0's structure
    assert counting.generated == ["g0"]
    assert [c.codegen for c in compiled.choices] == ["counting", "counting", "eager",
                                                     "counting"]
    # the declined structure keeps its reason for every group of it
    assert [str(r) for r in compiled.choices[2].fallback_reasons] == [
        str(Reason("counting", "no neg here"))]


def test_dump_and_kernel_details_read_the_stored_source(tmp_path):
    counting = Counting()
    module = types.ModuleType("counting_plugin")
    module.torchloom_codegens = hookimpl(lambda: [counting])
    plugins = load_plugins(entry_points=[], extra=[("counting", module, "counting", "1")])
    compiler = Compiler({"pipeline": {"codegen": "counting"}}, plugins=plugins,
                        dump_dir=tmp_path / "dump", compile_cache=False)
    comp = compiler.compile_graph(parse_graph(GRAPH))
    x, y = torch.randn(8), torch.randn(8)
    torch.testing.assert_close(comp.fn(x, y)[0], expected(x, y))
    assert counting.generated == ["g0"]
    dumped = sorted((tmp_path / "dump").rglob("group*-counting.txt"))
    assert len(dumped) == 3 and len({p.read_text() for p in dumped}) == 1
    from torchloom.report import kernel_summary
    details = kernel_summary(compiler)["kernel_details"]
    assert len(details) == 4
    assert counting.generated == ["g0"]  # explain's details generated nothing either
