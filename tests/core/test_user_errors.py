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


def test_check_on_an_unreadable_pipeline_names_it(tmp_path, capsys, monkeypatch):
    import errno
    path = tmp_path / "secret.toml"
    path.write_text('[[pass]]\nname = "cse"\n')
    read_bytes = Path.read_bytes

    def denied(self):  # root reads any file: deny this one as a chmod 000 would
        if self == path:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return read_bytes(self)
    monkeypatch.setattr(Path, "read_bytes", denied)
    code, out, err = run_cli(capsys, "check", str(path))
    assert code == 2 and out == ""
    assert err.startswith(f"torchloom check: error: {path}: cannot read a pipeline file: "
                          f"Permission denied; check that the file exists and is readable")


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


# ---- passes that break things the verifier or the runtime must catch --------------------

BREAKERS = '''
from typing import ClassVar

import attrs

from torchloom.api import OpDef, Pass, PassResult, hookimpl


def _explode(x):
    raise RuntimeError("breakers.explode refuses to run")


def _rename_exp(graph, op):
    for node in graph.nodes:
        if node.op == "aten.exp.default":
            node.op = op
    return PassResult(True)


@attrs.frozen
class Explode(Pass):
    """Turns exp into an op that the verifier accepts and that raises when it runs."""
    name: ClassVar[str] = "breakers.explode"

    def run(self, graph, ctx):
        return _rename_exp(graph, "breakers.explode")


@attrs.frozen
class UnknownOp(Pass):
    """Turns exp into an op that nothing registers."""
    name: ClassVar[str] = "breakers.unknown-op"

    def run(self, graph, ctx):
        return _rename_exp(graph, "breakers.no_such_op")


@attrs.frozen
class Cycle(Pass):
    """Makes the first node read the last node's result: a cycle."""
    name: ClassVar[str] = "breakers.cycle"

    def run(self, graph, ctx):
        graph.first.set_input(0, graph.last.output)
        return PassResult(True)


@hookimpl
def torchloom_passes():
    return [Explode, UnknownOp, Cycle]


@hookimpl
def torchloom_ops(registry):
    registry.register(OpDef("breakers.explode", "opaque", fn=_explode,
                            infer=lambda node: [node.inputs[0].type]))
'''


@pytest.fixture
def breakers(fake_site, tmp_path):
    """The ``breakers`` plugin installed; ``work.py`` beside a pipeline per pass."""
    fake_site.add("torchloom-breakers", version="0.3", modules={"tl_breakers": BREAKERS},
                  entry_points={"breakers": "tl_breakers"})
    (tmp_path / "work.py").write_text(WORKLOAD)

    def pipeline(pass_name: str, verify: str = "each") -> Path:
        path = tmp_path / f"{pass_name.split('.')[1]}-{verify}.toml"
        path.write_text(f'[pipeline]\nverify = "{verify}"\n\n[[pass]]\nname = "{pass_name}"\n')
        return path
    return pipeline


def test_a_pass_creating_an_unknown_op_is_rejected_by_verify_naming_the_pass(
        breakers, tmp_path, capsys, cache):
    code, out, err = run_cli(capsys, "explain", str(tmp_path / "work.py"), "--pipeline",
                             str(breakers("breakers.unknown-op")))
    assert code == 1 and out == ""
    assert err.startswith("torchloom explain: error: pass 'breakers.unknown-op' (distribution "
                          "torchloom-breakers 0.3) left a graph the verifier rejects: "
                          "VerifyError: in graph @graph0: op breakers.no_such_op is unknown")
    assert "Traceback" not in err


@pytest.mark.parametrize("verify", ["off", "end"])
def test_a_pass_creating_a_cycle_is_named_even_with_verify_off(breakers, tmp_path, capsys,
                                                               cache, verify):
    code, out, err = run_cli(capsys, "explain", str(tmp_path / "work.py"), "--pipeline",
                             str(breakers("breakers.cycle", verify)))
    assert code == 1 and out == ""
    assert err.startswith("torchloom explain: error: pass 'breakers.cycle' (distribution "
                          "torchloom-breakers 0.3) left a graph the verifier rejects: "
                          "VerifyError: in graph @graph0: input 0 (%mul) is used before it "
                          "is defined (a cycle, or nodes out of order)"), err
    assert "Traceback" not in err


def test_under_torch_compile_a_cycle_with_verify_off_runs_the_graph_eagerly(breakers, cache):
    import torch

    from torchloom.compiler import Compiler
    from torchloom.backend import torchloom_backend
    compiler = Compiler(breakers("breakers.cycle", "off"))

    def f(x, y):
        return (x + y).exp() * 2
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch._dynamo.reset()
    compiled = torch.compile(f, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    try:
        torch.testing.assert_close(compiled(x, y), f(x, y))
    finally:
        torch._dynamo.reset()
    [comp] = compiler.compilations
    assert comp.fallback_reason.startswith("pass 'breakers.cycle' (distribution "
                                           "torchloom-breakers 0.3) left a graph the verifier")


def test_a_workload_failing_only_when_compiled_says_so_and_names_the_node(
        breakers, tmp_path, capsys, cache):
    code, out, err = run_cli(capsys, "explain", str(tmp_path / "work.py"), "--pipeline",
                             str(breakers("breakers.explode")))
    assert code == 1 and out == ""
    assert_one_paragraph(err, "explain", tmp_path / "work.py")
    assert ": the workload runs eagerly without error, but fails when compiled with " \
           "torchloom (pipeline 'explode-each'): the compiled graph @graph0 at node " \
           "`%exp = breakers.explode(%add) : f32[4, 8]` raised: RuntimeError: " \
           "breakers.explode refuses to run. Rerun with --traceback" in err
    assert main(["--traceback", "explain", str(tmp_path / "work.py"), "--pipeline",
                 str(breakers("breakers.explode"))]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "tl_breakers.py" in err


def test_bench_of_a_workload_failing_only_when_compiled_says_so(breakers, tmp_path, capsys,
                                                                cache):
    code, out, err = run_cli(capsys, "bench", str(tmp_path / "work.py"), "--pipeline",
                             str(breakers("breakers.explode")), "--iters", "1", "--rounds",
                             "1", "--warmup", "0", "--no-inductor")
    assert code == 1 and out == ""
    assert_one_paragraph(err, "bench", tmp_path / "work.py")
    assert "runs eagerly without error, but fails when compiled with torchloom" in err
    assert "RuntimeError: breakers.explode refuses to run" in err


def test_a_failure_while_compiling_names_the_graph(tmp_path, capsys, cache, monkeypatch):
    from torchloom.runtime import executor
    (tmp_path / "work.py").write_text(WORKLOAD)

    def broken(*args, **kwargs):
        raise MemoryError("no room for the plan")
    monkeypatch.setattr(executor, "build_function", broken)
    code, out, err = run_cli(capsys, "explain", str(tmp_path / "work.py"), "--pipeline", "none")
    assert code == 1 and out == ""
    assert_one_paragraph(err, "explain", tmp_path / "work.py")
    assert "fails when compiled with torchloom (pipeline 'none'): compiling graph0 failed " \
           "(torchloom or a plugin): MemoryError: no room for the plan." in err


# ---- torchloom explain: the workload and --dump ---------------------------------------

@pytest.mark.parametrize("kind, message", [
    ("directory", " is a directory; give a Python file defining workload()"),
    ("text", ": a workload must be a Python file ending in .py"),
])
def test_explain_on_something_that_is_no_workload_file(tmp_path, capsys, cache, kind,
                                                       message):
    path = tmp_path / ("models" if kind == "directory" else "notes.txt")
    if kind == "directory":
        path.mkdir()
    else:
        path.write_text(WORKLOAD)
    code, out, err = run_cli(capsys, "explain", str(path))
    assert code == 2 and out == ""
    assert_one_paragraph(err, "explain", path)
    assert err.startswith(f"torchloom explain: error: {path}{message}")


@pytest.mark.parametrize("where, problem", [("file", "a file is in its place"),
                                             ("inside a file", "Not a directory"),
                                             ("read-only", "Permission denied")])
def test_explain_dump_where_it_cannot_write_is_an_error_before_anything_runs(
        tmp_path, capsys, cache, monkeypatch, where, problem):
    import errno
    import tempfile
    (tmp_path / "work.py").write_text(WORKLOAD)
    (tmp_path / "taken").write_text("not a directory")
    dump = {"file": tmp_path / "taken", "inside a file": tmp_path / "taken" / "dump",
            "read-only": tmp_path / "ro"}[where]
    if where == "read-only":  # root writes anywhere: deny the write as mode 0o555 would
        dump.mkdir()
        mkstemp = tempfile.mkstemp

        def denied(*args, dir=None, **kwargs):
            if dir is not None and Path(dir) == dump:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dir))
            return mkstemp(*args, dir=dir, **kwargs)
        monkeypatch.setattr(tempfile, "mkstemp", denied)
    code, out, err = run_cli(capsys, "explain", str(tmp_path / "work.py"), "--dump", str(dump))
    assert code == 2 and out == ""
    assert err.startswith(f"torchloom explain: error: --dump {dump}: cannot write there "
                          f"({problem}); give a directory you can write to")
    assert "Traceback" not in err
    assert (tmp_path / "taken").read_text() == "not a directory"


# ---- --json: one document on stdout ---------------------------------------------------

CHATTY = """
import os
import torch

def workload():
    def f(x, y):
        print("forward says hello")
        return (x + y).exp() * 2
    print("workload() says hello")
    os.system("echo a child process says hello")
    os.write(1, b"a raw write to fd 1\\n")
    return f, [torch.randn(4, 8), torch.randn(4, 8)]
"""


@pytest.mark.slow
@pytest.mark.parametrize("command", [["explain"], ["bench", "--iters", "1", "--rounds", "1",
                                                   "--warmup", "0", "--no-inductor"]])
def test_json_stdout_is_one_document_whatever_the_workload_prints(tmp_path, command):
    (tmp_path / "chatty.py").write_text(CHATTY)
    env = {**os.environ, "TORCHLOOM_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "torchloom", command[0],
                           str(tmp_path / "chatty.py"), "--pipeline", "none", "--json",
                           *command[1:]], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["workload"] == str(tmp_path / "chatty.py")
    for said in ("workload() says hello", "forward says hello",
                 "a child process says hello", "a raw write to fd 1"):
        assert said in proc.stderr and said not in proc.stdout


def test_json_in_process_keeps_prints_off_stdout(tmp_path, capsys, cache):
    (tmp_path / "chatty.py").write_text(CHATTY.replace('os.system("echo a child process says '
                                                       'hello")', "").replace(
        'os.write(1, b"a raw write to fd 1\\n")', ""))
    code, out, err = run_cli(capsys, "explain", str(tmp_path / "chatty.py"), "--pipeline",
                             "none", "--json")
    assert code == 0
    assert json.loads(out)["max_abs_error"] == 0.0
    assert "workload() says hello" in err and "forward says hello" in err


# ---- torchloom reproduce on a damaged reproducer --------------------------------------

GOOD_META = {"pass": "cse", "options": {}, "verify": "each", "device": "cpu"}


@pytest.mark.parametrize("pass_json, message", [
    ('{"pass": "cse", "options": {', ":1:29: a reproducer's pass.json is not valid JSON: "),
    ('{"options": {}}', ': has no "pass" key'),
    ('["cse"]', ": holds a JSON list, not an object"),
    ('{"pass": 3}', ': "pass" must be a pass name or null, not 3'),
    ('{"pass": "cse", "options": [1]}', ': "options" must be an object of pass options'),
    ('{"pass": "cse", "verify": "sometimes"}', ': "verify" must be one of each, end, off'),
    ("[" * 100_000 + "]" * 100_000, ": a reproducer's pass.json nests too deeply to read"),
])
def test_reproduce_on_a_damaged_pass_json_exits_2_naming_it(tmp_path, capsys, pass_json,
                                                            message):
    from test_plugins_support import SMALL_IR
    d = tmp_path / "repro"
    d.mkdir()
    (d / "before.ir").write_text(SMALL_IR)
    (d / "pass.json").write_text(pass_json)
    code, out, err = run_cli(capsys, "reproduce", str(d))
    assert code == 2 and out == ""
    assert_one_paragraph(err, "reproduce", d / "pass.json")
    assert err.startswith(f"torchloom reproduce: error: {d / 'pass.json'}{message}"), err


def test_reproduce_on_binary_parts_names_the_file(tmp_path, capsys):
    from test_plugins_support import SMALL_IR
    d = tmp_path / "repro"
    d.mkdir()
    (d / "pass.json").write_text(json.dumps(GOOD_META))
    (d / "before.ir").write_bytes(b"\x89PNG\r\n\x1a\n")
    code, _, err = run_cli(capsys, "reproduce", str(d))
    assert code == 2
    assert err.startswith(f"torchloom reproduce: error: {d / 'before.ir'}:1:1: a reproducer's "
                          f"before.ir must be UTF-8 text")
    (d / "before.ir").write_text(SMALL_IR)
    (d / "pipeline.toml").write_bytes(b"[pipeline]\n\xc3\x28")
    code, _, err = run_cli(capsys, "reproduce", str(d))
    assert code == 2
    assert err.startswith(f"torchloom reproduce: error: {d / 'pipeline.toml'}:2:1: a "
                          f"reproducer's pipeline.toml must be UTF-8 text")
    (d / "pipeline.toml").write_text("")
    code, out, err = run_cli(capsys, "reproduce", str(d))  # intact again: cse runs cleanly
    assert (code, err) == (0, "") and out.startswith("pass 'cse' ran without error")
