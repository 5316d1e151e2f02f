"""explain lists Dynamo's graph breaks (reason and the workload's line) beside the
graphs: in text, in --json and in the --html page."""

from __future__ import annotations

import json
import re
import textwrap

from torchloom.cli import main

WORKLOAD = textwrap.dedent("""
    import torch

    def workload():
        def f(x):
            y = torch.relu(x) * 2
            torch._dynamo.graph_break()
            return y.exp() + 1
        return f, [torch.randn(4, 8)]
""")
BREAK_LINE = WORKLOAD.splitlines().index("        torch._dynamo.graph_break()") + 1

ONE_GRAPH = textwrap.dedent("""
    import torch

    def workload():
        return (lambda x: torch.relu(x).exp()), [torch.randn(4, 8)]
""")


def test_a_graph_break_is_listed_with_reason_and_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "brk.py"
    work.write_text(WORKLOAD)
    page = tmp_path / "r.html"
    assert main(["explain", str(work), "--pipeline", "none", "--json", "--html", str(page)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["graphs"] == 2  # split in two by the break
    assert len(data["graph_breaks"]) == 1
    brk = data["graph_breaks"][0]
    assert brk["where"].startswith(f"{work}:{BREAK_LINE} in f")
    assert "graph_break" in brk["reason"] and brk["count"] >= 1
    embedded = json.loads(re.search(r'id="report-data">(.*?)</script>', page.read_text(),
                                    re.S).group(1))
    assert embedded["graph_breaks"] == data["graph_breaks"]

    assert main(["explain", str(work), "--pipeline", "none"]) == 0
    out = capsys.readouterr().out
    assert "graph breaks (Dynamo split the program 1 times, so it compiled 2 graphs)" in out
    assert f"at {work}:{BREAK_LINE} in f: " in out


def test_no_graph_break_no_entry(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "one.py"
    work.write_text(ONE_GRAPH)
    assert main(["explain", str(work), "--pipeline", "none", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["graphs"] == 1 and data["graph_breaks"] == []
