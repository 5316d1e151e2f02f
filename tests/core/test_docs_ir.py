"""docs/ir.md is run as written: its ```ir blocks parse and verify, its ```python blocks
run in order as one script (their asserts state what the page says), and the pass it
ends with, installed as a plugin from the page's code alone, compiles a program that
matches eager and never hands the caller its input."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from torchloom.backend import torchloom_backend
from torchloom.ir.text import parse_graph
from torchloom.ir.verify import verify
from torchloom.tools import Compiler, load_plugins

from test_plugins_support import fake_site  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ir.md"


def blocks(lang: str, doc: Path = DOC) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", doc.read_text(), re.S | re.M)


def test_the_page_has_examples_of_each_kind():
    assert len(blocks("ir")) >= 3 and len(blocks("python")) >= 8


@pytest.mark.parametrize("index", range(len(blocks("ir"))))
def test_every_ir_block_parses_and_verifies(index):
    graph = parse_graph(blocks("ir")[index], f"docs/ir.md ir block {index}")
    verify(graph, load_plugins(entry_points=[]).registry)


def test_the_python_blocks_run_in_order_as_one_script():
    namespace: dict = {"__name__": "docs_ir"}
    for i, code in enumerate(blocks("python")):
        exec(compile(code, f"docs/ir.md python block {i}", "exec"), namespace)
    assert namespace["result"].stats == {"folded": 1}


def plugin_code() -> str:
    """The page's plugin: the block with @hookimpl, and the imports it needs from the
    page's first block (a plugin imports only torchloom.api)."""
    code = next(b for b in blocks("python") if "@hookimpl" in b)
    head = next(b for b in blocks("python") if "from torchloom.api import" in b)
    imports = re.search(r"^from torchloom\.api import \(.*?\)$", head, re.S | re.M).group(0)
    return imports + "\n" + code


def test_the_page_plugin_imports_only_the_api():
    imported = re.findall(r"^(?:from|import) ([\w.]+)", plugin_code(), re.M)
    assert [m for m in imported if m.startswith("torchloom") and m != "torchloom.api"] == []


@pytest.fixture
def mulone(fake_site):
    fake_site.add("torchloom-mulone", version="0.1.0",
                  modules={"tl_docs_mulone": plugin_code()},
                  entry_points={"mulone": "tl_docs_mulone"})
    yield load_plugins(entry_points=fake_site.entry_points())
    sys.modules.pop("tl_docs_mulone", None)


def test_a_plugin_written_from_the_page_compiles_and_matches_eager(mulone):
    compiler = Compiler({"pipeline": {"name": "mulone", "codegen": "eager"},
                         "pass": [{"name": "mulone.fold"}, {"name": "dce"}]}, plugins=mulone)

    def program(x, n):
        return (x * 1.0).exp(), x * 1, n * 1.0, (n * 1).neg()

    torch._dynamo.reset()
    f = torch.compile(program, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    x, n = torch.randn(6), torch.arange(6)
    got, want = f(x, n), program(x, n)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    got[1].add_(1)  # the returned x * 1 is not x
    torch.testing.assert_close(x, want[1])
    [comp] = compiler.compilations
    assert comp.fallback_reason is None
    [record] = [r for r in comp.report.records if r.name == "mulone.fold"]
    assert record.stats == {"folded": 2}  # inside exp and neg; not the returned ones
    torch._dynamo.reset()


def test_every_method_the_page_names_exists():
    """The editing table and the prose name methods as ``graph.x(...)``, ``node.x(...)``,
    ``value.x(...)``: each is a method of that class (a renamed API fails here)."""
    from torchloom.api import Graph, Node, Value
    text = DOC.read_text()
    named = set(re.findall(r"`(graph|node|value)\.(\w+)\(", text))
    assert len(named) >= 15
    owners = {"graph": Graph, "node": Node, "value": Value}
    missing = [f"{o}.{m}" for o, m in sorted(named) if not hasattr(owners[o], m)]
    assert missing == []
