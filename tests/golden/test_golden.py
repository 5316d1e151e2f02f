"""Golden IR tests, as xDSL and MLIR write them: each ``tests/golden/<ns>/<pass>*.ir`` file
holds IR text and ``// RUN: torchloom opt %s --passes <pass> | filecheck %s`` with
``// CHECK`` lines matched against what the real ``torchloom opt`` prints (see
``golden_lit.py``). Every pass that is installed has at least one, named after it: pass
``ns.kebab-name`` -> ``tests/golden/<ns>/<snake_name>*.ir`` (the core's built-in passes:
``tests/golden/builtin/``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from golden_lit import run_file, run_lines, shell_command
from torchloom.plugins.loader import BUILTIN, load_plugins

HERE = Path(__file__).parent
CASES = sorted(HERE.glob("*/*.ir"))


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_golden(path):
    outcome = run_file(path)
    assert outcome.ok, outcome.report


def golden_stem(name: str, distribution: str) -> str:
    """Where a pass's golden files live: ``ns.kebab-name`` -> ``ns/snake_name``."""
    if distribution == BUILTIN:
        return f"builtin/{name.replace('-', '_')}"
    ns, _, rest = name.partition(".")
    return f"{ns}/{rest.replace('-', '_')}"


def test_every_installed_pass_has_a_golden_file_that_runs_it():
    plugins = load_plugins()
    missing, unused = [], []
    for name, reg in sorted(plugins.passes.items()):
        stem = golden_stem(name, reg.distribution)
        files = sorted(HERE.glob(f"{stem}*.ir"))
        if not files:
            missing.append(f"{name} -> tests/golden/{stem}*.ir")
        for f in files:  # the file named after a pass runs that pass
            if not any(re.search(rf"(^|[\s,=]){re.escape(name)}([\s,{{]|$)", line)
                       for line in run_lines(f)):
                unused.append(f"{f.relative_to(HERE)} does not run {name}")
    assert missing == [] and unused == []


def test_every_golden_file_is_named_after_a_pass():
    plugins = load_plugins()
    stems = [golden_stem(n, r.distribution) for n, r in plugins.passes.items()]
    strays = [str(p.relative_to(HERE)) for p in CASES
              if not any(str(p.relative_to(HERE)).startswith(s) for s in stems)]
    assert strays == []


@pytest.mark.parametrize("case, old, new", [
    # a CHECK stating what the pass does not do (cse keeps the second exp)
    ("builtin/cse.ir", "// CHECK-NOT:  %b = aten.exp.default",
     "// CHECK:      %b = aten.exp.default"),
    # a CHECK-NEXT that skips a line (dce keeps the dead sin)
    ("builtin/dce.ir", "// CHECK-NEXT:   %q = aten.cos.default(%p)",
     "// CHECK-NEXT:   %dead = aten.sin.default(%p)"),
    # a CHECK-NOT that the output violates (cse merges the random ops)
    ("builtin/cse.ir", "// CHECK-NEXT: %r2 = aten.rand_like.default(%x)\n// CHECK-NEXT: %r =",
     "// CHECK-NOT:  %r2 = aten.rand_like\n// CHECK:      %r ="),
])
def test_a_wrong_check_line_fails(case, old, new, tmp_path):
    """The runner is not vacuous: the same file with one CHECK line made false fails,
    and filecheck's report names that line."""
    text = (HERE / case).read_text()
    assert old in text
    path = tmp_path / Path(case).name
    path.write_text(text.replace(old, new, 1))
    line = text[:text.index(old)].count("\n") + 1
    outcome = run_file(path)
    assert not outcome.ok
    assert f"{path.name}:{line}: error" in outcome.report, outcome.report


def test_a_file_without_run_line_fails(tmp_path):
    path = tmp_path / "norun.ir"
    path.write_text("graph @g(%x: f32[4]) {\n  return %x\n}\n// CHECK: return\n")
    outcome = run_file(path)
    assert not outcome.ok and "no // RUN: line" in outcome.report


def test_not_expects_a_failure(tmp_path):
    """``not`` inverts the exit code: a RUN line whose torchloom succeeds fails under it."""
    path = tmp_path / "ok.ir"
    path.write_text("// RUN: not torchloom opt %s --passes dce 2>&1 | filecheck %s\n"
                    "graph @g(%x: f32[4]) {\n  return %x\n}\n// CHECK: return %x\n")
    outcome = run_file(path)
    assert not outcome.ok and "expected a failure" in outcome.report


@pytest.mark.slow
def test_run_lines_run_as_written_in_a_shell():
    """A RUN line is a shell command: run with the installed ``torchloom`` and ``filecheck``
    scripts (as lit would), it passes too."""
    path = HERE / "builtin" / "cse.ir"
    [line] = run_lines(path)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    run = subprocess.run(["sh", "-c", shell_command(line, path)], env=env, text=True,
                         capture_output=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_golden_example_of_the_cli_docs_passes(tmp_path):
    doc = (HERE.parents[1] / "docs" / "cli.md").read_text()
    [example] = [b for b in re.findall(r"^```\n(.*?)^```$", doc, re.S | re.M)
                 if b.startswith("// RUN:")]
    path = tmp_path / "cse_example.ir"
    path.write_text(example)
    outcome = run_file(path)
    assert outcome.ok, outcome.report
