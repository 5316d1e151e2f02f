"""``torchloom opt``: IR text in (file or stdin), passes through the pass manager, IR text
out; errors name the file and line, the --passes entry, or the pass."""

from __future__ import annotations

import io
import sys

import pytest

from torchloom.cli import main
from torchloom.ir.text import parse_graph
from torchloom.cli.opt import passes_toml

CSE_IR = """\
// a comment line, as golden files have
graph @g(%x: f32[8]) {
  %a = aten.exp.default(%x) : f32[8]
  %b = aten.exp.default(%x) : f32[8]
  %dead = aten.neg.default(%x) : f32[8]
  %c = aten.add.Tensor(%a, %b) : f32[8]
  return %c
}
"""


def run(argv, capsys, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(["opt", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def nodes(text: str) -> list[str]:
    return [n.op for n in parse_graph(text).walk()]


def test_passes_run_in_order_on_a_file(tmp_path, capsys):
    path = tmp_path / "g.ir"
    path.write_text(CSE_IR)
    code, out, _ = run([str(path), "--passes", "cse,dce"], capsys)
    assert code == 0
    assert nodes(out) == ["aten.exp.default", "aten.add.Tensor"]
    code, out, _ = run([str(path), "--passes", "dce"], capsys)  # dce alone keeps both exp
    assert nodes(out) == ["aten.exp.default", "aten.exp.default", "aten.add.Tensor"]


def test_stdin_and_output_file(tmp_path, capsys, monkeypatch):
    out_path = tmp_path / "out.ir"
    code, out, _ = run(["--passes", "cse", "-o", str(out_path)], capsys, CSE_IR, monkeypatch)
    assert code == 0 and out == ""
    assert nodes(out_path.read_text()).count("aten.exp.default") == 1


def test_a_pipeline_by_name_runs_the_default_passes(tmp_path, capsys):
    path = tmp_path / "g.ir"
    path.write_text(CSE_IR)
    code, out, _ = run([str(path), "--pipeline", "default"], capsys)
    assert code == 0
    ops = nodes(out)
    assert ops.count("torchloom.fusion_group") == 1 and "aten.neg.default" not in ops


def test_pass_options_in_braces():
    toml, entries = passes_toml("dedup.regions{min_nodes=3 max_nodes=8},cse{regions=false}",
                                "end")
    assert "min_nodes = 3\nmax_nodes = 8" in toml and "regions = false" in toml
    assert [e for _, e in entries] == ["dedup.regions{min_nodes=3 max_nodes=8}",
                                       "cse{regions=false}"]


@pytest.mark.parametrize("passes, message", [
    ("csee", "--passes: csee: unknown pass 'csee'; did you mean 'cse'?"),
    ("dce,cse{region=false}", "--passes: cse{region=false}: pass 'cse' has no option 'region'"),
    ("cse{regions=3}", "--passes: cse{regions=3}: pass 'cse' option 'regions'"),
    ("cse{regions}", "option 'regions' of 'cse{regions}' must be written key=value"),
    (",", "--passes: no pass named"),
])
def test_bad_passes_are_user_errors_naming_the_entry(passes, message, tmp_path, capsys):
    path = tmp_path / "g.ir"
    path.write_text(CSE_IR)
    code, _, err = run([str(path), "--passes", passes], capsys)
    assert code == 2 and message in err


def test_ir_that_does_not_parse_names_file_line_and_column(tmp_path, capsys):
    path = tmp_path / "bad.ir"
    path.write_text(CSE_IR.replace("%b = aten.exp.default(%x)", "%b = aten.exp.default(%x"))
    code, _, err = run([str(path), "--passes", "cse"], capsys)
    assert code == 2 and f"{path}:4:28: expected" in err


def test_ir_that_does_not_verify_names_the_line_of_the_node(tmp_path, capsys):
    path = tmp_path / "bad.ir"
    path.write_text(CSE_IR.replace("%c = aten.add.Tensor(%a, %b) : f32[8]",
                                   "%c = aten.add.Tensor(%a, %b) : f32[9]"))
    code, _, err = run([str(path), "--passes", "cse"], capsys)
    assert code == 2
    assert f"{path}:6: the input graph fails verification" in err and "f32[9]" in err


def test_a_missing_file_is_a_user_error(tmp_path, capsys):
    code, _, err = run([str(tmp_path / "nope.ir"), "--passes", "cse"], capsys)
    assert code == 2 and "nope.ir: cannot read an IR file" in err


def test_passes_or_pipeline_is_required(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["opt", "x.ir"])
    assert exit_.value.code == 2


def test_a_file_that_is_not_utf8_names_line_and_column(tmp_path, capsys):
    path = tmp_path / "latin1.ir"
    path.write_bytes(CSE_IR.replace("%dead", "%d\xe9ad").encode("latin-1"))
    code, _, err = run([str(path), "--passes", "cse"], capsys)
    assert code == 2 and f"{path}:5:5: an IR file must be UTF-8 text" in err
