"""The cpu codegen's modules, read as source (issue 42): no import cycle among them (the
helpers name nest.py's ``Writer``, never kernel.py), no function assigns a field of an
object it was handed (helpers return frozen plans and results; the writer keeps them in
its own methods), every attribute a class sets is declared in its ``__init__`` (or a
base's), no ``getattr(self, ...)`` stands in for a missing one, and the writer has all
that ``Writer`` names."""

from __future__ import annotations

import ast
import pathlib

import torchloom.codegen.placement
import torchloom.codegen.schedule
import torchloom.codegen.statements
import torchloom.codegen.nest_writer
import torchloom.codegen.walk_nest
import torchloom.codegen.writer
import torchloom_codegen_cpu

PACKAGE = pathlib.Path(torchloom_codegen_cpu.__file__).parent
MODULES = {f.stem: ast.parse(f.read_text()) for f in sorted(PACKAGE.glob("*.py"))}
#: calls that change a container in place
MUTATORS = {"append", "add", "update", "pop", "clear", "extend", "setdefault", "discard",
            "remove", "insert", "popitem"}


def _imports(tree: ast.Module) -> set[str]:
    """The package's modules ``tree`` imports (anywhere: under TYPE_CHECKING too)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == PACKAGE.name:
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                PACKAGE.name + "."):
            found.add(node.module.split(".")[1])
    return found & set(MODULES)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each elementary cycle once, from its smallest module."""
    found = []
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    found.append(path)
                elif nxt > start and nxt not in path:
                    stack.append((nxt, path + [nxt]))
    return found


def test_no_import_cycle_among_the_modules():
    graph = {name: _imports(tree) - {name} for name, tree in MODULES.items()}
    assert _cycles(graph) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]  # (the finder)


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return [e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return node.targets if isinstance(node, ast.Delete) else []


def _foreign(target: ast.expr) -> bool:
    """Whether ``target`` is a field (or an item of a field) of an object other than
    ``self``: ``w.rows``, ``w.reduced[v]``, ``self.em.overrun``."""
    t = target.value if isinstance(target, ast.Subscript) else target
    return isinstance(t, ast.Attribute) and not (
        isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"))


def test_no_function_assigns_fields_of_another_object():
    found = []
    for name, tree in MODULES.items():
        for node in ast.walk(tree):
            found += [f"{name}:{node.lineno}: {ast.unparse(t)}"
                      for t in _targets(node) if _foreign(t)]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in MUTATORS and _foreign(node.func.value):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def _self_fields(function: ast.FunctionDef) -> dict[str, int]:
    return {t.attr: n.lineno for n in ast.walk(function) for t in _targets(n)
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
            and t.value.id == "self"}


def test_every_attribute_is_declared_in_init():
    trees = [*MODULES.values(), *(ast.parse(pathlib.Path(m.__file__).read_text()) for m in
                                  (torchloom.codegen.writer, torchloom.codegen.statements,
                                   torchloom.codegen.schedule, torchloom.codegen.placement,
                                   torchloom.codegen.walk_nest, torchloom.codegen.nest_writer))]
    classes = {c.name: c for tree in trees for c in ast.walk(tree)
               if isinstance(c, ast.ClassDef)}

    def declared(name: str) -> set[str]:
        c = classes.get(name)
        if c is None:
            return set()
        own = {a for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"
               for a in _self_fields(f)}
        bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                 for b in c.bases]
        return own.union(*(declared(b) for b in bases))

    born, defaults = [], []
    for name, tree in MODULES.items():
        for c in (c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)):
            known = declared(c.name)
            for f in (f for f in c.body if isinstance(f, ast.FunctionDef)):
                born += [f"{name}:{line}: {c.name}.{a} in {f.name}()"
                         for a, line in _self_fields(f).items() if a not in known]
        defaults += [f"{name}:{n.lineno}: {ast.unparse(n)}" for n in ast.walk(tree)
                     if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                     and n.func.id in ("getattr", "hasattr") and n.args
                     and isinstance(n.args[0], ast.Name) and n.args[0].id == "self"]
    assert born == [] and defaults == []
    # what helpers are told they may read of the writer (nest.Writer), the writer has
    (protocol,) = [c for c in MODULES["nest"].body
                   if isinstance(c, ast.ClassDef) and c.name == "Writer"]
    promised = {n.target.id if isinstance(n, ast.AnnAssign) else n.name
                for n in protocol.body if isinstance(n, (ast.AnnAssign, ast.FunctionDef))}
    # (the core's mixins: the value walk with its output placement, the nest plan's fields
    # as properties, a nest's loops and coordinates, the nest writer's reads and stores)
    methods = {f.name for name in ("KernelWriter", "ValueWalk", "OutputPlacement", "PlannedNest",
                                   "WalkNest", "NestWriter")
               for f in classes[name].body if isinstance(f, ast.FunctionDef)}
    assert promised - declared("KernelWriter") - methods == set()
