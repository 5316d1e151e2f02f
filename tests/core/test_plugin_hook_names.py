"""What pluggy would ignore without a word: a plugin function named like a hook that is
no hook (``torchloom_pass``), and a hook function without ``@hookimpl``. Loading warns,
naming the plugin, its distribution and the function, with a did-you-mean; ``torchloom
plugins`` shows the warning and the compiler logs it."""

from __future__ import annotations

import json
import logging

import pytest

from torchloom.cli import main
from torchloom.compiler import Compiler
from torchloom.plugins.loader import HOOKS, hook_name_problems, load_plugins

from test_plugins import ONE_PASS
from test_plugins_support import fake_site  # noqa: F401

#: a plugin whose pass hook is misspelled, and one whose hook lacks @hookimpl
MISSPELLED = ONE_PASS.format(name="typo.tiny").replace("def torchloom_passes",
                                                       "def torchloom_pass")
UNDECORATED = ONE_PASS.format(name="bare.pass").replace("@hookimpl\ndef", "def")


def add(site, dist: str, module: str, source: str, entry: str) -> None:
    site.add(dist, modules={module: source}, entry_points={entry: module})


def test_a_misspelled_hook_is_a_warning_with_a_did_you_mean(fake_site):
    add(fake_site, "typo-dist", "tl_typo", MISSPELLED, "typo")
    ps = load_plugins(entry_points=fake_site.entry_points())
    assert "typo.tiny" not in ps.passes and "torchloom_pass" in MISSPELLED  # never called
    [warning] = ps.warnings
    assert warning.startswith("plugin 'typo' (distribution 'typo-dist') defines "
                              "torchloom_pass, which is not a torchloom hook")
    assert "did you mean torchloom_passes?" in warning
    assert not ps.errors


def test_a_hook_without_hookimpl_is_a_warning(fake_site):
    add(fake_site, "bare-dist", "tl_bare", UNDECORATED, "bare")
    ps = load_plugins(entry_points=fake_site.entry_points())
    assert "bare.pass" not in ps.passes and "@hookimpl" not in UNDECORATED
    assert ps.warnings == ["plugin 'bare' (distribution 'bare-dist') defines torchloom_passes "
                           "without @hookimpl (torchloom.api.hookimpl), so it is never called"]


def test_the_installed_plugins_and_the_builtins_have_no_such_mistake():
    assert load_plugins().warnings == []


def test_torchloom_plugins_shows_the_warning(fake_site, capsys):
    add(fake_site, "typo-dist", "tl_typo", MISSPELLED, "typo")
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "warning: plugin 'typo' (distribution 'typo-dist') defines torchloom_pass" in out
    assert main(["plugins", "--json"]) == 0
    [warning] = json.loads(capsys.readouterr().out)["warnings"]
    assert "torchloom_pass," in warning and "torchloom_passes?" in warning


def test_the_compiler_logs_the_warning(fake_site, caplog):
    add(fake_site, "typo-dist", "tl_typo", MISSPELLED, "typo")
    plugins = load_plugins(entry_points=fake_site.entry_points())
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        Compiler({"pipeline": {"codegen": "eager"}}, plugins=plugins)
    assert any("defines torchloom_pass, which is not a torchloom hook" in r.getMessage()
               for r in caplog.records)


class Plugin:
    """A plugin may be any object; its methods are checked like a module's functions."""

    def torchloom_codegen(self):  # misspelled
        return []

    def torchloom_whatever_else(self):
        return []

    torchloom_version = "1.0"  # not a function: not a hook either way


@pytest.mark.parametrize("attr, expected", [
    ("torchloom_codegen", "did you mean torchloom_codegens?"),
    ("torchloom_whatever_else", "(hooks: " + ", ".join(HOOKS) + ")"),
])
def test_objects_are_checked_too(attr, expected):
    [problem] = [p for p in hook_name_problems("obj", Plugin(), "d") if f" {attr}," in p]
    assert expected in problem
    assert not any("torchloom_version" in p for p in hook_name_problems("obj", Plugin(), "d"))


def test_hooks_are_called_through_pluggy_so_its_tracing_sees_each_plugin(fake_site,
                                                                         monkeypatch, caplog):
    add(fake_site, "typo-dist", "tl_one", ONE_PASS.format(name="one.tiny"), "one")
    monkeypatch.setenv("TORCHLOOM_TRACE_PLUGINS", "1")
    with caplog.at_level(logging.DEBUG, logger="torchloom.plugins"):
        ps = load_plugins(entry_points=fake_site.entry_points())
    assert "one.tiny" in ps.passes
    traced = [r.getMessage() for r in caplog.records if r.name == "torchloom.plugins"]
    # one call per plugin implementing the hook: the built-ins and the fake plugin
    finished = [m for m in traced if m.strip().startswith("finish torchloom_passes")]
    assert len(finished) == 2 and any("Tiny" in m for m in finished)
