"""The compile cache (runtime/graph_cache.py): a graph compiled once is loaded, not
recompiled, by a later Compiler with the same pipeline; anything that changes the result
changes the key; an unusable entry is reported once and compiled again."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import torchloom.compiler as compiler_module
from torchloom.api import parse_graph
from torchloom.tools import Compiler

LAYER = """\
graph @layer(%x: f32[4, 8], %w: f32[8], %b: f32[8]) {
  %m = aten.mul.Tensor(%x, %w) : f32[4, 8]
  %a = aten.add.Tensor(%m, %b) : f32[4, 8]
  %g = aten.gelu.default(%a) : f32[4, 8]
  %s = aten.sum.dim_IntList(%g) {dim = [-1], keepdim = true} : f32[4, 1]
  %d = aten.div.Tensor(%g, %s) : f32[4, 8]
  return %d, %g
}
"""


def eager(x, w, b):
    g = torch.nn.functional.gelu(x * w + b)
    return g / g.sum(-1, keepdim=True), g


def inputs():
    torch.manual_seed(0)
    return torch.randn(4, 8), torch.randn(8), torch.randn(8)


class NoPassRuns:
    def __init__(self, *args, **kwargs):
        pass

    def run(self, graph, ctx):
        raise AssertionError("a pass ran although the graph was in the compile cache")


def test_a_later_compiler_loads_the_graph_and_runs_no_pass(eager_default, tmp_path,
                                                           monkeypatch):
    first = Compiler(eager_default, cache_dir=tmp_path).compile_graph(parse_graph(LAYER))
    assert not first.cached
    monkeypatch.setattr(compiler_module, "PassManager", NoPassRuns)
    renamed = LAYER.replace("%m", "%scaled").replace("@layer", "@other")  # names do not count
    compiler = Compiler(eager_default, cache_dir=tmp_path)
    second = compiler.compile_graph(parse_graph(renamed))
    assert second.cached and compiler.graph_cache.stats()["hits"] == 1
    assert second.graph.name == "other"  # messages name this compilation's graph
    assert str(second.graph) == str(first.graph).replace("graph @layer(", "graph @other(", 1)
    assert second.report.notes[0].startswith("loaded from the compile cache (")
    assert [r.name for r in second.report.records] == [r.name for r in first.report.records]
    assert len(second.compiled.choices) == len(first.compiled.choices) >= 1
    for got, want in zip(second.fn(*inputs()), eager(*inputs())):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("change", ["shape", "pipeline", "device"])
def test_what_changes_the_result_changes_the_key(eager_default, tmp_path, change):
    Compiler(eager_default, cache_dir=tmp_path).compile_graph(parse_graph(LAYER))
    text, pipeline, device = LAYER, eager_default, "cpu"
    if change == "shape":
        text = LAYER.replace("f32[4, 8]", "f32[2, 8]").replace("f32[4, 1]", "f32[2, 1]")
    elif change == "pipeline":  # one pass option differs
        pipeline = tmp_path / "other.toml"
        pipeline.write_text(open(eager_default).read().replace(
            "max_iterations = 10", "max_iterations = 9"))
    else:
        device = "meta"
    compiler = Compiler(pipeline, cache_dir=tmp_path, device=device)
    assert not compiler.compile_graph(parse_graph(text)).cached
    assert compiler.graph_cache.stats()["misses"] == 1


def test_off_by_environment_and_when_ir_is_dumped_or_kept(eager_default, tmp_path,
                                                          monkeypatch):
    assert Compiler(eager_default, cache_dir=tmp_path, keep_ir=True).graph_cache is None
    assert Compiler(eager_default, cache_dir=tmp_path, dump_dir=tmp_path / "d").graph_cache is None
    monkeypatch.setenv("TORCHLOOM_COMPILE_CACHE", "0")
    assert Compiler(eager_default, cache_dir=tmp_path).graph_cache is None
    assert Compiler(eager_default, cache_dir=tmp_path, compile_cache=True).graph_cache


def entry_of(compiler: Compiler, text: str):
    return compiler.graph_cache.path(compiler.graph_cache.key(parse_graph(text)))


@pytest.mark.parametrize("damage", ["truncated", "edited", "invalid graph"])
def test_an_unusable_entry_is_reported_once_and_compiled_again(eager_default, tmp_path,
                                                                caplog, damage):
    compiler = Compiler(eager_default, cache_dir=tmp_path)
    compiler.compile_graph(parse_graph(LAYER))
    path = entry_of(compiler, LAYER)
    text = path.read_text()
    if damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "edited":  # valid JSON, but the checksum no longer vouches for it
        path.write_text(text.replace("aten.gelu.default", "aten.relu.default"))
    else:  # checksummed, but the graph reads a value before it is defined
        from torchloom.runtime.cache import checksum
        data = json.loads(text)
        del data["checksum"]
        lines = data["ir"].splitlines()
        lines[1], lines[2] = lines[2], lines[1]
        data["ir"] = "\n".join(lines) + "\n"
        path.write_text(json.dumps({**data, "checksum": checksum(data)}))
    caplog.set_level(logging.WARNING, logger="torchloom")
    again = Compiler(eager_default, cache_dir=tmp_path)
    for attempt in range(2):  # recompiled and rewritten, then loaded
        comp = again.compile_graph(parse_graph(LAYER))
        assert comp.cached == (attempt == 1)
        for got, want in zip(comp.fn(*inputs()), eager(*inputs())):
            torch.testing.assert_close(got, want)
    warnings = [r.getMessage() for r in caplog.records if "compile cache entry" in r.getMessage()]
    assert len(warnings) == 1 and str(path) in warnings[0] and "unusable" in warnings[0]
    assert again.graph_cache.stats()["corrupt"] == 1
    assert Compiler(eager_default, cache_dir=tmp_path).compile_graph(parse_graph(LAYER)).cached
