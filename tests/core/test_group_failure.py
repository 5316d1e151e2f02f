"""A codegen that raises while judging or compiling one fusion group costs only that group
(runtime/group_failure.py): the group runs on the next codegen (``eager``), the others stay
on the codegen, results match eager, the error is logged once with the path of a file that
holds the group's IR, and explain's fallback reason names that file."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from torchloom.api import hookimpl
from torchloom.codegen.base import KernelSource
from torchloom.codegen.eager import EagerCodegen
from torchloom.compiler import Compiler
from torchloom.ir import parse_graph, print_graph
from torchloom.ir.canon import alpha_equivalent
from torchloom.ops.aten import default_registry
from torchloom.plugins.loader import load_plugins
from torchloom.report import summarize
from torchloom.runtime.cache import KernelCache
from torchloom.runtime.executor import CompiledGraph, build_function

THREE_GROUPS = """\
graph @g(%x: f32[4, 8], %w: f32[8, 8]) {
  %a = torchloom.fusion_group(%x) : f32[4, 8] region @g_exp(%x0: f32[4, 8]) {
    %e = aten.exp.default(%x0) : f32[4, 8]
    return %e
  }
  %m = aten.mm.default(%a, %w) : f32[4, 8]
  %b = torchloom.fusion_group(%m) : f32[4, 8] region @g_sin(%m0: f32[4, 8]) {
    %s = aten.sin.default(%m0) : f32[4, 8]
    %t = aten.mul.Tensor(%s) {other = 2.0} : f32[4, 8]
    return %t
  }
  %c = torchloom.fusion_group(%b, %x) : f32[4, 8] region @g_tanh(%b0: f32[4, 8], %x1: f32[4, 8]) {
    %h = aten.tanh.default(%b0) : f32[4, 8]
    %y = aten.add.Tensor(%h, %x1) : f32[4, 8]
    return %y
  }
  return %c
}
"""


def reference(x, w):
    return torch.tanh((x.exp() @ w).sin() * 2.0) + x


class Flaky:
    """Compiles every group (runs it op by op), but raises on groups holding ``sin``:
    in ``supports`` (stage ``judging``) or in ``generate`` (stage ``compiling``)."""

    version = "1"

    def __init__(self, stage: str):
        self.name, self.stage, self.compiled = "flaky", stage, []

    def _fail_on_sin(self, group, stage):
        if stage == self.stage and any(n.op == "aten.sin.default" for n in group.region.nodes):
            raise RuntimeError(f"flaky cannot handle sin (while {stage})")

    def supports(self, group, registry):
        self._fail_on_sin(group, "judging")
        return None

    def generate(self, group, registry):
        self._fail_on_sin(group, "compiling")
        self.compiled.append(group.region.name)
        return KernelSource(self.name, print_graph(group.region))

    def load(self, kernel, registry):
        return build_function(parse_graph(kernel.source), registry).fn


def _records(caplog):
    return [r.getMessage() for r in caplog.records if "flaky cannot handle" in r.getMessage()]


@pytest.mark.parametrize("stage", ["judging", "compiling"])
def test_a_raising_codegen_costs_only_the_group_it_raised_on(stage, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="torchloom")
    registry, graph = default_registry(), parse_graph(THREE_GROUPS)
    flaky, warned, repro = Flaky(stage), set(), tmp_path / "reproducers"
    compiled = CompiledGraph(graph, registry, [flaky, EagerCodegen()], KernelCache(),
                             repro_dir=repro, warned=warned)
    assert [(c.node.region.name, c.codegen) for c in compiled.choices] == [
        ("g_exp", "flaky"), ("g_sin", "eager"), ("g_tanh", "flaky")]
    assert sorted(flaky.compiled) == ["g_exp", "g_tanh"]
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    torch.testing.assert_close(compiled(x, w)[0], reference(x, w))

    (reason,) = compiled.choices[1].fallback_reasons
    assert str(reason).startswith(f"flaky: raised while {stage} the group: RuntimeError: "
                                  f"flaky cannot handle sin")
    (message,) = _records(caplog)  # one record, naming the file
    path = Path(str(reason).rsplit("group IR: ", 1)[1].rstrip(")"))
    assert path.parent == repro and str(path) in message and "g_sin" in message
    text = path.read_text()
    assert "RuntimeError: flaky cannot handle sin" in text and "Traceback" in text
    kept = parse_graph(text)  # the group, as IR text: comments, then a graph holding it
    (group,) = kept.nodes
    sin_group = compiled.choices[1].node
    assert group.op == sin_group.op and alpha_equivalent(group.region, sin_group.region)
    assert [v.type for v in kept.inputs] == [v.type for v in sin_group.inputs]

    # the same failure again (another graph, same compiler): not logged again, same file
    again = CompiledGraph(parse_graph(THREE_GROUPS), registry, [Flaky(stage), EagerCodegen()],
                          KernelCache(), repro_dir=repro, warned=warned)
    assert str(again.choices[1].fallback_reasons[0]) == str(reason)
    assert len(_records(caplog)) == 1 and [p.name for p in repro.iterdir()] == [path.name]


def test_an_unwritable_reproducer_directory_still_costs_only_the_group(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="torchloom")
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    compiled = CompiledGraph(parse_graph(THREE_GROUPS), default_registry(),
                             [Flaky("judging"), EagerCodegen()], KernelCache(),
                             repro_dir=blocked / "reproducers")
    assert [c.codegen for c in compiled.choices] == ["flaky", "eager", "flaky"]
    (reason,) = compiled.choices[1].fallback_reasons
    path = Path(str(reason).rsplit("group IR: ", 1)[1].rstrip(")"))
    assert path.is_file() and not path.is_relative_to(tmp_path)  # the temporary directory
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    torch.testing.assert_close(compiled(x, w)[0], reference(x, w))


class FlakyPlugin:
    def __init__(self, codegen):
        self.codegen = codegen

    @hookimpl
    def torchloom_codegens(self):
        return [self.codegen]


def test_under_torch_compile_only_the_group_runs_eagerly_and_explain_names_the_ir(
        tmp_path, eager_default, caplog):
    caplog.set_level(logging.WARNING, logger="torchloom")
    pipeline = tmp_path / "flaky.toml"
    pipeline.write_text(Path(eager_default).read_text().replace('codegen = "eager"',
                                                                'codegen = "flaky"'))
    flaky = Flaky("judging")
    plugins = load_plugins(extra=[("flaky", FlakyPlugin(flaky), "flaky-dist", "1")])
    compiler = Compiler(str(pipeline), plugins=plugins, cache_dir=tmp_path / "cache",
                        compile_cache=False)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(reference, backend="torchloom", options={"compiler": compiler})
        x, w = torch.randn(4, 8), torch.randn(8, 8)
        torch.testing.assert_close(compiled(x, w), reference(x, w))
    finally:
        torch._dynamo.reset()
    (comp,) = compiler.compilations
    assert comp.fallback_reason is None  # the graph compiled; one group is on eager
    codegens = [c.codegen for c in comp.compiled.choices]
    assert codegens.count("eager") == 1 and codegens.count("flaky") >= 1
    fallbacks = summarize(compiler.compilations, compiler.registry,
                          compiler.kernel_cache)["fallbacks"]
    (fallback,) = fallbacks
    assert fallback["reason"].startswith("group on eager: flaky: raised while judging")
    path = Path(fallback["reason"].rsplit("group IR: ", 1)[1].rstrip(")"))
    assert path.parent == tmp_path / "cache" / "reproducers"
    assert "aten.sin.default" in path.read_text()
    (message,) = _records(caplog)
    assert str(path) in message


@pytest.mark.parametrize("stage", ["judging", "compiling"])
def test_a_static_plan_for_a_target_also_costs_only_the_group(stage, tmp_path, caplog):
    """``explain --target``: a codegen raising on one group leaves it to ``eager``."""
    from torchloom.runtime.static import StaticPlan

    caplog.set_level(logging.WARNING, logger="torchloom")
    plan = StaticPlan(parse_graph(THREE_GROUPS), default_registry(),
                      [Flaky(stage), EagerCodegen()], "sm_90", repro_dir=tmp_path)
    assert [(c.node.region.name, c.codegen) for c in plan.choices] == [
        ("g_exp", "flaky"), ("g_sin", "eager"), ("g_tanh", "flaky")]
    (reason,) = plan.choices[1].fallback_reasons
    assert f"raised while {stage} the group" in str(reason) and str(tmp_path) in str(reason)
    assert len(_records(caplog)) == 1
