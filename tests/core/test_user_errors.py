"""Errors a user can cause at the command line: each exits 2 (1 for a failing pass or a
graph that fails only when compiled) with one paragraph on stderr that names the file and
says what to do, and no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchloom.cli import main
from torchloom.passes.pipeline import parse_raw, read_pipeline

from test_plugins_support import fake_site  # noqa: F401 (fixture)

WORKLOAD = """
import torch

def workload():
    def f(x, y):
        return (x + y).exp() * 2
    return f, [torch.randn(4, 8), torch.randn(4, 8)]
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_paragraph(err: str, command: str, path) -> None:
    """A single message, led by the command and the file it is about."""
    assert err.startswith(f"torchloom {command}: error: {path}"), err
    assert "Traceback" not in err and "\n\n" not in err.strip(), err


# ---- torchloom check -----------------------------------------------------------------

def deep_toml() -> str:
    return "[pipeline]\nname = \"deep\"\n\n[plugins]\ndisable = " + "[" * 5000 + "]" * 5000


@pytest.mark.parametrize("kind, message", [
    ("binary", ":2:9: a pipeline file must be UTF-8 text, but byte 0xff is not UTF-8"),
    ("directory", " is a directory, not a pipeline file"),
    ("deep", ":5: malformed TOML: arrays or inline tables are nested too deeply"),
])
def test_check_on_a_file_that_is_no_pipeline_exits_2_naming_it(tmp_path, capsys, kind,
                                                                 message):
    path = tmp_path / "p.toml"
    if kind == "binary":
        path.write_bytes(b"[pipeline]\nname = \"\xff\xfe\x00garbage\"\n" + bytes(range(256)))
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_text(deep_toml())
    code, out, err = run_cli(capsys, "check", str(path))
    assert code == 2 and out == ""
    assert_one_paragraph(err, "check", path)
    assert err.startswith(f"torchloom check: error: {path}{message}"), err


def test_a_pipeline_too_deep_for_explain_is_the_same_error(tmp_path, capsys, cache):
    (tmp_path / "work.py").write_text(WORKLOAD)
    (tmp_path / "deep.toml").write_text(deep_toml())
    code, out, err = run_cli(capsys, "explain", str(tmp_path / "work.py"), "--pipeline",
                             str(tmp_path / "deep.toml"))
    assert code == 2 and out == ""
    assert err.startswith(f"torchloom explain: error: {tmp_path / 'deep.toml'}:5: malformed")


def test_a_utf8_byte_order_mark_is_accepted(tmp_path, capsys):
    text = '[pipeline]\nname = "bom"\n\n[[pass]]\nname = "cse"\n'
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    code, out, err = run_cli(capsys, "check", str(path))
    assert (code, err) == (0, "")
    assert out.startswith(f"{path}: ok (1 passes, codegen eager")
    assert read_pipeline(path).data == parse_raw(text, "plain.toml").data
    assert parse_raw("\ufeff" + text, "s").data == parse_raw(text, "s").data


@pytest.mark.parametrize("text, what", [
    ("", "is empty"),
    ("# nothing yet\n\n", "is empty"),
    ('[pipeline]\nname = "bare"\n', "the pipeline has no [[pass]]"),
])
def test_check_notes_a_pipeline_without_passes(tmp_path, capsys, text, what):
    path = tmp_path / "empty.toml"
    path.write_text(text)
    code, out, err = run_cli(capsys, "check", str(path))
    assert (code, err) == (0, "")
    assert out.startswith(f"{path}: ok (0 passes")
    who = f"{path} " if what == "is empty" else ""
    assert f"  note: {who}{what}: no pass runs, so graphs are compiled as they are " \
           f"imported" in out


def test_check_does_not_note_a_pipeline_with_passes(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text('[[pass]]\nname = "dce"\n')
    code, out, _ = run_cli(capsys, "check", str(path))
    assert code == 0 and "no pass runs" not in out
