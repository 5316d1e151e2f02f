"""Golden IR tests: each ``tests/golden/<area>/*.ir`` file holds IR text, a ``// PIPELINE:``
line naming the passes to run (``name`` or ``name key=value ...`` for integer options;
passes separated by ``,``; the verifier runs after each) and FileCheck ``// CHECK`` lines
matched against the printed result by the ``filecheck`` tool."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchloom.api import PassContext, load_plugins, parse_graph, print_graph, verify

HERE = Path(__file__).parent
CASES = sorted(HERE.glob("*/*.ir"))


def run_golden(path: Path, plugins) -> str:
    lines = path.read_text().splitlines()
    pipeline = next(ln.split(":", 1)[1] for ln in lines if ln.startswith("// PIPELINE:"))
    graph = parse_graph("\n".join(ln for ln in lines if not ln.lstrip().startswith("//")),
                        str(path))
    ctx = PassContext(registry=plugins.registry)
    for entry in pipeline.split(","):
        name, *options = entry.split()
        kwargs = {k: int(v) for k, v in (o.split("=") for o in options)}
        plugins.passes[name].obj(**kwargs).run(graph, ctx)
        verify(graph, plugins.registry)
    return print_graph(graph)


@pytest.fixture(scope="module")
def plugins():
    return load_plugins()


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_golden(path, plugins):
    printed = run_golden(path, plugins)
    exe = shutil.which("filecheck") or str(Path(sys.executable).parent / "filecheck")
    out = subprocess.run([exe, str(path)], input=printed, text=True, capture_output=True,
                         timeout=60)
    assert out.returncode == 0, f"{path.name}:\n{printed}\n{out.stdout}{out.stderr}"


@pytest.mark.parametrize("area, at_least", [("fusion", 6), ("dedup", 2)])
def test_golden_cases_exist(area, at_least):
    assert len(list((HERE / area).glob("*.ir"))) >= at_least
