"""``torchloom explain`` runs every pass by default, even when the compile cache holds the
graph; ``--cached`` shows what a warm start does (the graph is loaded, no pass runs)."""

from __future__ import annotations

import json

import pytest

import torchloom.compiler as compiler_module
from torchloom.cli import main

from test_cli import files as cli_files  # noqa: F401 (fixture)


@pytest.fixture
def files(cli_files, monkeypatch):
    """test_cli's workload and pipeline, with the compile cache on (its default)."""
    monkeypatch.delenv("TORCHLOOM_COMPILE_CACHE", raising=False)
    return cli_files


@pytest.fixture
def pipeline_runs(monkeypatch) -> list[str]:
    """Names of the graphs the pass manager ran a pipeline on."""
    runs: list[str] = []

    class Counting(compiler_module.PassManager):
        def run(self, graph, ctx):
            runs.append(graph.name)
            return super().run(graph, ctx)

    monkeypatch.setattr(compiler_module, "PassManager", Counting)
    return runs


def explain_json(capsys, files, *extra) -> dict:
    assert main(["explain", str(files / "work.py"), "--pipeline", str(files / "p.toml"),
                 "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def records(data: dict) -> list[tuple]:
    return [(p["name"], p["changed"], p["stats"]) for p in data["passes"]]


def test_explain_runs_every_pass_each_time(files, capsys, pipeline_runs):
    first = explain_json(capsys, files)
    second = explain_json(capsys, files)
    assert len(pipeline_runs) == 2  # one graph, compiled by both runs
    assert records(first) == records(second) == [("cse", True, {"merged": 2}),
                                                  ("dce", False, {"removed": 0})]
    assert not any("compile cache" in n for n in first["notes"] + second["notes"])
    # a default explain neither reads nor fills the compile cache
    assert not list((files / "cache").glob("graphs/*/*.json"))


def test_explain_cached_loads_what_an_earlier_run_compiled(files, capsys, pipeline_runs):
    cold = explain_json(capsys, files, "--cached")
    assert len(pipeline_runs) == 1 and not any("compile cache" in n for n in cold["notes"])
    warm = explain_json(capsys, files, "--cached")
    assert len(pipeline_runs) == 1  # no pass ran the second time
    [note] = [n for n in warm["notes"] if n.startswith("loaded from the compile cache")]
    assert "no pass ran" in note
    assert warm["passes"] == cold["passes"]  # the records of the run that wrote the entry
    assert warm["max_abs_error"] == 0.0
    assert (warm["nodes_after"], warm["kernels"]) == (cold["nodes_after"], cold["kernels"])
    # and a default explain after them still runs every pass
    explain_json(capsys, files)
    assert len(pipeline_runs) == 2
