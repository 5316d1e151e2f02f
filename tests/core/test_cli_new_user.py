"""Messages a new user met (issue #40), each asserted on the text, JSON and exit code the
command line gives: a pass whose plugin failed to import, ``--json`` documents for
errors, ``opt`` naming the pass that broke types, whole first sentences in ``plugins``,
the backend's documented options, a ``workload()`` returning the wrong thing, and the
explain headline counting what a fusion group adds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchloom.cli import first_sentence, main
from torchloom.plugins.loader import LoadError

from test_plugins_support import FAKE_PASSES, SMALL_IR, fake_site  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]

WORKLOAD = """
import torch

def workload():
    def f(x, y):
        return (x + y).exp() * 2
    return f, [torch.randn(4, 8), torch.randn(4, 8)]
"""

BROKEN = "raise ImportError('tl_importerr needs libfoo 2.0')\n"


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def add_broken(site) -> None:
    site.add("torchloom-importerr", version="0.4", modules={"tl_importerr": BROKEN},
             entry_points={"importerr": "tl_importerr"})


def add_fake(site) -> None:
    site.add("fake-passes", version="1.2.3", modules={"tl_fake_passes": FAKE_PASSES},
             entry_points={"fake": "tl_fake_passes"})


def pipeline(tmp_path, *passes: str, verify: str = "each") -> Path:
    path = tmp_path / "p.toml"
    path.write_text(f'[pipeline]\nverify = "{verify}"\n'
                    + "".join(f'\n[[pass]]\nname = "{p}"\n' for p in passes))
    return path


# ---- 1. a pass whose plugin failed to load ----------------------------------------------

def test_an_unknown_pass_of_a_plugin_that_failed_to_import_names_the_load_error(
        fake_site, tmp_path, capsys):
    add_broken(fake_site)
    path = pipeline(tmp_path, "cse", "importerr.fold")
    code, out, err = run_cli(capsys, "check", str(path))
    assert code == 2 and out == ""
    assert err.startswith(
        f"torchloom check: error: {path}:8: unknown pass 'importerr.fold'; plugin 'importerr' "
        f"from distribution 'torchloom-importerr', which its namespace 'importerr' names, "
        f"failed to load: ImportError: tl_importerr needs libfoo 2.0 (fix that and "
        f"`torchloom plugins` lists its passes)"), err
    # the same through --passes, which opt builds into a pipeline
    (tmp_path / "g.ir").write_text(SMALL_IR)
    code, out, err = run_cli(capsys, "opt", str(tmp_path / "g.ir"), "--passes",
                             "importerr.fold")
    assert code == 2 and out == ""
    assert err.startswith("torchloom opt: error: --passes: importerr.fold: unknown pass "
                          "'importerr.fold'; plugin 'importerr' from distribution "
                          "'torchloom-importerr'"), err
    assert "ImportError: tl_importerr needs libfoo 2.0" in err


def test_an_unknown_pass_of_another_namespace_lists_the_load_errors(fake_site, tmp_path,
                                                                    capsys):
    add_broken(fake_site)
    path = pipeline(tmp_path, "folding.constants")
    code, _, err = run_cli(capsys, "check", str(path))
    assert code == 2
    assert (f"{path}:5: unknown pass 'folding.constants'; a plugin failed to load and may "
            f"provide it (plugin 'importerr' from distribution 'torchloom-importerr': "
            f"ImportError: tl_importerr needs libfoo 2.0) (installed: ") in err, err


def test_without_load_errors_an_unknown_pass_is_only_unknown(fake_site, tmp_path, capsys):
    code, _, err = run_cli(capsys, "check", str(pipeline(tmp_path, "importerr.fold")))
    assert code == 2 and "unknown pass 'importerr.fold' (installed: canonicalize" in err
    assert "failed to load" not in err


def test_check_reports_load_errors_of_a_valid_pipeline(fake_site, tmp_path, capsys):
    add_broken(fake_site)
    path = pipeline(tmp_path, "cse")
    code, out, _ = run_cli(capsys, "check", str(path))
    assert code == 0 and out.startswith(f"{path}: ok (1 passes")
    assert ("  note: plugin 'importerr' from distribution 'torchloom-importerr' failed to "
            "load and was skipped (its passes and codegens are unavailable): ImportError: "
            "tl_importerr needs libfoo 2.0") in out.splitlines()
    code, out, _ = run_cli(capsys, "check", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"] is True
    [error] = data["load_errors"]
    assert (error["entry_point"], error["distribution"]) == ("importerr", "torchloom-importerr")
    assert error["error"] == "ImportError: tl_importerr needs libfoo 2.0"
    assert any("'importerr'" in note for note in data["notes"])


def test_without_load_errors_check_has_no_load_error_note(fake_site, tmp_path, capsys):
    code, out, _ = run_cli(capsys, "check", str(pipeline(tmp_path, "cse")), "--json")
    assert code == 0 and json.loads(out)["load_errors"] == []


def test_a_syntax_error_summary_keeps_where_it_is():
    error = LoadError("bad", "bad-dist", '  File "/site/tl_bad.py", line 3\n    def (\n'
                                         '        ^\nSyntaxError: invalid syntax')
    assert error.summary == 'SyntaxError: invalid syntax (File "/site/tl_bad.py", line 3)'
    assert error.names("bad") and not error.names("fold")
    assert LoadError("codegen_triton", "torchloom-codegen-triton", "x").names("triton")


# ---- 2. every --json command prints one document, errors included ------------------------

def test_explain_json_of_a_failing_pass_prints_an_error_document(fake_site, tmp_path,
                                                                 capsys):
    add_fake(fake_site)
    (tmp_path / "work.py").write_text(WORKLOAD)
    code, out, err = run_cli(capsys, "explain", str(tmp_path / "work.py"), "--pipeline",
                             str(pipeline(tmp_path, "fake.boom")), "--json")
    assert code == 1
    data = json.loads(out)
    assert (data["ok"], data["command"], data["exit_code"]) == (False, "explain", 1)
    assert data["error"].startswith("pass 'fake.boom' (distribution fake-passes 1.2.3) "
                                    "raised: RuntimeError: boom: the pass gave up half way")
    assert err.startswith(f"torchloom explain: error: {data['error'].splitlines()[0]}")


@pytest.mark.parametrize("command", [["explain"], ["bench", "--iters", "1", "--rounds", "1",
                                                   "--no-inductor"]])
@pytest.mark.parametrize("problem", ["missing workload", "bad pipeline"])
def test_json_commands_print_an_error_document_for_user_errors(tmp_path, capsys, command,
                                                               problem):
    work = tmp_path / ("absent.py" if problem == "missing workload" else "work.py")
    (tmp_path / "work.py").write_text(WORKLOAD)
    bad = tmp_path / "bad.toml"
    bad.write_text('[[pass]]\nname = "csee"\n')
    argv = [command[0], str(work), "--json", *command[1:]]
    if problem == "bad pipeline":
        argv += ["--pipeline", str(bad)]
    code, out, err = run_cli(capsys, *argv)
    data = json.loads(out)
    assert code == 2 and data == {"ok": False, "command": command[0], "exit_code": 2,
                                  "error": data["error"]}
    expected = (f"{work}: workload file does not exist" if problem == "missing workload"
                else f"{bad}:2: unknown pass 'csee'; did you mean 'cse'?")
    assert data["error"].startswith(expected)
    assert err.startswith(f"torchloom {command[0]}: error: {expected}")


def test_check_json_error_document_has_the_same_keys_and_the_pipeline(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "check", str(tmp_path / "absent.toml"), "--json")
    data = json.loads(out)
    assert code == 2 and (data["ok"], data["command"], data["exit_code"]) == (False, "check", 2)
    assert data["pipeline"] == str(tmp_path / "absent.toml") and "absent.toml" in data["error"]


def test_a_json_command_line_that_does_not_parse_still_prints_a_document(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["explain", "--json"])  # no workload
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and "the following arguments are required: workload" in err
    assert json.loads(out) == {"ok": False, "command": "explain", "exit_code": 2,
                               "error": "invalid command line (usage on stderr)"}


# ---- 3. opt names the pass that breaks types ----------------------------------------------

@pytest.mark.parametrize("how", ["pipeline verify end", "--passes"])
def test_opt_names_the_pass_that_broke_types_and_suggests_its_own_flag(fake_site, tmp_path,
                                                                       capsys, how):
    add_fake(fake_site)
    (tmp_path / "g.ir").write_text(SMALL_IR)
    what = (["--pipeline", str(pipeline(tmp_path, "cse", "fake.retype", verify="end"))]
            if how != "--passes" else ["--passes", "cse,fake.retype"])
    code, out, err = run_cli(capsys, "opt", str(tmp_path / "g.ir"), *what)
    assert code == 1 and out == ""
    assert err.startswith("torchloom opt: error: pass 'fake.retype' (distribution fake-passes "
                          "1.2.3) left a graph the verifier rejects: VerifyError: in graph @g: "
                          "output 0 (%e) is declared f64[4, 8] but aten.exp.default gives "
                          "f32[4, 8]"), err
    assert "opt reran it with --verify-each to name the pass" in err
    assert 'verify = "each"' not in err


# ---- 4. plugins shows a pass's first sentence whole ----------------------------------------

def test_plugins_shows_the_first_sentence_of_a_pass_docstring_whole(fake_site, capsys):
    add_fake(fake_site)
    whole = ("Declares the last result f64 where it computes f32: wiring intact, types "
             "wrong (only the full verifier, not the ordering check of verify = \"off\", "
             "rejects it).")
    code, out, _ = run_cli(capsys, "plugins")
    [line] = [ln for ln in out.splitlines() if "fake.retype" in ln]
    assert code == 0 and line.endswith(f"(fake-passes) {whole}")
    code, out, _ = run_cli(capsys, "plugins", "--json")
    assert json.loads(out)["passes"]["fake.retype"]["doc"] == whole


@pytest.mark.parametrize("doc, sentence", [
    ("Fold constants, e.g. x * 1.0 becomes x, across\n    the graph. Then more.\n\n    Detail.",
     "Fold constants, e.g. x * 1.0 becomes x, across the graph."),
    ("Clean-ups after fusion:\n\n    - merge groups", "Clean-ups after fusion:"),
    ("Scale by 0.5 when\n  asked", "Scale by 0.5 when asked"),
    (None, ""),
])
def test_first_sentence(doc, sentence):
    assert first_sentence(doc) == sentence


# ---- 5. the backend's options are those the README documents -------------------------------

def test_the_unknown_option_error_lists_the_documented_options_only():
    from torchloom.backend import OPTION_KEYS, torchloom_backend
    from torchloom.errors import PipelineError
    with pytest.raises(PipelineError) as err:
        torchloom_backend(None, [], options={"pipline": "none"})
    assert str(err.value) == (
        "torch.compile(backend='torchloom'): unknown option(s) 'pipline' (did you mean "
        "'pipeline'?); known: pipeline, dump_dir, cache_dir, compile_cache, partitioner, mode, "
        "remote_cache, verify, channels_last")
    readme = (ROOT / "README.md").read_text()
    using = readme.split("## Using it", 1)[1].split("\n## ", 1)[0]
    options = using.split("Options:", 1)[1].split("An\nunknown option", 1)[0]
    for key in OPTION_KEYS:
        assert f"`{key}`" in options, f"README's 'Using it' does not document option {key!r}"
    assert "`compiler`" not in options


def test_the_internal_compiler_option_still_works(tmp_path, monkeypatch):
    import torch

    from torchloom.backend import torchloom_backend
    from torchloom.compiler import Compiler
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "cache"))
    compiler = Compiler("none")
    torch._dynamo.reset()
    try:
        f = torch.compile(lambda x: x.exp() * 2, backend=lambda gm, ex: torchloom_backend(
            gm, ex, options={"compiler": compiler}))
        x = torch.randn(4, 8)
        torch.testing.assert_close(f(x), x.exp() * 2)
    finally:
        torch._dynamo.reset()
    assert len(compiler.compilations) == 1


# ---- 6. workload() returning the wrong thing ---------------------------------------------

@pytest.mark.parametrize("returned, problem", [
    ("lambda x: x + 1", "it returned a function <lambda>"),
    ("None", "it returned None"),
    ("(lambda x: x, [x], 3)", "it returned a tuple of 3 items"),
    ("[x], (lambda x: x)", "its first item is a list, which is not callable"),
    ("(lambda x: x), x", "its second item is a Tensor of shape [4, 8], not a list or tuple "
                         "of inputs (one tensor: [x])"),
])
def test_a_workload_returning_the_wrong_thing_says_what_it_must_return(tmp_path, capsys,
                                                                       returned, problem):
    path = tmp_path / "work.py"
    path.write_text(f"import torch\n\ndef workload():\n    x = torch.randn(4, 8)\n"
                    f"    return {returned}\n")
    code, out, err = run_cli(capsys, "explain", str(path))
    assert code == 2 and out == ""
    assert err == (f"torchloom explain: error: {path}: workload() must return a pair "
                   f"(callable, example_inputs), such as `return model, [torch.randn(8, 16)]`, "
                   f"but {problem}\n")


# ---- 7. the explain headline says why fusing adds a node ------------------------------------

def test_the_explain_headline_counts_group_nodes_and_the_ops_inside(capsys, eager_default,
                                                                    tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "cache"))
    code, out, _ = run_cli(capsys, "explain", str(ROOT / "examples" / "gelu_bookend.py"),
                           "--pipeline", eager_default)
    # before: view, gelu, view; after: both views outside the group, gelu inside it
    assert code == 0
    assert ("  graph0: 3 nodes -> 4 (2 ops outside groups, 1 group node, 1 op inside it), "
            "1 fusion groups, 1 kernels per call, compiled in ") in out, out
