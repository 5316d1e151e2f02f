"""No import cycles: inside the core, and inside each plugin, no module imports (at run time,
at module level or inside a function) a module that imports it back, directly or through
others. Imports under ``if TYPE_CHECKING:`` run no code and do not count. A cycle is found
from the sources as a strongly connected component of the module import graph."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_layers import CORE, ROOT

PLUGIN_PACKAGES = sorted(p for p in (ROOT / "plugins").glob("*/src/torchloom_*") if p.is_dir())


def module_name(path: Path, source_root: Path) -> str:
    parts = list(path.relative_to(source_root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (never run)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def runtime_imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` imports when it runs: ``from a import b``
    names ``a.b`` when that is a module, else ``a``."""
    package = module if is_package else module.rpartition(".")[0]
    skipped = type_checking_nodes(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for a in node.names:
                if f"{base}.{a.name}" in known:
                    found.add(f"{base}.{a.name}")
                elif base in known:
                    found.add(base)
    return found - {module}


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports at run time."""
    paths = {module_name(p, package_dir.parent): p for p in package_dir.rglob("*.py")}
    known = set(paths)
    return {m: runtime_imports(ast.parse(p.read_text()), m, p.name == "__init__.py", known)
            for m, p in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    return "\n".join(f"  {m} imports {', '.join(sorted(graph[m] & members))}" for m in component)


@pytest.mark.parametrize("package_dir", [CORE, *PLUGIN_PACKAGES],
                         ids=lambda p: p.name)
def test_no_import_cycle(package_dir):
    graph = import_graph(package_dir)
    assert len(graph) > 1
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n\n".join(describe(graph, c) for c in found)


def test_every_plugin_package_is_checked():
    assert {p.name for p in PLUGIN_PACKAGES} >= {
        "torchloom_fusion", "torchloom_views", "torchloom_dedup", "torchloom_codegen_triton",
        "torchloom_codegen_cpu", "torchloom_cudagraphs"}


# ---- the scanner itself finds what it is for ------------------------------------------

def write_package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "pkg"
    for name, source in {"__init__.py": "", **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return package


@pytest.mark.parametrize("files, expected", [
    # a lazy import inside a function is still a cycle (graph.py <-> text.py was one)
    ({"a.py": "from pkg.b import f\n", "b.py": "def f():\n    from pkg.a import g\n"},
     [["pkg.a", "pkg.b"]]),
    # three modules in a ring, one of them through a relative import
    ({"a.py": "from . import b\n", "b.py": "import pkg.c\n", "c.py": "from pkg.a import x\n"},
     [["pkg.a", "pkg.b", "pkg.c"]]),
    # under TYPE_CHECKING: only annotations, no cycle
    ({"a.py": "from pkg.b import f\n",
      "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"},
     []),
    # a chain that points one way
    ({"a.py": "from pkg.b import f\n", "b.py": "from pkg.sub.c import g\n",
      "sub/__init__.py": "", "sub/c.py": "import os\n"},
     []),
])
def test_cycles_found(tmp_path, files, expected):
    assert cycles(import_graph(write_package(tmp_path, files))) == expected
