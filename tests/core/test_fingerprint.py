"""Cache identity: a pass's identity (name, options, distribution and version, hash of its
module's source) and ``Pipeline.fingerprint()``, which changes whenever any of them does."""

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
    assert ident == {
        "name": "fake.tunable",
        "options": {"limit": "3", "scale": "1.0", "enabled": "True", "mode": "'fast'",
                    "ops": "()"},
        "distribution": "fake-passes", "version": "1.2.3",
        "source": hashlib.sha256(source).hexdigest()[:16]}


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
