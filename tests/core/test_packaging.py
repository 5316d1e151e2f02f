"""Packaging: what each distribution declares matches what its code needs.

- the core's version is defined once (``torchloom.__version__``; pyproject reads it);
- every plugin declares the range of core versions it works with, and that range admits
  this core;
- every third-party module a distribution imports is declared (an AST scan of its
  package against its ``dependencies``), so a fresh environment never fails to load it;
- ``requires-python`` admits 3.10, which has no ``tomllib``: the core then uses ``tomli``;
- a codegen whose plugin failed to import is reported as "failed to load", with the error.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

import torchloom
from torchloom.cli import main
from torchloom.compiler import Compiler
from torchloom.plugins.loader import load_plugins

from test_plugins_support import fake_site  # noqa: F401 (fixture)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml"))
EXAMPLES = [ROOT / "examples" / "third_party_plugin", ROOT / "examples" / "third_party_codegen"]
PROJECTS = [ROOT, *PLUGINS, *EXAMPLES]
ERROR_HANDLERS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def pyproject(project: Path) -> dict:
    return tomllib.loads((project / "pyproject.toml").read_text())


def requirements(project: Path) -> list[Requirement]:
    return [Requirement(r) for r in pyproject(project)["project"].get("dependencies", [])]


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def ids(projects):
    return [str(p.relative_to(ROOT)) or "core" for p in projects]


def test_the_core_version_is_defined_once():
    meta = pyproject(ROOT)
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "torchloom.__version__"}
    assert md.version("torchloom") == torchloom.__version__


@pytest.mark.parametrize("project", [*PLUGINS, *EXAMPLES], ids=ids([*PLUGINS, *EXAMPLES]))
def test_plugins_require_a_range_of_core_versions_that_admits_this_core(project):
    [core] = [r for r in requirements(project) if normalized(r.name) == "torchloom"]
    assert core.specifier.contains(torchloom.__version__), core
    assert not core.specifier.contains("1000.0"), f"{core}: no upper bound"


def _imports(path: Path) -> set[str]:
    """Top-level modules ``path`` needs: absolute imports, except those in the body of a
    ``try`` that handles their ImportError (optional imports)."""
    tree = ast.parse(path.read_text())
    optional: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ERROR_HANDLERS or
                isinstance(h.type, ast.Tuple) and any(getattr(e, "id", None) in ERROR_HANDLERS
                                                      for e in h.type.elts)
                for h in node.handlers):
            optional.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("project", PROJECTS, ids=ids(PROJECTS))
def test_every_third_party_import_is_declared(project):
    meta = pyproject(project)
    where = [project / w for w in meta["tool"]["setuptools"]["packages"]["find"]["where"]]
    packages = [p for w in where for p in w.iterdir() if (p / "__init__.py").exists()]
    own = {p.name for p in packages}
    declared = {normalized(r.name) for r in requirements(project)}
    modules = {".".join(path.relative_to(package.parent).with_suffix("").parts): path
               for package in packages for path in sorted(package.rglob("*.py"))}
    # modules pytest loads (pytest11 entry points), and the package's modules they import,
    # run inside pytest: they may import pytest and what the extra named after the plugin
    # module declares (``torchloom.testing.perfgate`` -> ``torchloom[perfgate]``)
    extras = meta["project"].get("optional-dependencies", {})
    hosted: dict[str, set[str]] = {}
    for entry in meta["project"].get("entry-points", {}).get("pytest11", {}).values():
        plugin = entry.split(":")[0]
        allowed = {"pytest"} | {normalized(Requirement(r).name)
                                for r in extras.get(plugin.rsplit(".", 1)[-1], [])}
        for module in _reached(plugin, modules):
            hosted.setdefault(module, set()).update(allowed)
    providers = md.packages_distributions()
    missing = []
    for module, path in modules.items():
        for name in sorted(_imports(path) - own - set(sys.stdlib_module_names)):
            dists = {normalized(d) for d in providers.get(name, [name])}
            if dists & hosted.get(module, set()) or name in hosted.get(module, set()):
                continue
            if not dists & declared:
                    missing.append(f"{path.relative_to(ROOT)} imports {name} "
                                   f"({', '.join(sorted(dists))})")
    assert not missing, "undeclared: " + "; ".join(missing)


def _reached(start: str, modules: dict[str, Path]) -> set[str]:
    """``start`` and the modules of its own package (``torchloom.testing`` for
    ``torchloom.testing.perfgate``) that it imports, directly or not (an import anywhere in
    a file, top level or in a function). Modules of other packages it calls into (the
    compiler) are not hosted: they must work outside pytest."""
    package = start.rsplit(".", 1)[0] + "."
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module in seen or module not in modules or not module.startswith(package):
            continue
        seen.add(module)
        for node in ast.walk(ast.parse(modules[module].read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                todo += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
    return seen


def test_the_perf_gate_plugins_imports_are_hosted_by_pytest_and_its_extra():
    meta = pyproject(ROOT)
    modules = {".".join(p.relative_to(ROOT / "core").with_suffix("").parts): p
               for p in (ROOT / "core" / "torchloom").rglob("*.py")}
    reached = _reached("torchloom.testing.perfgate", modules)
    # the gate's modules are hosted; the compiler's are not (they must need only the core's
    # dependencies), though the kernel gate imports them
    assert {"torchloom.testing.perfgate", "torchloom.testing.kernelgate",
            "torchloom.testing.perfbaseline"} <= reached
    assert not {"torchloom.compiler", "torchloom.report", "torchloom.report.explain"} & reached
    assert {normalized(Requirement(r).name) for r in
            meta["project"]["optional-dependencies"]["perfgate"]} >= {"pytest",
                                                                       "pytest-benchmark"}


def test_tomli_stands_in_for_tomllib_on_the_pythons_that_lack_it():
    requires = SpecifierSet(pyproject(ROOT)["project"]["requires-python"])
    assert requires.contains("3.10")  # what we promise
    [tomli] = [r for r in requirements(ROOT) if normalized(r.name) == "tomli"]
    assert tomli.marker.evaluate({"python_version": "3.10"})
    assert not tomli.marker.evaluate({"python_version": "3.11"})
    script = textwrap.dedent("""
        import sys, tomllib
        sys.modules["tomli"] = tomllib  # the tomli distribution: the same parser
        sys.modules["tomllib"] = None   # as on Python 3.10
        from torchloom.passes.pipeline import read_pipeline
        raw = read_pipeline("default")
        print(raw.data["pipeline"]["name"])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["default"]


BROKEN_CODEGEN = "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n"


def test_a_codegen_whose_plugin_failed_to_import_says_failed_to_load(fake_site, tmp_path,
                                                                     monkeypatch, capsys):
    fake_site.add("torchloom-codegen-triton-broken", version="0.1.0",
                  modules={"tl_broken_triton": BROKEN_CODEGEN},
                  entry_points={"codegen_triton_broken": "tl_broken_triton"})
    pipeline = tmp_path / "triton.toml"
    pipeline.write_text('[pipeline]\nname = "t"\ncodegen = "triton"\n')
    plugins = load_plugins(entry_points=fake_site.entry_points())
    notes = Compiler(str(pipeline), plugins=plugins, cache_dir=tmp_path).notes
    assert any(n.startswith("codegen 'triton' failed to load: ModuleNotFoundError: No module "
                            "named 'numpy' (plugin 'codegen_triton_broken' from distribution "
                            "'torchloom-codegen-triton-broken')") for n in notes), notes
    assert not any("not installed" in n for n in notes)
    # without the broken plugin it is simply not installed
    clean = Compiler(str(pipeline), plugins=load_plugins(entry_points=[]), cache_dir=tmp_path)
    assert any(n.startswith("codegen 'triton' is not installed") for n in clean.notes)
    # `torchloom check` says the same (the installed Triton plugin disabled by distribution)
    monkeypatch.setenv("TORCHLOOM_DISABLE_PLUGINS", "torchloom-codegen-triton")
    assert main(["check", str(pipeline)]) == 0
    out = capsys.readouterr().out
    assert "note: codegen 'triton' failed to load: ModuleNotFoundError: No module named " \
           "'numpy'" in out
