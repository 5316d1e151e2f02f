"""IR text is data: parsing and verifying it, replaying a reproducer and loading a kernel-
or compile-cache entry never import or call Python that the text names. A ``python.*``
op is known only when the frontend (for the FX graph it imports) or a plugin registers
it; an unknown one is an error naming it, and a cache entry that holds one is damaged.

Every test plants a module that leaves a file behind when it is imported or called, and
checks that neither file appears."""

from __future__ import annotations

import hashlib
import json
import logging
import operator
import uuid
from pathlib import Path

import pytest
import torch
import torch.fx

from torchloom.api import parse_graph, verify
from torchloom.tools import EagerCodegen
from torchloom.cli import main
from torchloom.errors import UnsupportedError, VerifyError
from torchloom.frontend.fx import import_fx
from torchloom.ops.aten import default_registry
from torchloom.ops.registry import OpDef
from torchloom.runtime import graph_cache
from torchloom.runtime.cache import KernelCache, checksum
from torchloom.runtime.executor import build_function
from torchloom.runtime.graph_cache import GraphCache

from test_plugins_support import fake_site  # noqa: F401 (fixture)

MARKER_SOURCE = """\
from pathlib import Path
Path(__file__).with_name("imported").write_text("imported")

def touch(*args, **kwargs):
    Path(__file__).with_name("called").write_text("called")
    return args[0] if args else None
"""


@pytest.fixture
def marker(tmp_path, monkeypatch):
    """``(module name, directory)``: a module on ``sys.path`` that writes ``imported``
    when imported and ``called`` when its ``touch`` is called, next to itself."""
    home = tmp_path / "planted"
    home.mkdir()
    name = f"tl_marker_{uuid.uuid4().hex[:12]}"
    (home / f"{name}.py").write_text(MARKER_SOURCE)
    monkeypatch.syspath_prepend(str(home))
    return name, home


def untouched(home: Path) -> bool:
    return not (home / "imported").exists() and not (home / "called").exists()


def hostile_graph(module: str) -> str:
    return f"""\
graph @g(%x: f32[4, 8]) {{
  %s = aten.mul.Tensor(%x, %x) : f32[4, 8]
  %z = python.{module}.touch(%s) : f32[4, 8]
  return %z
}}
"""


def test_verifying_text_that_names_python_imports_nothing_and_names_the_op(marker):
    module, home = marker
    graph = parse_graph(hostile_graph(module))
    with pytest.raises(VerifyError, match=f"python.{module}.touch is not in the op registry"):
        verify(graph, default_registry())
    assert untouched(home)


def test_the_issue_example_python_os_system_is_rejected(tmp_path):
    pwned = tmp_path / "pwned"
    text = f"""\
graph @g(%x: f32[4]) {{
  %s = python.os.system() {{args = [{json.dumps(f"touch {pwned}")}]}} : any
  return %x
}}
"""
    with pytest.raises(VerifyError, match="python.os.system is not in the op registry"):
        verify(parse_graph(text), default_registry())
    assert default_registry().get("python.os.system").fn is None
    assert not pwned.exists()


def test_names_reach_only_torch_operators_not_other_attributes_of_torch_ops(marker):
    module, home = marker
    registry = default_registry()
    text = f"""\
graph @g(%x: f32[4]) {{
  %m = load_library.__self__.import_module() {{args = [{json.dumps(module)}]}} : any
  return %x
}}
"""
    with pytest.raises(VerifyError, match="op load_library.__self__.import_module is unknown"):
        verify(parse_graph(text), registry)  # rejected, and nothing ran
    for name in ("load_library.__self__.import_module", "import_module.__self__.load_library",
                 "aten.add.__call__", "higher_order.__class__"):
        assert registry.lookup(name) is None, name
    assert untouched(home)
    assert registry.lookup("aten.add.Tensor").fn is not None  # torch's ops still resolve
    assert registry.lookup("higher_order.cond").fn is torch.ops.higher_order.cond


def test_a_reproducer_naming_python_is_an_error_not_a_call(marker, capsys):
    module, home = marker
    for verify_policy, code in (("each", 2), ("off", None)):
        d = home / f"repro-{verify_policy}"
        d.mkdir()
        (d / "before.ir").write_text(hostile_graph(module))
        (d / "pass.json").write_text(json.dumps({"pass": "dce", "options": {},
                                                 "verify": verify_policy}))
        rc = main(["reproduce", str(d)])
        err = capsys.readouterr().err
        if code is not None:
            assert rc == code
            assert f"python.{module}.touch is not in the op registry" in err
        assert untouched(home)


def _forge_kernel_entry(entry: Path, source: str) -> None:
    """Rewrite a kernel-cache entry's source, with checksums that match (as an attacker
    who can write the cache directory would)."""
    data = json.loads(entry.read_text())
    data.pop("checksum")
    (entry.parent / data["source_file"]).write_text(source)
    data["source_sha256"] = hashlib.sha256(source.encode()).hexdigest()
    entry.write_text(json.dumps({**data, "checksum": checksum(data)}))


GROUP = """\
graph @main(%x: f32[4, 8]) {
  %a = torchloom.fusion_group(%x) : f32[4, 8] region @g0(%p: f32[4, 8]) {
    %s = aten.mul.Tensor(%p, %p) : f32[4, 8]
    %t = aten.tanh.default(%s) : f32[4, 8]
    return %t
  }
  return %a
}
"""


@pytest.mark.parametrize("hostile", ["python_op", "keyword_injection"])
def test_a_forged_kernel_cache_entry_is_damaged_and_rebuilt(marker, tmp_path, caplog, hostile):
    module, home = marker
    group = next(iter(parse_graph(GROUP).nodes))
    registry, codegen = default_registry(), EagerCodegen()
    KernelCache(tmp_path / "kernels").get_or_compile(codegen, group, registry)
    (entry,) = (tmp_path / "kernels").glob("*.json")
    if hostile == "python_op":
        body = hostile_graph(module).replace("graph @g(", "graph @g0(")
    else:  # a registered callable, with a keyword argument whose name is code
        code = f"x=__import__({module!r}).touch() or 0, y"
        body = ("graph @g0(%p: f32[4, 8]) {\n"
                "  %s = aten.mul.Tensor(%p, %p) : f32[4, 8]\n"
                f"  %z = python.operator.getitem(%s) {{args = [$0, 0], kwargs = "
                f"[[{json.dumps(code)}, 1]]}} : f32[8]\n"
                "  %t = aten.tanh.default(%s) : f32[4, 8]\n"
                "  return %t\n}\n")
    _forge_kernel_entry(entry, body)
    cache = KernelCache(tmp_path / "kernels")
    with caplog.at_level(logging.WARNING, logger="torchloom.cache"):
        kernel = cache.get_or_compile(codegen, group, registry)
    x = torch.randn(4, 8)
    torch.testing.assert_close(kernel(x)[0], torch.tanh(x * x))
    assert (cache.corrupt, cache.compiles, cache.disk_hits) == (1, 1, 0)
    assert any("corrupt" in r.getMessage() and entry.name in r.getMessage()
               for r in caplog.records)
    assert untouched(home)


def test_keyword_names_from_attributes_never_become_code(marker):
    module, home = marker
    code = f"x=__import__({module!r}).touch() or 0, y"
    text = ("graph @g(%x: f32[4, 8]) {\n"
            f"  %z = python.operator.getitem(%x) {{args = [$0, 0], kwargs = "
            f"[[{json.dumps(code)}, 1]]}} : f32[8]\n"
            "  return %z\n}\n")
    with pytest.raises(TypeError, match="keyword argument name .* is not an identifier"):
        build_function(parse_graph(text), default_registry())
    assert untouched(home)


def test_a_forged_compile_cache_entry_is_damaged(marker, tmp_path, caplog):
    module, home = marker
    cache = GraphCache(tmp_path / "graphs", {"test": 1})
    key = cache.key(parse_graph(hostile_graph(module).replace(f"python.{module}.touch",
                                                              "aten.neg.default")))
    body = {"format": graph_cache.FORMAT, "key": key, "ir": hostile_graph(module),
            "records": [], "notes": []}
    path = cache.path(key)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**body, "checksum": checksum(body)}))
    with caplog.at_level(logging.WARNING, logger="torchloom.cache"):
        assert cache.load(key, default_registry()) is None
    assert cache.corrupt == 1
    assert any(f"python.{module}.touch" in r.getMessage() for r in caplog.records)
    assert untouched(home)


def test_the_frontend_registers_the_fx_graphs_own_callables():
    gm = torch.fx.symbolic_trace(lambda x: torch.neg(x))
    x = torch.randn(3)
    for n in gm.graph.nodes:
        n.meta["val"] = x if n.op == "placeholder" else torch.neg(x)
    registry = default_registry()
    assert registry.lookup("python.torch.neg") is None
    imported = import_fx(gm, [x], registry=registry)
    assert imported.callables == {"python.torch.neg": torch.neg}
    assert registry.lookup("python.torch.neg").fn is torch.neg
    verify(imported.graph, registry)
    torch.testing.assert_close(build_function(imported.graph, registry).fn(x)[0], -x)
    # the same text with a fresh registry names an op nobody registered
    with pytest.raises(VerifyError, match="python.torch.neg is not in the op registry"):
        verify(parse_graph(str(imported.graph)), default_registry())


def test_a_name_the_registry_gives_another_callable_is_unsupported():
    gm = torch.fx.symbolic_trace(lambda x: torch.neg(x))
    x = torch.randn(3)
    for n in gm.graph.nodes:
        n.meta["val"] = x if n.op == "placeholder" else torch.neg(x)
    registry = default_registry()
    registry.register(OpDef("python.torch.neg", "opaque", fn=operator.pos))
    with pytest.raises(UnsupportedError, match="python.torch.neg, which the op registry "
                                               "already defines"):
        import_fx(gm, [x], registry=registry)


def test_a_python_op_a_plugin_registers_is_known_to_text(marker, fake_site):
    """The documented way (docs/writing-a-plugin.md): ``torchloom_ops`` registers the callable;
    text naming it then verifies and runs, and nothing was imported by its name."""
    from torchloom.plugins.loader import load_plugins
    module, home = marker
    fake_site.add("tl-python-op", modules={"tl_python_op": """
        import torch
        from torchloom.api import OpDef, hookimpl

        def double(t):
            return t * 2

        @hookimpl
        def torchloom_ops(registry):
            registry.register(OpDef("python.tl_python_op.double", "opaque", fn=double))
        """}, entry_points={"python_op": "tl_python_op"})
    plugins = load_plugins(entry_points=fake_site.entry_points())
    text = hostile_graph(module).replace(f"python.{module}.touch", "python.tl_python_op.double")
    graph = parse_graph(text)
    verify(graph, plugins.registry)
    x = torch.randn(4, 8)
    torch.testing.assert_close(build_function(graph, plugins.registry).fn(x)[0], x * x * 2)
    with pytest.raises(VerifyError, match=f"python.{module}.touch is not in the op registry"):
        verify(parse_graph(hostile_graph(module)), plugins.registry)
    assert untouched(home)
