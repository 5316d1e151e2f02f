"""Instruments observe: one that edits the graph (in ``before_pass`` or ``after_pass``) is
stopped with a PluginError naming it, its plugin and distribution; the graph from before
the call is restored. One that only reads never trips the check."""

from __future__ import annotations

import pytest
import torch

from torchloom.errors import PluginError
from torchloom.ir.text import parse_graph
from torchloom.ir.verify import verify
from torchloom.passes.base import PassContext
from torchloom.passes.manager import PassManager
from torchloom.passes.pipeline import build_pipeline, parse_raw
from torchloom.plugins.loader import load_plugins
from torchloom.runtime.executor import build_function

from test_plugins_support import fake_site  # noqa: F401 (fixture)

MUL_IR = """\
graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
  %m = aten.mul.Tensor(%x, %y) : f32[4, 8]
  %e = aten.exp.default(%m) : f32[4, 8]
  %dead = aten.neg.default(%y) : f32[4, 8]
  return %e
}
"""

#: instruments a plugin registers; each edits the graph a different way
INSTRUMENTS = '''
from torchloom.api import hookimpl


class MulToDiv:
    """after_pass: rewrites every mul into a div (the output silently changes)."""
    def after_pass(self, pass_, graph, ctx, result, seconds):
        for node in list(graph.nodes):
            if node.op == "aten.mul.Tensor":
                div = graph.create("aten.div.Tensor", list(node.inputs), [node.output.type],
                                   before=node)
                graph.replace_all_uses(node.output, div.output)
                graph.erase(node)


class Breaker:
    """before_pass: adds a node reading a value defined after it (an invalid graph)."""
    def before_pass(self, pass_, graph, ctx):
        last = graph.last.output
        graph.create("aten.neg.default", [last], [last.type], before=graph.first)


class Reader:
    """Only reads: prints the graph and counts what it sees."""
    seen = []
    def before_pass(self, pass_, graph, ctx):
        Reader.seen.append((pass_.name, len(str(graph)), graph.num_nodes()))
    def after_pass(self, pass_, graph, ctx, result, seconds):
        Reader.seen.append((pass_.name, result.changed, [n.op for n in graph.nodes]))


@hookimpl
def torchloom_instruments():
    return [{name}()]
'''


def plugins_with(site, instrument: str):
    module = f"tl_ins_{instrument.lower()}"
    site.add(f"{instrument.lower()}-dist", version="0.4",
             modules={module: INSTRUMENTS.replace("{name}", instrument)},
             entry_points={instrument.lower(): module})
    return load_plugins(entry_points=site.entry_points())


def run(plugins, graph, verify_policy: str = "each", body: str | None = None, **kwargs):
    body = body or '[[pass]]\nname = "cse"\n[[pass]]\nname = "dce"\n'
    text = f'[pipeline]\nname = "t"\nverify = "{verify_policy}"\n{body}'
    pipeline = build_pipeline(parse_raw(text, "t.toml"), plugins)
    ctx = PassContext(registry=plugins.registry)
    return PassManager(pipeline, plugins, **kwargs).run(graph, ctx)


def compute(graph, registry, x, y):
    return build_function(graph, registry).fn(x, y)[0]


def test_an_after_pass_instrument_that_rewrites_the_graph_is_named(fake_site):
    plugins = plugins_with(fake_site, "MulToDiv")
    graph = parse_graph(MUL_IR)
    with pytest.raises(PluginError) as info:
        run(plugins, graph)
    assert str(info.value).startswith(
        "instrument MulToDiv from plugin 'multodiv' (multodiv-dist) changed the graph (@g) "
        "in after_pass of pass 'cse'")
    # restored to the graph cse left: still a mul, and it computes what it computed before
    ops = [n.op for n in graph.nodes]
    assert ops.count("aten.mul.Tensor") == 1 and "aten.div.Tensor" not in ops
    verify(graph, plugins.registry)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(compute(graph, plugins.registry, x, y), torch.exp(x * y))


@pytest.mark.parametrize("verify_policy", ["each", "off"])
def test_a_before_pass_instrument_that_breaks_the_graph_is_blamed_not_the_pass(
        fake_site, verify_policy):
    plugins = plugins_with(fake_site, "Breaker")
    graph = parse_graph(MUL_IR)
    before = str(graph)
    with pytest.raises(PluginError) as info:
        run(plugins, graph, verify_policy)
    message = str(info.value)
    assert message.startswith("instrument Breaker from plugin 'breaker' (breaker-dist) changed "
                              "the graph (@g) in before_pass of pass 'cse'")
    assert "must not edit the graph" in message
    assert str(graph) == before  # nothing ran on the broken graph, and it was put back
    verify(graph, plugins.registry)


@pytest.mark.parametrize("verify_policy", ["each", "end", "off"])
def test_an_instrument_that_only_reads_never_trips_the_check(fake_site, tmp_path,
                                                              verify_policy):
    plugins = plugins_with(fake_site, "Reader")
    graph = parse_graph(MUL_IR)
    body = ('[[pass]]\nname = "cse"\n[[pass]]\nfixpoint = ["dce", "canonicalize"]\n'
            'max_iterations = 3\n')
    report = run(plugins, graph, verify_policy, body, dump_dir=tmp_path / "dump")
    import tl_ins_reader
    assert [r.name for r in report.records] == ["cse", "dce", "canonicalize", "dce",
                                                "canonicalize"]
    assert len(tl_ins_reader.Reader.seen) == 2 * len(report.records)
    assert graph.num_nodes() == 2  # dce removed the dead neg; the instruments changed nothing


def test_under_torch_compile_the_graph_runs_eagerly_and_the_instrument_is_named(
        fake_site, tmp_path, caplog):
    import logging
    plugins_with(fake_site, "MulToDiv")  # installed: torch.compile's Compiler finds it
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[pipeline]\nname = "p"\ncodegen = "eager"\n[[pass]]\nname = "cse"\n')

    def f(x, y):
        return torch.exp(x * y)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="torchloom", options={
        "pipeline": str(pipeline), "cache_dir": str(tmp_path / "cache")})
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        torch.testing.assert_close(compiled(x, y), f(x, y))  # a mul, not a div
    torch._dynamo.reset()
    [warning] = [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]
    assert ("running graph0 eagerly: instrument MulToDiv from plugin 'multodiv' "
            "(multodiv-dist) changed the graph") in warning
