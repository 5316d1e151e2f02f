"""Plugin loading: each entry point on its own, errors reported (entry point,
distribution, error) and skipped, disabling before import, duplicate pass names, and
what ``torchloom plugins`` shows."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from torchloom.cli import main
from torchloom.compiler import Compiler
from torchloom.errors import PipelineError
from torchloom.plugins.loader import load_plugins

from test_plugins_support import FAKE_PASSES, fake_plugins, fake_site  # noqa: F401

BROKEN_ON_IMPORT = "raise ImportError('tl_broken needs libfoo 2.0')\n"

ONE_PASS = '''
from typing import ClassVar
import attrs
from torchloom.api import Pass, PassResult, hookimpl

@attrs.frozen
class Tiny(Pass):
    """A pass that does nothing."""
    name: ClassVar[str] = "{name}"
    def run(self, graph, ctx):
        return PassResult(False)

@hookimpl
def torchloom_passes():
    return [Tiny]
'''


def add_broken(site) -> None:
    site.add("broken-dist", version="0.3", modules={"tl_broken": BROKEN_ON_IMPORT},
             entry_points={"broken": "tl_broken"})


def add_fake(site) -> None:
    site.add("fake-passes", version="1.2.3", modules={"tl_fake_passes": FAKE_PASSES},
             entry_points={"fake": "tl_fake_passes"})


def test_builtins_register_through_the_same_hooks(fake_site):
    ps = load_plugins(entry_points=fake_site.entry_points())
    assert ps.plugins == {"builtin": ("torchloom", "0.1.0")}
    for name in ("dce", "cse", "canonicalize"):
        assert (ps.passes[name].plugin, ps.passes[name].distribution) == ("builtin", "torchloom")
    assert ps.codegens["eager"].distribution == "torchloom"
    impls = {i.plugin_name for i in ps.pm.hook.torchloom_passes.get_hookimpls()}
    assert impls == {"builtin"}


def test_a_plugin_failing_to_import_is_reported_and_the_others_load(fake_site, capsys):
    add_broken(fake_site)
    add_fake(fake_site)
    ps = load_plugins(entry_points=fake_site.entry_points())
    assert "fake.tunable" in ps.passes and ps.passes["fake.tunable"].version == "1.2.3"
    [error] = ps.errors
    assert (error.entry_point, error.distribution) == ("broken", "broken-dist")
    assert "ImportError: tl_broken needs libfoo 2.0" in error.error
    assert str(error).startswith("plugin 'broken' from distribution 'broken-dist' failed to "
                                 "load and was skipped")
    # the CLI discovers the same fake distributions through importlib.metadata
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "load error: plugin 'broken' from distribution 'broken-dist' failed to load" in out
    assert "libfoo 2.0" in out
    assert "fake.tunable" in out and "(fake-passes)" in out
    assert main(["plugins", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"name": "fake", "distribution": "fake-passes", "version": "1.2.3"} in data["plugins"]
    assert data["passes"]["fake.tunable"] == {
        "distribution": "fake-passes", "plugin": "fake",
        "doc": "Changes nothing; has an option of every type a pipeline file can set."}
    assert data["codegens"]["eager"] == "torchloom"
    [err] = [e for e in data["errors"] if e["entry_point"] == "broken"]
    assert err["distribution"] == "broken-dist" and "libfoo 2.0" in err["error"]


def test_a_hook_that_raises_is_reported_and_skipped(fake_site):
    fake_site.add("hook-dist", modules={"tl_hook": """
        from torchloom.api import hookimpl

        @hookimpl
        def torchloom_passes():
            raise KeyError("registry not ready")
    """, "tl_plain": """
        from torchloom.api import Pass, PassResult, hookimpl

        class Plain(Pass):
            name = "hook.plain"

            def run(self, graph, ctx):
                return PassResult(False)

        @hookimpl
        def torchloom_passes():
            return [Plain]
    """, "tl_notpass": """
        from torchloom.api import hookimpl

        class NotAPass:
            name = "hook.not-a-pass"

        @hookimpl
        def torchloom_passes():
            return [NotAPass]
    """}, entry_points={"hooky": "tl_hook", "notpass": "tl_notpass", "plain": "tl_plain"})
    add_fake(fake_site)
    ps = load_plugins(entry_points=fake_site.entry_points())
    assert "fake.tunable" in ps.passes and "hook.not-a-pass" not in ps.passes
    by_ep = {e.entry_point: e for e in ps.errors}
    assert set(by_ep) == {"hooky", "notpass", "plain"}
    assert "pass 'hook.plain' (Plain) is not an @attrs.frozen class" in by_ep["plain"].error
    assert by_ep["hooky"].distribution == "hook-dist"
    assert "torchloom_passes raised KeyError: 'registry not ready'" in by_ep["hooky"].error
    assert "NotAPass, which is not a Pass subclass" in by_ep["notpass"].error


def add_clash(site) -> None:
    site.add("first-dist", modules={"tl_first": ONE_PASS.format(name="shared.pass")},
             entry_points={"first": "tl_first"})
    site.add("second-dist", version="2.0",
             modules={"tl_second": ONE_PASS.format(name="shared.pass")},
             entry_points={"second": "tl_second"})


def test_a_pass_name_two_distributions_register_loads_and_lists_both_owners(fake_site,
                                                                           capsys):
    add_clash(fake_site)
    add_fake(fake_site)
    ps = load_plugins(entry_points=fake_site.entry_points())
    assert "shared.pass" not in ps.passes and "fake.tunable" in ps.passes
    assert [(r.distribution, r.plugin) for r in ps.clashes["shared.pass"]] == [
        ("first-dist", "first"), ("second-dist", "second")]
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    [line] = [ln for ln in out.splitlines() if "shared.pass" in ln]
    assert "CLASH" in line and "'first-dist' (plugin 'first')" in line
    assert "'second-dist' (plugin 'second')" in line
    assert "fake.tunable" in out  # the others are listed as usual
    assert main(["plugins", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["clashes"]["shared.pass"] == [
        {"distribution": "first-dist", "plugin": "first", "version": "1.0"},
        {"distribution": "second-dist", "plugin": "second", "version": "2.0"}]
    assert "shared.pass" not in data["passes"] and "fake.tunable" in data["passes"]


def test_a_clash_fails_only_the_pipelines_that_use_the_name(fake_site, tmp_path, capsys):
    import torch

    add_clash(fake_site)
    # torch.compile discovers the clashing plugins itself, and "none" does not use the name
    x = torch.randn(4, 8)
    compiled = torch.compile(lambda t: torch.tanh(t) * 2, backend="torchloom",
                             options={"pipeline": "none", "cache_dir": str(tmp_path / "c")})
    torch.testing.assert_close(compiled(x), torch.tanh(x) * 2)
    assert Compiler("none").pipeline.steps == ()
    path = tmp_path / "uses.toml"
    path.write_text('[pipeline]\nname = "uses"\n\n[[pass]]\nname = "cse"\n\n'
                    '[[pass]]\nname = "shared.pass"\n')
    with pytest.raises(PipelineError) as info:
        Compiler(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}:8: pass 'shared.pass' is registered twice: by "
                              f"distribution 'first-dist' (plugin 'first') and by "
                              f"'second-dist' (plugin 'second')")
    assert "TORCHLOOM_DISABLE_PLUGINS=second" in message
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "first-dist" in err and "second-dist" in err and "Traceback" not in err
    # disabling one owner settles it
    path.write_text(path.read_text() + '\n[plugins]\ndisable = ["second"]\n')
    assert main(["check", str(path)]) == 0


def test_a_reproducer_of_a_clashing_pass_names_both_owners(fake_site, tmp_path):
    from test_plugins_support import SMALL_IR

    from torchloom.errors import TorchloomError
    from torchloom.compiler.reproduce import reproduce
    add_clash(fake_site)
    (tmp_path / "before.ir").write_text(SMALL_IR)
    (tmp_path / "pass.json").write_text(json.dumps({"pass": "shared.pass", "options": {}}))
    with pytest.raises(TorchloomError) as info:
        reproduce(tmp_path, plugins=load_plugins(entry_points=fake_site.entry_points()))
    assert "'shared.pass' is registered twice" in str(info.value)
    assert "'first-dist'" in str(info.value) and "'second-dist'" in str(info.value)


def test_a_pass_clashing_with_a_builtin_names_the_core(fake_site, tmp_path):
    fake_site.add("clash-dist", modules={"tl_clash": ONE_PASS.format(name="cse")},
                  entry_points={"clash": "tl_clash"})
    ps = load_plugins(entry_points=fake_site.entry_points())
    assert "dce" in ps.passes and "cse" in ps.clashes
    path = tmp_path / "cse.toml"
    path.write_text('[[pass]]\nname = "dce"\n[[pass]]\nname = "cse"\n')
    with pytest.raises(PipelineError, match=r"'cse' is registered twice: by distribution "
                                            r"'torchloom' \(plugin 'builtin'\) and by "
                                            r"'clash-dist'"):
        Compiler(str(path))


@pytest.mark.parametrize("name", ["broken", "broken-dist"])
def test_env_disable_skips_before_import(fake_site, monkeypatch, capsys, name):
    add_broken(fake_site)
    add_fake(fake_site)
    monkeypatch.setenv("TORCHLOOM_DISABLE_PLUGINS", f" {name} , unrelated")
    ps = load_plugins(entry_points=fake_site.entry_points())
    assert ps.errors == [] and "tl_broken" not in sys.modules  # never imported
    assert ps.disabled == sorted([name, "unrelated"])
    assert "fake.tunable" in ps.passes
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert not [ln for ln in out.splitlines() if ln.startswith("load error") and "broken" in ln]
    assert f"disabled: {', '.join(sorted([name, 'unrelated']))}" in out


def test_pipeline_plugins_disable_applies_before_import(fake_site, tmp_path, capsys):
    add_broken(fake_site)
    add_fake(fake_site)
    path = tmp_path / "p.toml"
    path.write_text(textwrap.dedent("""
        [pipeline]
        name = "no-broken"
        codegen = "eager"

        [plugins]
        disable = ["broken-dist", "fake"]

        [[pass]]
        name = "cse"
    """))
    compiler = Compiler(str(path))
    assert "tl_broken" not in sys.modules
    assert not [e for e in compiler.plugins.errors if e.entry_point == "broken"]
    assert "fake.tunable" not in compiler.plugins.passes  # disabled by entry point name
    assert {"broken-dist", "fake"} <= set(compiler.plugins.disabled)
    # a pipeline that disables the plugin providing one of its passes says so
    path.write_text(path.read_text() + '\n[[pass]]\nname = "fake.tunable"\n')
    assert main(["check", str(path)]) == 2
    assert "unknown pass 'fake.tunable'" in capsys.readouterr().err


def test_unknown_plugins_table_key_is_rejected(fake_site, tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text('[plugins]\ndisabled = ["x"]\n')
    assert main(["check", str(path)]) == 2
    assert f"{path}:2: unknown key 'disabled' in [plugins] (only 'disable')" in \
        capsys.readouterr().err
