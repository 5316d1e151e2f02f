"""The layering rule of DESIGN.md, checked from the sources: core imports point down the
layers (face → compiler/backend → passes, plugins, frontend → runtime → codegen → ops → ir),
plugins import only ``torchloom.api`` of the core and no other plugin, and nothing outside
``core/torchloom/ir`` touches a private attribute that ``ir/`` defines on its objects."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core" / "torchloom"

#: layer of each first component under core/torchloom (a package or a top-level module)
LAYERS = {
    "ir": 0, "errors": 0, "environment": 0,
    "ops": 1,
    "codegen": 2,
    "runtime": 3,
    "passes": 4, "pipelines": 4,
    "plugins": 5, "frontend": 5,
    # the compiler (with its mode, log and reproducers) and the torch.compile backend
    "compiler": 6, "backend": 6,
    # the face: the commands, the reports, workloads, the plugin author's surface and the
    # test tools
    "api": 7, "cli": 7, "report": 7, "workloads": 7, "progress": 7, "testing": 7,
    "tools": 7, "__main__": 7, "__init__": 7,
}


def core_modules() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


def plugin_modules() -> list[Path]:
    return sorted((ROOT / "plugins").glob("*/src/**/*.py"))


def layer_part(path: Path) -> str:
    """The component of ``path`` (under core/torchloom) that names its layer."""
    return path.relative_to(CORE).parts[0].removesuffix(".py")


def imported_modules(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in ``tree``, relative ones resolved against
    ``package``; ``from torchloom import name`` counts as ``torchloom.name``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            if base == "torchloom":
                found += [(node.lineno, f"torchloom.{a.name}") for a in node.names
                          if not (a.name.startswith("__") and a.name.endswith("__"))]
            else:
                found.append((node.lineno, base))
    return found


def upward_imports(part: str, tree: ast.AST, package: str) -> list[str]:
    """Imports in a module of layer ``part`` that name a core module of a higher layer."""
    breaches = []
    for line, module in imported_modules(tree, package):
        bits = module.split(".")
        if bits[0] == "torchloom" and len(bits) > 1 and bits[1] in LAYERS \
                and LAYERS[bits[1]] > LAYERS[part]:
            breaches.append(f"{line}: {part} imports {module}")
    return breaches


def ir_private_names() -> set[str]:
    """Private attributes and methods ir/ defines on its objects: ``self._x`` it uses,
    ``_x`` in its ``__slots__``, and ``_x`` methods of its classes."""
    names = set()
    for path in (CORE / "ir").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "self" and node.attr.startswith("_") \
                    and not node.attr.startswith("__"):
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                            and item.name.startswith("_") and not item.name.startswith("__"):
                        names.add(item.name)
                    if isinstance(item, ast.Assign) and any(
                            isinstance(t, ast.Name) and t.id == "__slots__" for t in item.targets):
                        names |= {c.value for c in ast.walk(item.value)
                                  if isinstance(c, ast.Constant) and isinstance(c.value, str)
                                  and c.value.startswith("_")}
    return names


def private_uses(tree: ast.AST, private: set[str]) -> list[str]:
    """Uses of ``private`` attributes on anything but ``self``/``cls``, directly or through
    getattr/setattr/hasattr/delattr with a constant name."""
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in private and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            uses.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and node.args[1].value in private:
            uses.append(f"{node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return uses


def package_of(path: Path) -> str:
    """Dotted package of a core module (for resolving its relative imports)."""
    return ".".join(path.relative_to(CORE.parent).parent.parts)


def test_every_core_module_has_a_layer():
    unplaced = sorted({layer_part(p) for p in core_modules()} - set(LAYERS))
    assert not unplaced, f"add these to LAYERS (per DESIGN.md's layout): {unplaced}"


def test_core_imports_point_down():
    breaches = [f"{p.relative_to(ROOT)}:{b}" for p in core_modules() if layer_part(p) in LAYERS
                for b in upward_imports(layer_part(p), ast.parse(p.read_text()), package_of(p))]
    assert not breaches, "imports that run up the layers:\n" + "\n".join(breaches)


def private_imports(tree: ast.AST, package: str) -> list[str]:
    """``from torchloom.x import _name`` in ``tree``: a private name taken across modules."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = dict(imported_modules(ast.Module([node], []), package)).get(node.lineno, "")
            found += [f"{node.lineno}: {base}.{a.name}" for a in node.names
                      if base.startswith("torchloom") and a.name.startswith("_")
                      and not a.name.startswith("__")]
    return found


def test_the_top_level_shows_folders_and_no_private_name_crosses_modules():
    top = sorted(p.stem for p in CORE.glob("*.py") if not p.stem.startswith("__"))
    # the two faces (api for plugins, backend for torch.compile), what every layer reads,
    # and the face's small shared parts; the rest are packages (issue 45: were 22 modules)
    assert top == ["api", "backend", "environment", "errors", "progress", "tools", "workloads"]
    crossing = [f"{p.relative_to(ROOT)}:{b}" for p in core_modules()
                for b in private_imports(ast.parse(p.read_text()), package_of(p))]
    assert not crossing, "private names imported from another module:\n" + "\n".join(crossing)


@pytest.mark.parametrize("source, expected", [
    ("from torchloom.ops.registry import OpDef, _device_of", ["1: torchloom.ops.registry._device_of"]),
    ("from .registry import _x as y", ["1: torchloom.ops.registry._x"]),
    ("from torchloom.ops.registry import __all__, device_of", []),
])
def test_private_imports_found(source, expected):
    assert private_imports(ast.parse(source), "torchloom.ops") == expected


def test_plugins_import_only_the_api_and_themselves():
    breaches = []
    for path in plugin_modules():
        own = path.relative_to(ROOT / "plugins").parts[2]  # plugins/<dir>/src/<package>/
        for line, module in imported_modules(ast.parse(path.read_text()), own):
            top = module.split(".")[0]
            if top == "torchloom" and module != "torchloom.api" \
                    and not module.startswith("torchloom.api."):
                breaches.append(f"{path.relative_to(ROOT)}:{line}: imports {module}")
            elif top.startswith("torchloom_") and top != own:
                breaches.append(f"{path.relative_to(ROOT)}:{line}: imports plugin {module}")
    assert not breaches, "\n".join(breaches)


def test_no_private_ir_attribute_outside_ir():
    private = ir_private_names()
    assert {"_link", "_unlink", "_len", "_names", "_counter", "_positions_valid"} <= private
    uses = [f"{p.relative_to(ROOT)}:{u}" for p in core_modules() + plugin_modules()
            if not p.is_relative_to(CORE / "ir")
            for u in private_uses(ast.parse(p.read_text()), private)]
    assert not uses, "private IR attributes used outside core/torchloom/ir:\n" + "\n".join(uses)


#: the IR's lists that only ``ir/`` edits (its edit API keeps use lists consistent)
IR_LISTS = ("inputs", "uses", "outputs")
_LIST_METHODS = ("append", "remove", "insert", "pop", "extend", "clear", "sort", "reverse")
#: a module handles IR objects when it imports Node, Value or Graph from torchloom
_HANDLES_IR = re.compile(r"^from torchloom(\.\w+)* import (\([^)]*|[^\n]*)\b(Node|Value|Graph)\b",
                         re.M)


def ir_list_edits(tree: ast.AST) -> list[str]:
    """Statements that assign, delete from or mutate an ``inputs``, ``uses`` or
    ``outputs`` list of anything but ``self``/``cls``."""
    def ir_list(e: ast.AST) -> str | None:
        while isinstance(e, (ast.Subscript, ast.Starred)):
            e = e.value
        if isinstance(e, ast.Attribute) and e.attr in IR_LISTS and not (
                isinstance(e.value, ast.Name) and e.value.id in ("self", "cls")):
            return e.attr
        return None

    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for el in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                if (name := ir_list(el)) is not None:
                    found.append(f"{node.lineno}: assigns .{name}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _LIST_METHODS and ir_list(node.func.value) is not None \
                and not isinstance(node.func.value, ast.Subscript):
            found.append(f"{node.lineno}: .{node.func.value.attr}.{node.func.attr}()")
    return found


def test_no_ir_list_edit_outside_ir():
    """Passes edit ``inputs``, ``uses`` and ``outputs`` through the IR's edit API
    (``Graph``'s methods, ``torchloom.ir.regions``), never by hand."""
    edits = [f"{p.relative_to(ROOT)}:{e}" for p in core_modules() + plugin_modules()
             if not p.is_relative_to(CORE / "ir") and _HANDLES_IR.search(p.read_text())
             for e in ir_list_edits(ast.parse(p.read_text()))]
    assert not edits, "IR lists edited outside core/torchloom/ir:\n" + "\n".join(edits)


def plugin_pass_names() -> set[str]:
    """``name`` of every pass class (a class with a ``run`` method, its base ``Pass`` or
    another pass base such as fusion's ``GroupLimits``) and runtime wrapper (a class with a
    ``wrap`` method) in the plugins."""
    names = set()
    for path in plugin_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(item, ast.FunctionDef) and item.name in ("run", "wrap")
                    for item in node.body):
                names |= {item.value.value for item in node.body
                          if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                          and item.target.id == "name" and isinstance(item.value, ast.Constant)}
    return names


def strings_naming(tree: ast.AST, names: set[str]) -> list[str]:
    """String constants in code (docstrings and comments aside) that name one of
    ``names`` as a whole word."""
    docs = {id(n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    pattern = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, sorted(names))) + r")(?![\w.-])")
    return [f"{n.lineno}: {m.group(1)!r}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            for m in [pattern.search(n.value)] if m]


def test_no_core_module_names_a_plugins_pass():
    """A core module that needs something from a pass or a runtime wrapper asks for it
    through the API (``PassResult.deduplication``, a wrapper's ``modes``); pipeline files
    (data) may name any pass."""
    names = plugin_pass_names()
    assert {"dedup.regions", "fusion.vertical", "views.strip-bookends", "cudagraphs"} <= names
    found = [f"{p.relative_to(ROOT)}:{u}" for p in core_modules()
             for u in strings_naming(ast.parse(p.read_text()), names)]
    assert not found, "core modules naming a plugin's pass:\n" + "\n".join(found)


# ---- the scanners themselves catch what they are for ----------------------------------

@pytest.mark.parametrize("source, expected", [
    ("v.uses[:] = [u for u in v.uses if u.graph is g]", 1),
    ("user.inputs = [new if x is old else x for x in user.inputs]", 1),
    ("group.outputs.append(new)", 1),
    ("del outer.inputs[i], inner.inputs[i]", 2),
    ("a.uses, b.outputs = [], []", 2),
    ("group.region.inputs.pop(i)", 1),
    ("self.inputs = []\nself.uses.append(x)", 0),
    ("xs = [v for v in node.inputs]\nnode.inputs[0].uses.count(n)", 0),
])
def test_ir_list_edits_found(source, expected):
    assert len(ir_list_edits(ast.parse(source))) == expected


@pytest.mark.parametrize("part, source, expected", [
    ("runtime", "from torchloom.passes.manager import RunReport", 1),
    ("codegen", "def f():\n    from torchloom.runtime.executor import build_function", 1),
    ("frontend", "import torchloom.compiler", 1),
    ("passes", "from torchloom import compiler", 1),
    ("passes", "from ..plugins.loader import load_plugins", 1),
    ("runtime", "from torchloom.codegen.plan import build_function", 0),
    ("passes", "from torchloom import __version__", 0),
    ("compiler", "from torchloom.passes.manager import PassManager", 0),
])
def test_upward_imports_found(part, source, expected):
    assert len(upward_imports(part, ast.parse(source), f"torchloom.{part}")) == expected


@pytest.mark.parametrize("source, expected", [
    ("def f(g):\n    return g._names", 1),
    ("def f(g):\n    g._counter += 1", 1),
    ("def f(n):\n    return getattr(n, '_len')", 1),
    ("class C:\n    def f(self):\n        return self._names", 0),
    ("def f(g):\n    return g.names", 0),
])
def test_private_uses_found(source, expected):
    assert len(private_uses(ast.parse(source), ir_private_names())) == expected


def test_relative_imports_resolve_against_the_package():
    tree = ast.parse("from . import lowering\nfrom ..ir.graph import Graph")
    assert [m for _, m in imported_modules(tree, "torchloom.codegen")] == [
        "torchloom.codegen", "torchloom.ir.graph"]
    assert package_of(CORE / "codegen" / "plan.py") == "torchloom.codegen"
    assert package_of(CORE / "codegen" / "__init__.py") == "torchloom.codegen"


@pytest.mark.parametrize("source, expected", [
    ('at = [r for r in records if r.name == "dedup.regions"]', 1),
    ('msg = f"after fusion.vertical ran {n} times"', 1),
    ('def f():\n    """Runs after ``dedup.regions``."""\n    # dedup.regions\n    return 1', 0),
    ('name = "dedup.regions-extra"', 0),
    ('name = "mydedup.regions"', 0),
])
def test_strings_naming_found(source, expected):
    assert len(strings_naming(ast.parse(source), {"dedup.regions", "fusion.vertical"})) == expected
