"""docs/writing-a-codegen.md shows what the code does: its group's schedule, statements
and C are what Schedule.of, lower.lower and scalar_c's render give, and its declined
group's reason is scalar_c's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from torchloom.api import Schedule, lower, parse_graph, stmt
from torchloom.testing import pointwise
from torchloom.testing.reductions import CASES
from torchloom.tools import load_plugins

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "writing-a-codegen.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", DOC, re.S | re.M)


@pytest.fixture
def scalar_c(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "third_party_codegen" / "src"))
    from torchloom_scalar_c.renderer import ScalarC
    return ScalarC()


def statement_lines(s, depth: int = 0) -> list[str]:
    """A statement as the document writes it."""
    pad = "  " * depth
    if isinstance(s, stmt.Loop):
        inner = [line for t in s.body for line in statement_lines(t, depth + 1)]
        return [f"{pad}Loop({s.var!r}, {s.start!r}, {s.end!r}, body=[", *inner, f"{pad}])"]
    if isinstance(s, stmt.Store):
        return [f"{pad}Store(Element({s.target.pointer!r}, {s.target.offset!r}), {s.value!r})"]
    if isinstance(s, stmt.Update):
        return [f"{pad}Update({s.target!r}, {s.op!r}, {s.value!r})"]
    if isinstance(s, stmt.Select):
        return [f"{pad}Select({s.target!r}, {s.cond!r}, {s.value!r})"]
    return [f"{pad}{type(s).__name__}({s.ctype!r}, {s.name!r}, {s.expr!r})"]


def test_the_rmsnorm_example_is_what_the_code_gives(scalar_c):
    [text] = blocks("ir")
    assert text == CASES["rmsnorm"][0]
    registry = load_plugins().registry
    group = next(parse_graph(text).nodes)
    schedule = Schedule.of(group)
    assert schedule.form == "row_reduction" and schedule.reductions == {"aten.mean.dim": "sum"}
    shown = [b for b in blocks("text") if b.startswith("Schedule(")][0]
    assert "detail='reduces dims [1] of [5, 16]'" in shown and schedule.detail == \
        "reduces dims [1] of [5, 16]"
    lowered = lower.lower(group, registry, schedule, scalar_c)
    statements = [line for s in lowered.body for line in statement_lines(s)]
    assert "\n".join(statements) + "\n" in blocks("text")
    [c] = blocks("c")
    source = scalar_c.render(lowered)
    assert source.endswith(c) and source.startswith("#include <math.h>")


def test_the_declined_example_is_scalar_c_reason(scalar_c):
    group = next(parse_graph(pointwise.CASES["backward_templates"][0]).nodes)
    reason = scalar_c.capabilities.gap(Schedule.of(group))
    assert f"scalar_c: {reason}\n" in blocks("text")


def test_the_python_block_runs_as_written(scalar_c, tmp_path, monkeypatch, capsys):
    [code] = blocks("python")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "group.ir").write_text(CASES["rmsnorm"][0])
    exec(compile(code, "docs/writing-a-codegen.md python block", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.startswith("None\n#include <math.h>") and blocks("c")[0] in printed


def test_the_forms_block_prints_what_the_page_says(capsys):
    [code] = blocks("python forms")
    exec(compile(code, "docs/writing-a-codegen.md forms block", "exec"), {})
    printed = capsys.readouterr().out
    shown = [b for b in blocks("text") if b.startswith("Tiles(")]
    assert shown == [printed]
