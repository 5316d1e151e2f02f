"""Golden IR tests of the fusion passes: each ``fusion/*.ir`` file holds IR text, a
``// PIPELINE:`` line naming the passes to run (the verifier runs after each), and
FileCheck ``// CHECK`` lines matched against the printed result by the ``filecheck`` tool."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchloom.api import PassContext, load_plugins, parse_graph, print_graph, verify

CASES = sorted((Path(__file__).parent / "fusion").glob("*.ir"))


def _filecheck() -> list[str]:
    exe = shutil.which("filecheck") or str(Path(sys.executable).parent / "filecheck")
    return [exe]


def run_golden(path: Path, plugins) -> str:
    text = path.read_text()
    lines = text.splitlines()
    pipeline = next(ln.split(":", 1)[1] for ln in lines if ln.startswith("// PIPELINE:"))
    ir = "\n".join(ln for ln in lines if not ln.lstrip().startswith("//"))
    graph = parse_graph(ir, str(path))
    ctx = PassContext(registry=plugins.registry)
    for name in (n.strip() for n in pipeline.split(",")):
        plugins.passes[name].obj().run(graph, ctx)
        verify(graph, plugins.registry)
    return print_graph(graph)


@pytest.fixture(scope="module")
def plugins():
    return load_plugins()


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden(path, plugins):
    printed = run_golden(path, plugins)
    out = subprocess.run([*_filecheck(), str(path)], input=printed, text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 0, f"{path.name}:\n{printed}\n{out.stdout}{out.stderr}"


def test_golden_cases_exist():
    assert len(CASES) >= 6
