"""Cache identity: a pass's identity (name, options, distribution and version, hash of the
source of its whole top-level package) and ``Pipeline.fingerprint()`` (which adds the
core's source), which changes whenever any of them does."""

from __future__ import annotations

import hashlib
import importlib
import sys
import textwrap
from pathlib import Path

from torchloom.compiler import Compiler
from torchloom.passes.pipeline import build_pipeline, parse_raw
from torchloom.plugins.loader import load_plugins

from test_plugins_support import fake_plugins, fake_site  # noqa: F401 (fixtures)

EDITABLE = '''
from typing import ClassVar
import attrs
from torchloom.api import Pass, PassResult, hookimpl

@attrs.frozen
class Scale(Pass):
    """Changes nothing."""
    name: ClassVar[str] = "edit.scale"
    factor: int = 2

    def run(self, graph, ctx):
        return PassResult(False, {{"factor": self.factor * {k}}})

@hookimpl
def torchloom_passes():
    return [Scale]
'''

PIPELINE = """
[pipeline]
name = "fp"
codegen = "eager"

[[pass]]
name = "cse"

[[pass]]
name = "edit.scale"
{options}
"""


def fingerprint(plugins, options: str = "", codegen: str = "eager") -> str:
    text = PIPELINE.format(options=options).replace('"eager"', f'"{codegen}"')
    return build_pipeline(parse_raw(text, "fp.toml"), plugins).fingerprint()


def edit_site(site, k: int = 1, version: str = "1.0"):
    site.add("edit-dist", version=version, modules={"tl_edit": EDITABLE.format(k=k)},
             entry_points={"edit": "tl_edit"})
    return load_plugins(entry_points=site.entry_points())


def test_identity_has_name_options_distribution_version_and_source(fake_plugins):
    reg = fake_plugins.passes["fake.tunable"]
    pass_ = reg.obj(limit=3)
    ident = pass_.identity(reg.distribution, reg.version)
    source = Path(sys.modules["tl_fake_passes"].__file__).read_bytes()
    # a plugin that is one module: its file, by its name relative to the site
    digest = hashlib.sha256(b"tl_fake_passes.py\0" + source + b"\0").hexdigest()[:16]
    assert ident == {
        "name": "fake.tunable",
        "options": {"limit": "3", "scale": "1.0", "enabled": "True", "mode": "'fast'",
                    "ops": "()"},
        "distribution": "fake-passes", "version": "1.2.3",
        "source": digest}


def test_fingerprint_is_stable_and_changes_with_options_and_codegen(fake_site):
    plugins = edit_site(fake_site)
    base = fingerprint(plugins)
    assert fingerprint(plugins) == base
    assert fingerprint(load_plugins(entry_points=fake_site.entry_points())) == base
    assert fingerprint(plugins, "factor = 2") == base  # the default, spelled out
    assert fingerprint(plugins, "factor = 3") != base
    assert fingerprint(plugins, codegen="triton") != base


def test_editing_a_pass_module_changes_the_fingerprint(fake_site):
    plugins = edit_site(fake_site, k=1)
    before = fingerprint(plugins)
    module = sys.modules["tl_edit"]
    Path(module.__file__).write_text(textwrap.dedent(EDITABLE.format(k=10)))
    importlib.reload(module)
    reloaded = load_plugins(entry_points=fake_site.entry_points())
    assert reloaded.passes["edit.scale"].obj is module.Scale
    after = fingerprint(reloaded)
    assert after != before
    # the edit is real: the reloaded pass computes something else
    from torchloom.passes.base import PassContext
    result = module.Scale().run(None, PassContext(registry=reloaded.registry))
    assert result.stats == {"factor": 20}


def test_a_new_distribution_version_changes_the_fingerprint(fake_site, tmp_path, monkeypatch):
    old = fingerprint(edit_site(fake_site, version="1.0"))
    sys.modules.pop("tl_edit", None)
    other = tmp_path / "other-site"
    other.mkdir()
    from test_plugins_support import FakeSite
    monkeypatch.syspath_prepend(str(other))
    site2 = FakeSite(other)
    new = fingerprint(edit_site(site2, version="1.1"))
    sys.modules.pop("tl_edit", None)
    assert new != old


def test_the_kernel_cache_is_keyed_by_the_fingerprint(fake_site, tmp_path):
    edit_site(fake_site)
    path = tmp_path / "p.toml"
    path.write_text(PIPELINE.format(options="factor = 5"))
    compiler = Compiler(str(path), cache_dir=tmp_path / "cache")
    assert compiler.kernel_cache.fingerprint == compiler.pipeline.fingerprint()
    path.write_text(PIPELINE.format(options="factor = 6"))
    other = Compiler(str(path), cache_dir=tmp_path / "cache")
    assert other.kernel_cache.fingerprint != compiler.kernel_cache.fingerprint


HELPER_PLUGIN = {
    "__init__.py": '''
        from torchloom.api import hookimpl
        from tl_helper_pkg.rewrite import RewriteExp

        @hookimpl
        def torchloom_passes():
            return [RewriteExp]
    ''',
    "rewrite.py": '''
        from typing import ClassVar
        import attrs
        from torchloom.api import Pass, PassResult
        from tl_helper_pkg.logic import helpers

        @attrs.frozen
        class RewriteExp(Pass):
            """exp -> whatever helpers.replacement() says (the logic lives in a helper)."""
            name: ClassVar[str] = "helper.rewrite-exp"

            def run(self, graph, ctx):
                count = 0
                for node in list(graph.nodes):
                    if node.op != "aten.exp.default":
                        continue
                    new = graph.create(helpers.replacement(), [node.inputs[0]],
                                       [node.output.type], before=node)
                    graph.replace_all_uses(node.output, new.output)
                    graph.erase(node)
                    count += 1
                return PassResult(count > 0, {"rewritten": count})
    ''',
    "logic/__init__.py": "",
    "logic/helpers.py": '''
        def replacement():
            return "{op}"
    ''',
}

HELPER_PIPELINE = """
[pipeline]
name = "helper"
codegen = "eager"

[[pass]]
name = "helper.rewrite-exp"
"""


def write_helper_plugin(site, op: str) -> None:
    for rel, source in HELPER_PLUGIN.items():
        path = site.root / "tl_helper_pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source).replace("{op}", op))
    importlib.invalidate_caches()


def forget_helper_plugin() -> None:
    """As a new process would: the plugin's modules are imported afresh."""
    for name in [m for m in sys.modules if m == "tl_helper_pkg" or m.startswith("tl_helper_pkg.")]:
        del sys.modules[name]


def test_editing_a_helper_module_of_the_pass_package_recompiles(fake_site, tmp_path,
                                                                 monkeypatch):
    import torch

    from test_plugins_support import small_graph
    from torchloom.passes.sources import SourceHashes
    real = SourceHashes.of_package

    def plugin_only(self, name, fallback=""):  # the core's source is tested on its own
        return "core" if name == "torchloom" else real(self, name, fallback)

    # (here, only the plugin changes: an edit of the core elsewhere must not break the test)
    monkeypatch.setattr(SourceHashes, "of_package", plugin_only)
    write_helper_plugin(fake_site, "aten.sin.default")
    fake_site.add("helper-dist", entry_points={"helper": "tl_helper_pkg"})
    fake_site.modules.append("tl_helper_pkg")
    pipeline = tmp_path / "helper.toml"
    pipeline.write_text(HELPER_PIPELINE)
    cache = tmp_path / "compile-cache"
    x, y = torch.randn(4, 8), torch.randn(4, 8)

    def compile_once():
        c = Compiler(str(pipeline), cache_dir=cache, compile_cache=True)
        comp = c.compile_graph(small_graph())
        return comp, [n.op for n in comp.graph.nodes]

    try:
        first, ops = compile_once()
        assert not first.cached and "aten.sin.default" in ops
        torch.testing.assert_close(first.fn(x, y)[0], torch.sin(x + y))
        second, _ = compile_once()
        assert second.cached  # same code: the compile cache answers
        # same version, same file defining the pass: only the helper module changes
        write_helper_plugin(fake_site, "aten.tanh.default")
        forget_helper_plugin()
        third, ops = compile_once()
        assert not third.cached
        assert "aten.tanh.default" in ops and "aten.sin.default" not in ops
        torch.testing.assert_close(third.fn(x, y)[0], torch.tanh(x + y))
    finally:
        forget_helper_plugin()


def test_builtin_passes_and_every_pipeline_hash_the_core_package(fake_site, monkeypatch):
    from torchloom.passes.sources import SourceHashes
    plugins = load_plugins(entry_points=fake_site.entry_points())
    cse = plugins.passes["cse"].obj()
    assert cse.identity("torchloom", "0", plugins.sources)["source"] == \
        plugins.sources.of_package("torchloom")
    none = build_pipeline(parse_raw("[pipeline]\nname = 'none'\n", "none.toml"), plugins)
    before = none.fingerprint()
    real = SourceHashes.of_package

    def edited_core(self, name, fallback=""):  # as if a file of core/torchloom changed
        return "edited" if name == "torchloom" else real(self, name, fallback)

    monkeypatch.setattr(SourceHashes, "of_package", edited_core)
    assert none.fingerprint() != before  # no pass at all: the core's source still counts
