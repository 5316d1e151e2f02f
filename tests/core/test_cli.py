"""The ``torchloom`` command line: explain (text and the stable --json schema), bench,
reproduce, workload errors, --traceback, and one real run of the console script."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from torchloom.cli import main
from torchloom.workloads import max_abs_error, max_scaled_error

from test_plugins_support import fake_plugins, fake_site  # noqa: F401 (fixtures)

#: the keys docs/explain-json.md promises
EXPLAIN_KEYS = {"graphs", "nodes_before", "nodes_after", "fusion_groups", "kernels",
                "unique_kernels", "fallbacks", "passes", "max_abs_error", "max_scaled_error", "notes", "backward",
                "workload", "pipeline", "compile_seconds", "kernel_cache", "dedup", "target",
                "kernel_details", "bytes_moved", "bytes_compulsory", "graph_breaks",
                "compile_cache"}

WORKLOAD = """
import torch

def workload():
    def f(x, y):
        a = (x + y).exp()
        b = (x + y).exp()   # the same expression again: cse merges it
        return (a * b).sum(-1)
    return f, [torch.randn(4, 8), torch.randn(4, 8)]
"""

PIPELINE = """
[pipeline]
name = "cse-dce"
codegen = "eager"

[[pass]]
name = "cse"

[[pass]]
name = "dce"
"""


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "work.py").write_text(WORKLOAD)
    (tmp_path / "p.toml").write_text(PIPELINE)
    return tmp_path


def explain_json(capsys, *argv) -> dict:
    assert main(["explain", *argv, "--json"]) == 0
    out, err = capsys.readouterr()
    return json.loads(out)


def test_explain_json_has_the_documented_schema_and_real_counts(files, capsys):
    data = explain_json(capsys, str(files / "work.py"), "--pipeline", str(files / "p.toml"))
    assert set(data) == EXPLAIN_KEYS
    # aten graph: add, exp, add, exp, mul, sum -> cse merges add+exp, dce has nothing left
    assert (data["graphs"], data["nodes_before"], data["nodes_after"]) == (1, 6, 4)
    assert data["fusion_groups"] == 0 and data["kernels"] == 4 and data["unique_kernels"] == 0
    assert data["fallbacks"] == []
    assert data["kernel_cache"]["unique"] == data["unique_kernels"]
    assert [(p["name"], p["changed"], p["stats"]) for p in data["passes"]] == [
        ("cse", True, {"merged": 2}), ("dce", False, {"removed": 0})]
    assert all(isinstance(p["ms"], float) and p["ms"] >= 0 for p in data["passes"])
    assert all(isinstance(p["cpu_ms"], float) and p["cpu_ms"] >= 0 for p in data["passes"])
    assert data["max_abs_error"] == 0.0
    assert (data["pipeline"], data["backward"]) == ("cse-dce", False)


def test_explain_none_pipeline_and_backward_graphs(files, capsys):
    (files / "grad.py").write_text(textwrap.dedent("""
        import torch

        def workload(device="cpu"):
            x = torch.randn(4, 8, device=device, requires_grad=True)
            return (lambda x, w: torch.tanh(x @ w).sum()), [x, torch.randn(8, 8, device=device)]
    """))
    data = explain_json(capsys, str(files / "grad.py"), "--pipeline", "none")
    assert data["backward"] is True and data["graphs"] == 2  # forward and backward
    assert data["passes"] == [] and data["nodes_after"] == data["nodes_before"]
    assert data["max_abs_error"] < 1e-5


def test_explain_shows_the_backward_of_a_function_over_a_models_parameters(files, capsys):
    """A workload whose callable closes over a model (its parameters need gradients, its
    inputs do not) got ``"backward": false`` and its training graph never compiled (issue
    41): the backward runs, is compiled, counted and checked."""
    (files / "closure.py").write_text(textwrap.dedent("""
        import torch

        def workload():
            torch.manual_seed(0)
            lin, ln = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)
            return (lambda x: torch.nn.functional.gelu(ln(lin(x)))), [torch.randn(8, 16)]
    """))
    data = explain_json(capsys, str(files / "closure.py"))
    assert data["backward"] is True and data["graphs"] == 2  # forward and backward
    assert data["kernels"] >= 2 and data["max_abs_error"] < 1e-5
    with torch.no_grad():  # nothing needs a gradient: the forward alone
        data = explain_json(capsys, str(files / "closure.py"))
    assert data["backward"] is False and data["graphs"] == 1


def test_explain_text_dump_and_show_ir(files, capsys):
    dump = files / "dump"
    assert main(["explain", str(files / "work.py"), "--pipeline", str(files / "p.toml"),
                 "--dump", str(dump), "--show-ir"]) == 0
    out = capsys.readouterr().out
    assert "graph0: 6 nodes -> 4, 0 fusion groups, 4 kernels per call" in out
    assert "cse" in out and "changed  merged=2" in out
    assert "matches eager" in out and "before:" in out and "after:" in out
    assert sorted(p.name for p in (dump / "graph0").glob("*.ir")) == [
        "00-input.ir", "01-cse.ir", "02-dce.ir"]
    assert (dump / "graph0" / "runtime.py").exists()


@pytest.mark.parametrize("source, message", [
    (None, "does not exist"),
    ("x = 1\n", "defines no workload() function"),
    ("def workload():\n    raise ValueError('no data')\n", "workload() failed: ValueError: no data"),
    ("import not_a_module_xyz\n", "importing the workload failed: ModuleNotFoundError"),
    ("def workload():\n    return 42, []\n",
     "workload() must return a pair (callable, example_inputs), such as `return model, "
     "[torch.randn(8, 16)]`, but its first item is an int, which is not callable"),
])
def test_workload_errors_exit_2_with_one_message(files, capsys, source, message):
    path = files / "bad.py"
    if source is not None:
        path.write_text(source)
    assert main(["explain", str(path)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"torchloom explain: error: {path}") and message in err
    assert "Traceback" not in err and out == ""


def test_traceback_flag_shows_the_traceback(files, capsys):
    path = files / "bad.py"
    path.write_text("def workload():\n    raise ValueError('no data')\n")
    assert main(["--traceback", "explain", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ValueError: no data" in err


@pytest.mark.parametrize("name, failure", [
    ("fake.boom", "raised: RuntimeError: boom: the pass gave up half way"),
    ("fake.corrupt", "left a graph the verifier rejects: VerifyError: in graph @graph0: "
                     "input 0 (%"),
])
def test_explain_with_a_failing_plugin_pass_exits_1_with_a_replayable_reproducer(
        fake_plugins, files, capsys, name, failure):
    (files / "boom.toml").write_text(PIPELINE + f'\n[[pass]]\nname = "{name}"\n')
    assert main(["explain", str(files / "work.py"), "--pipeline", str(files / "boom.toml")]) == 1
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith(f"torchloom explain: error: pass '{name}' (distribution "
                            f"fake-passes 1.2.3) {failure}")
    assert "The graph from before the pass was restored." in err
    repro = err.split("replay with: torchloom reproduce ")[1].split(")")[0]
    assert Path(repro).parent == files / "cache" / "reproducers"
    assert main(["reproduce", repro]) == 1
    assert capsys.readouterr().err.splitlines()[0] == first.replace("explain", "reproduce")


def test_bench_reports_times_and_ratios_from_one_run(files, capsys, monkeypatch):
    import torchloom.cli.bench
    monkeypatch.setattr(torchloom.cli.bench, "inductor_unavailable",
                        lambda device: "no C++ compiler found (Inductor needs one for CPU)")
    assert main(["bench", str(files / "work.py"), "--pipeline", str(files / "p.toml"),
                 "--iters", "3", "--rounds", "2", "--warmup", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    results = data["results"]
    assert list(results) == ["eager", "inductor", "torchloom"]
    assert results["inductor"] == {"skipped": "no C++ compiler found (Inductor needs one "
                                              "for CPU)"}
    assert results["eager"]["speedup"] == 1.0
    eager, loom = results["eager"]["ms"], results["torchloom"]["ms"]
    assert eager > 0 and loom > 0
    # speedup is rounded to 3 decimals, ms to 5: allow both roundings
    assert results["torchloom"]["speedup"] == pytest.approx(eager / loom, rel=0.01, abs=6e-4)
    assert results["torchloom"]["max_abs_error"] == 0.0
    assert main(["bench", str(files / "work.py"), "--pipeline", str(files / "p.toml"),
                 "--iters", "2", "--rounds", "1", "--no-inductor"]) == 0
    out = capsys.readouterr().out
    assert "inductor   skipped: disabled with --no-inductor" in out
    assert "x eager" in out
    assert main(["bench", str(files / "work.py"), "--iters", "0"]) == 2


def test_max_abs_error_treats_nan_and_shape_mismatches_as_not_comparable():
    a = torch.tensor([1.0, float("nan"), float("inf")])
    assert max_abs_error([a], [a.clone()]) == 0.0
    assert max_abs_error([a], [torch.tensor([1.5, float("nan"), float("inf")])]) == 0.5
    assert math.isinf(max_abs_error([a], [torch.tensor([1.0, 2.0, float("inf")])]))
    assert math.isinf(max_abs_error([a], [a[:2]]))
    assert math.isinf(max_abs_error([a], []))
    assert max_abs_error([], []) == 0.0 and max_scaled_error([], []) == 0.0


def test_max_scaled_error_divides_each_output_by_its_largest_finite_value():
    big = torch.tensor([-2e4, 5.0, float("inf")])  # the gradient of summed logits: 1e4
    small = torch.tensor([0.25, float("nan")])  # values under 1: the absolute error
    close = [big + torch.tensor([1.0, 0.0, 0.0]), small + 1e-5]
    assert max_abs_error([big, small], close) == 1.0
    assert math.isclose(max_scaled_error([big, small], close), 5e-5, rel_tol=1e-4)
    assert math.isclose(max_scaled_error([small, big], [small - 3e-4, big]), 3e-4, rel_tol=1e-4)
    assert math.isinf(max_scaled_error([big], [big.clone().fill_(float("nan"))]))


def test_the_console_script_runs_as_a_subprocess(tmp_path):
    script = Path(sys.executable).parent / "torchloom"
    bad = tmp_path / "bad.toml"
    bad.write_text('[[pass]]\nname = "csee"\n')
    env = {**os.environ, "TORCHLOOM_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([str(script), "check", str(bad)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"torchloom check: error: {bad}:2: unknown pass 'csee'; "
                                  f"did you mean 'cse'?")
    assert proc.stdout == "" and "Traceback" not in proc.stderr


def test_the_schema_document_lists_exactly_the_fields_explain_prints():
    import re
    doc = (Path(__file__).resolve().parents[2] / "docs" / "explain-json.md").read_text()
    table = doc.split("| field |")[1].split("\n\n")[0]
    assert set(re.findall(r"^\| `(\w+)` \|", table, re.M)) == EXPLAIN_KEYS


def test_check_notes_a_codegen_that_is_not_installed(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text('[pipeline]\ncodegen = "eagr"\n')
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "note: codegen 'eagr' is not installed, every group will run on 'eager'" in out
    assert "did you mean 'eager'?" in out


def test_a_workload_imports_the_module_beside_it_like_a_script(tmp_path):
    import sys
    from torchloom.tools import load_workload
    (tmp_path / "shared_layers.py").write_text("import torch\n\ndef double(x):\n"
                                               "    return x * 2\n")
    (tmp_path / "uses_sibling.py").write_text(
        "import torch\nfrom shared_layers import double\n\n"
        "def workload():\n    return double, [torch.ones(3)]\n")
    before = list(sys.path)
    fn, inputs = load_workload(tmp_path / "uses_sibling.py")
    assert fn(*inputs).tolist() == [2.0, 2.0, 2.0]
    assert sys.path == before  # the folder is searched only while the file is imported
    sys.modules.pop("shared_layers", None)


def test_a_workload_helper_called_from_a_compiled_model(files):
    """A function of a workload file (examples/lstm_cell.py's ``lstm_cell``) called inside
    a model that torch.compile traces: Dynamo looks its module up in ``sys.modules``, where
    import_workload had not put it (ModuleNotFoundError; the GPU CUDA-graph benchmark's
    LSTM row)."""
    from torchloom.tools import import_workload
    (files / "helper_wl.py").write_text(textwrap.dedent("""
        import torch
        SCALE = 3.0

        def helper(x):
            return torch.tanh(x) * SCALE

        def workload():
            return helper, [torch.randn(4)]
    """))
    helper = import_workload(files / "helper_wl.py").helper

    class Model(torch.nn.Module):
        def forward(self, x):
            return helper(x) + 1

    torch._dynamo.reset()
    x = torch.randn(8)
    torch.testing.assert_close(torch.compile(Model(), backend="torchloom")(x),
                               torch.tanh(x) * 3 + 1)
    with pytest.raises(Exception, match="importing the workload failed"):
        (files / "broken_wl.py").write_text("raise RuntimeError('no')\n")
        import_workload(files / "broken_wl.py")
    import sys
    assert "torchloom_workload_broken_wl" not in sys.modules
