"""The example plugin's pattern passes (``example.silu``, ``example.algebra``), installed
through their entry point as pip would: their golden files
(``examples/third_party_plugin/tests/golden/*.ir``, one per matching rule: repeated
names and commutativity, regions and shared subgraphs, scalar equality, parameters and
``check``) run through the real ``torchloom opt`` and FileCheck."""

from __future__ import annotations

import importlib.util
import json
import tomllib
from pathlib import Path

import pytest
import torch

from torchloom.cli import main

from test_plugins_support import FakeSite, fake_site  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "third_party_plugin"
GOLDEN = sorted((EXAMPLE / "tests" / "golden").glob("*.ir"))


def _golden_lit():
    spec = importlib.util.spec_from_file_location("golden_lit_for_examples",
                                                  ROOT / "tests" / "golden" / "golden_lit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def example(fake_site: FakeSite, monkeypatch):
    import sys
    before = set(sys.modules)
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    fake_site.add(project["name"], version=project["version"],
                  entry_points=project["entry-points"]["torchloom"])
    yield fake_site
    for name in set(sys.modules) - before:
        if name.startswith("torchloom_example"):
            del sys.modules[name]


def test_every_example_pattern_pass_has_golden_files():
    stems = {p.stem for p in GOLDEN}
    assert {"silu", "silu_regions", "algebra_scalars", "algebra_params"} <= stems


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_example_pattern_golden(example, path):
    outcome = _golden_lit().run_file(path)
    assert outcome.ok, outcome.report


def test_a_wrong_check_line_fails(example, tmp_path):
    """The runner is not vacuous: the silu file expecting the sigmoid of %x to stay fails."""
    text = (EXAMPLE / "tests" / "golden" / "silu.ir").read_text()
    old = "// CHECK-NEXT:   %silu = aten.silu.default(%x) : f32[4, 8]"
    assert old in text
    path = tmp_path / "silu.ir"
    path.write_text(text.replace(old, "// CHECK-NEXT:   %s = aten.sigmoid.default(%x)"))
    assert not _golden_lit().run_file(path).ok


def test_the_example_lists_its_pattern_passes_and_they_count_in_explain(example, tmp_path,
                                                                        capsys):
    assert main(["plugins", "--json"]) == 0
    passes = json.loads(capsys.readouterr().out)["passes"]
    assert passes["example.silu"]["distribution"] == "torchloom-example-pow"
    assert passes["example.algebra"]["distribution"] == "torchloom-example-pow"
    pipeline = tmp_path / "silu.toml"
    pipeline.write_text('[pipeline]\nname = "silu"\ncodegen = "eager"\n\n'
                        '[[pass]]\nname = "example.silu"\n\n[[pass]]\nname = "example.algebra"\n')
    workload = tmp_path / "silu_workload.py"
    workload.write_text("import torch\n\ndef workload():\n"
                        "    f = lambda x, y: ((x * torch.sigmoid(x)).exp() + (y + y)) ** 0.5\n"
                        "    return f, [torch.randn(4, 8), torch.rand(4, 8)]\n")
    assert main(["explain", str(workload), "--pipeline", str(pipeline), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    stats = {p["name"]: p["stats"] for p in data["passes"]}
    assert stats["example.silu"] == {"rewritten": 1}
    assert stats["example.algebra"]["rewritten.double"] == 1
    assert stats["example.algebra"]["rewritten.sqrt"] == 1
    assert data["max_abs_error"] < 1e-5


def test_the_cache_identity_follows_the_traced_patterns(example):
    from torchloom_example.algebra import Algebra
    from torchloom_example.silu import Silu

    from torchloom.api import pattern_pass
    renamed = pattern_pass("example.silu", lambda y: y * torch.sigmoid(y),
                           lambda y: torch.nn.functional.silu(y), [torch.randn(8)])
    other = pattern_pass("example.silu", lambda y: y * torch.tanh(y),
                         lambda y: torch.nn.functional.silu(y), [torch.randn(8)])
    ids = [cls().identity()["patterns"] for cls in (Silu, renamed, other, Algebra)]
    # the traced rules in canonical form: argument names do not count, ops do
    assert ids[0] == ids[1] != ids[2] and len(ids[3]) == 3
    # and the source hash is the plugin package's (the class is defined in its module)
    assert Silu.__module__ == "torchloom_example.silu" and Silu().identity()["source"]


def test_the_documented_rules_run_as_written():
    """docs/writing-a-plugin.md's first two blocks (the pass in two functions, then several
    rules in one pass), run in order as one script."""
    import re
    text = (ROOT / "docs" / "writing-a-plugin.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)
    namespace: dict = {}
    exec(compile(blocks[0] + blocks[1], "writing-a-plugin.md", "exec"), namespace)
    assert namespace["PowToMul"].name == "square.pow-to-mul"
    assert [r.name for r in namespace["Algebra"].rules()] == ["double", "mean"]
