"""Third-party plugins: the example in examples/third_party_plugin/ and the one-file plugin
of docs/writing-a-plugin.md are found through their entry points (a .dist-info written
from their own pyproject.toml, as pip would), listed by ``torchloom plugins``, and run
from a TOML pipeline with results checked against eager."""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from torchloom.cli import main
from torchloom.compiler import Compiler
from torchloom.testing.golden import golden

from test_plugins_support import FakeSite, fake_site  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "third_party_plugin"
DOC = ROOT / "docs" / "writing-a-plugin.md"

WORKLOAD = """
import torch

def workload():
    return (lambda x, y: (x ** 2 + y).exp() * y ** 2), [torch.randn(4, 8), torch.randn(4, 8)]
"""


def install(site: FakeSite, pyproject: dict) -> None:
    """Write the .dist-info pip would write for ``pyproject`` (METADATA + entry points)."""
    project = pyproject["project"]
    site.add(project["name"], version=project["version"],
             entry_points=project["entry-points"]["torchloom"])


@pytest.fixture
def site(fake_site):
    """A fake site dir on sys.path; the plugin packages imported from it are forgotten."""
    before = set(sys.modules)
    yield fake_site
    for name in set(sys.modules) - before:
        if name.startswith(("torchloom_example", "torchloom_square")):
            del sys.modules[name]


@pytest.fixture
def example(site, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    install(site, tomllib.loads((EXAMPLE / "pyproject.toml").read_text()))
    return site


def test_the_example_is_listed_by_torchloom_plugins(example, capsys):
    assert main(["plugins", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"name": "example", "distribution": "torchloom-example-pow",
            "version": "0.1.0"} in data["plugins"]
    assert data["passes"]["example.pow-to-mul"]["distribution"] == "torchloom-example-pow"
    assert not [e for e in data["errors"] if e["entry_point"] == "example"]


def test_the_example_pass_golden_including_regions(example):
    from torchloom_example.pow_to_mul import PowToMul
    x = torch.randn(4, 8)
    result = golden(PowToMul(), """
        graph @g(%x: f32[4, 8]) {
          %p = aten.pow.Tensor_Scalar(%x) {exponent = 2} : f32[4, 8]
          %c = aten.pow.Tensor_Scalar(%x) {exponent = 3} : f32[4, 8]
          %e = torchloom.fusion_group(%p) : f32[4, 8] region @group0(%a: f32[4, 8]) {
            %q = aten.pow.Tensor_Scalar(%a) {exponent = 2.0} : f32[4, 8]
            %e = aten.exp.default(%q) : f32[4, 8]
            return %e
          }
          return %e, %c
        }
    """, """
        graph @g(%x: f32[4, 8]) {
          %mul = aten.mul.Tensor(%x, %x) : f32[4, 8]
          %c = aten.pow.Tensor_Scalar(%x) {exponent = 3} : f32[4, 8]
          %e = torchloom.fusion_group(%mul) : f32[4, 8] region @group0(%a: f32[4, 8]) {
            %mul = aten.mul.Tensor(%a, %a) : f32[4, 8]
            %e = aten.exp.default(%mul) : f32[4, 8]
            return %e
          }
          return %e, %c
        }
    """, [x])
    assert result.stats == {"rewritten": 2}


def test_the_example_runs_from_a_toml_pipeline_and_matches_eager(example, tmp_path, capsys):
    pipeline = tmp_path / "pow.toml"
    pipeline.write_text('[pipeline]\nname = "pow"\ncodegen = "eager"\n\n'
                        '[[pass]]\nname = "example.pow-to-mul"\n\n[[pass]]\nname = "dce"\n')
    workload = tmp_path / "pow_workload.py"
    workload.write_text(WORKLOAD)
    assert main(["explain", str(workload), "--pipeline", str(pipeline), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    [record] = [p for p in data["passes"] if p["name"] == "example.pow-to-mul"]
    assert record["changed"] and record["stats"] == {"rewritten": 2}
    assert data["max_abs_error"] < 1e-6
    # and under torch.compile with the pipeline file, compared with eager
    compiler = Compiler(str(pipeline))
    from torchloom.backend import torchloom_backend
    fn = lambda x, y: (x ** 2 + y).exp() * y ** 2  # noqa: E731
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    torch.testing.assert_close(compiled(x, y), fn(x, y))
    torch._dynamo.reset()
    ops = [n.op for c in compiler.compilations for n in c.graph.walk()]
    assert "aten.pow.Tensor_Scalar" not in ops and ops.count("aten.mul.Tensor") >= 3
    # the user's spelling: the backend by name, the pipeline by path
    public = torch.compile(fn, backend="torchloom", options={"pipeline": str(pipeline)})
    torch.testing.assert_close(public(x, y), fn(x, y))
    torch._dynamo.reset()


def doc_blocks(lang: str, doc: Path = DOC) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", doc.read_text(), re.S | re.M)


INT_WORKLOAD = """
import torch

def workload():
    # x ** 2.0 of an integer tensor is a float tensor (x * x would stay integer): the
    # documented pass must leave it; y ** 2 of an integer tensor stays integer: rewritten
    return (lambda x, y: x ** 2.0 + y ** 2), [torch.arange(-4, 4), torch.arange(8)]
"""


@pytest.mark.parametrize("doc", [DOC, ROOT / "README.md"], ids=lambda p: p.name)
def test_the_documented_one_file_plugin_works_as_written(doc, site, tmp_path, capsys):
    code = next(b for b in doc_blocks("python", doc) if "@hookimpl" in b)
    assert len(code.splitlines()) < 40
    pyproject = next(b for b in doc_blocks("toml", doc) if "[project]" in b)
    # the document's pipeline, or (the README shows none) the one of writing-a-plugin.md
    pipeline_text = next(b for b in doc_blocks("toml", doc) + doc_blocks("toml")
                         if 'name = "square.pow-to-mul"' in b)
    meta = tomllib.loads(pyproject)
    [(ep_name, module)] = meta["project"]["entry-points"]["torchloom"].items()
    (site.root / module).mkdir()
    (site.root / module / "__init__.py").write_text(code)
    install(site, meta)
    assert main(["plugins"]) == 0
    assert "square.pow-to-mul" in capsys.readouterr().out
    pipeline = tmp_path / "squares.toml"
    pipeline.write_text(pipeline_text)
    assert main(["check", str(pipeline)]) == 0
    capsys.readouterr()
    for text, rewritten in [(WORKLOAD, 2), (INT_WORKLOAD, 1)]:
        workload = tmp_path / "square_workload.py"
        workload.write_text(text)
        assert main(["explain", str(workload), "--pipeline", str(pipeline), "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        [record] = [p for p in data["passes"] if p["name"] == "square.pow-to-mul"]
        assert record["stats"] == {"rewritten": rewritten} and "skipped" not in record
        assert data["fallbacks"] == [] and data["max_abs_error"] < 1e-6
