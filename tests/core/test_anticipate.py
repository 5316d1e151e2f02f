"""The optional ``anticipate(graph, registry)`` of the codegen protocol (codegen/base.py,
``runtime.executor.anticipate_codegens``): each codegen of the chain sees every graph as
the frontend imported it, before any pass has grouped it; one that raises is logged and
the graph compiles as without it."""

from __future__ import annotations

import logging

import torch
import types

from torchloom.api import hookimpl, parse_graph
from torchloom.tools import Compiler, EagerCodegen, load_plugins

TEXT = """graph @g(%x: f32[8, 16], %y: f32[8, 16]) {
  %a = aten.exp.default(%x) : f32[8, 16]
  %b = aten.mul.Tensor(%a, %y) : f32[8, 16]
  %c = aten.tanh.default(%b) : f32[8, 16]
  return %c
}
"""


class Anticipates(EagerCodegen):
    """Records the ops of each graph it is shown; raises after recording with ``fail``."""

    name = "anticipates"

    def __init__(self, fail: bool = False):
        self.seen: list[list[str]] = []
        self.fail = fail

    def anticipate(self, graph, registry):
        self.seen.append([n.op for n in graph.nodes])
        if self.fail:
            raise RuntimeError("cannot look ahead")


def compiler_with(codegen, tmp_path, **options):
    """A compiler of the default pipeline whose codegen is ``codegen`` (then eager)."""
    module = types.ModuleType("anticipates_plugin")
    module.torchloom_codegens = hookimpl(lambda: [codegen])
    plugins = load_plugins(extra=[("anticipates", module, "anticipates", "1")])
    return Compiler({"pipeline": {"name": "anticipating", "extends": "default",
                                  "codegen": "anticipates"}}, plugins=plugins,
                    cache_dir=tmp_path, compile_cache=False, **options)


def compile_with(codegen, tmp_path, monkeypatch):
    return compiler_with(codegen, tmp_path).compile_graph(parse_graph(TEXT))


def check(comp):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
    (got,) = comp.fn(x, y)
    torch.testing.assert_close(got, torch.tanh(torch.exp(x) * y))


def test_each_codegen_sees_the_graph_before_any_pass(tmp_path, monkeypatch):
    codegen = Anticipates()
    comp = compile_with(codegen, tmp_path, monkeypatch)
    assert codegen.seen == [["aten.exp.default", "aten.mul.Tensor", "aten.tanh.default"]]
    assert [n.op for n in comp.graph.nodes] == ["torchloom.fusion_group"]  # grouped after
    check(comp)


def test_an_anticipate_that_raises_is_logged_and_costs_nothing_else(tmp_path, monkeypatch,
                                                                    caplog):
    codegen = Anticipates(fail=True)
    with caplog.at_level(logging.WARNING, logger="torchloom.runtime"):
        comp = compile_with(codegen, tmp_path, monkeypatch)
    told = [r.getMessage() for r in caplog.records if "anticipating" in r.getMessage()]
    assert len(told) == 1 and "'anticipates'" in told[0] and "cannot look ahead" in told[0]
    assert [c.codegen for c in comp.compiled.choices] == ["anticipates"]
    check(comp)


def test_a_static_target_anticipates_nothing(tmp_path):
    """``explain --target``: nothing is built or run on this machine, so nothing starts
    early (the cpu graph here is described for sm_90 op by op or by Triton)."""
    codegen = Anticipates()
    compiler = compiler_with(codegen, tmp_path, target="sm_90")
    comp = compiler.compile_graph(parse_graph(TEXT), fallback=lambda *a: a)
    assert codegen.seen == []
    assert comp.static is not None
