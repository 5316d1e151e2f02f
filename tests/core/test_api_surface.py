"""``torchloom.api`` is the plugin author's surface only: the IR, the op registry, the
pass API, ``hookimpl``, the codegen protocol, errors (and the environment helpers plugins
use). Importing it loads no compiler, runtime, explain or report module; the tools built
on the compiler are in ``torchloom.tools``. Every name it exports is used by a plugin (or
its tests) or an example, or documented."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import torchloom.api as api
import torchloom.tools as tools

ROOT = Path(__file__).resolve().parents[2]
#: modules the plugin author's surface must not pull in
HEAVY = ("torchloom.compiler", "torchloom.runtime", "torchloom.report", "torchloom.cli",
         "torchloom.workloads", "torchloom.backend", "torchloom.tools", "torchloom.plugins.loader")


def modules_loaded_by(statement: str) -> list[str]:
    """``sys.modules`` (torchloom's) after ``statement`` in a fresh interpreter."""
    code = (f"import sys, json\n{statement}\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.startswith('torchloom'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def test_importing_the_api_loads_no_compiler_runtime_explain_or_report_module():
    loaded = modules_loaded_by("import torchloom.api")
    assert "torchloom.api" in loaded and "torchloom.ir.graph" in loaded
    assert heavy(loaded) == []


def test_the_check_sees_what_the_tools_load():
    assert {"torchloom.compiler", "torchloom.report"} <= set(heavy(modules_loaded_by(
        "import torchloom.tools")))


def test_every_exported_name_exists():
    assert len(set(api.__all__)) == len(api.__all__)
    assert [n for n in api.__all__ if not hasattr(api, n)] == []
    assert [n for n in tools.__all__ if not hasattr(tools, n)] == []
    assert not set(api.__all__) & set(tools.__all__)


def names_used_through_the_api(path: Path) -> set[str]:
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "torchloom.api":
            used |= {a.name for a in node.names}
        elif isinstance(node, ast.Attribute) and ast.unparse(node.value) in ("api",
                                                                            "torchloom.api"):
            used.add(node.attr)
    return used


def test_every_exported_name_is_used_by_a_plugin_or_an_example_or_documented():
    # a plugin's tests count: parsing IR text is how they build graphs
    sources = [*ROOT.glob("plugins/*/src/**/*.py"), *ROOT.glob("examples/**/*.py"),
               *(p for p in ROOT.glob("tests/*/**/*.py") if "core" not in p.parts)]
    used = set().union(*(names_used_through_the_api(p) for p in sources))
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *ROOT.glob("docs/*.md")])
    unused = [n for n in api.__all__ if n not in used and f"`{n}" not in docs
              and f"{n}(" not in docs and f" {n}," not in docs]
    assert unused == [], f"exported by torchloom.api, used by nothing: {unused}"


@pytest.mark.parametrize("name", ["Compiler", "load_plugins", "build_function", "KernelCache",
                                  "count_kernels", "import_workload", "EagerCodegen"])
def test_tools_are_not_part_of_the_plugin_surface(name):
    assert not hasattr(api, name) and hasattr(tools, name)
