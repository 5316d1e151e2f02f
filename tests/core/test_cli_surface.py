"""The command line as a Python tool: --version, python -m torchloom, check --json, a help
text for every option, --traceback before or after the command."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from importlib.metadata import version

import pytest

from torchloom import __version__
from torchloom.cli import build_parser, main

BAD_PIPELINE = """
[pipeline]
name = "typo"

[[pass]]
name = "fusion.vertcal"
"""


def _actions(parser: argparse.ArgumentParser, path: str = "torchloom"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, f"{path} {name}")
        else:
            yield path, action


def test_every_option_and_argument_has_help():
    missing = [f"{path} {'/'.join(a.option_strings) or a.dest}"
               for path, a in _actions(build_parser()) if not (a.help or "").strip()]
    assert missing == []
    # and every command is described in the main help
    sub = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    assert {c.dest for c in sub._choices_actions} == set(sub.choices)
    assert all(c.help for c in sub._choices_actions)


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert f"torchloom {__version__}" in out
    assert f"torch {version('torch')}" in out


def test_python_dash_m_runs_the_cli():
    run = subprocess.run([sys.executable, "-m", "torchloom", "--version"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"torchloom {__version__}")
    run = subprocess.run([sys.executable, "-m", "torchloom", "check", "none", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["name"] == "none"


def test_check_json_describes_the_pipeline(capsys):
    assert main(["check", "default", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["name"] == "default"
    assert data["passes"] == len(data["pass_names"]) > 0
    assert "fusion.vertical" in data["pass_names"]
    assert data["verify"] in ("each", "end", "off")
    assert len(data["fingerprint"]) > 8


def test_check_json_of_a_broken_pipeline_is_a_document_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD_PIPELINE)
    assert main(["check", str(bad), "--json"]) == 2
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["ok"] is False
    assert f"{bad}:6" in data["error"] and "fusion.vertical" in data["error"]
    assert "did you mean" in captured.err


@pytest.mark.parametrize("where", ["before", "after"])
def test_traceback_before_or_after_the_command(tmp_path, capsys, where):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD_PIPELINE)
    argv = ["check", str(bad)]
    argv = ["--traceback", *argv] if where == "before" else [*argv, "--traceback"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "unknown pass 'fusion.vertcal'" in err


def test_no_traceback_without_the_flag(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD_PIPELINE)
    assert main(["check", str(bad)]) == 2
    assert "Traceback" not in capsys.readouterr().err
