"""Progress of slow steps (progress.py): one line rewritten in place on a terminal,
logging otherwise, nothing for fast steps; Activity ticks by itself; bench reports its
compiles and rounds."""

from __future__ import annotations

import io
import logging
import textwrap
import time

import pytest

from torchloom import progress
from torchloom.progress import Activity, Progress


def test_on_a_terminal_one_line_is_rewritten_then_erased():
    out = io.StringIO()
    with Progress("tuning k", total=3, stream=out, tty=True, delay=0) as p:
        p.update(1, "configs")
        p.update(2)
    text = out.getvalue()
    frames = text.split("\r\033[K")
    assert frames[0] == "" and "\n" not in text  # every frame overwrites the line
    assert frames[1].startswith("tuning k 1/3 configs (") and frames[2].startswith("tuning k 2/3")
    assert frames[-1] == ""  # erased at the end


def test_elsewhere_it_logs_when_due_and_when_done(caplog):
    out = io.StringIO()
    with caplog.at_level(logging.INFO, logger="torchloom.progress"):
        with Progress("building", total=10, stream=out, tty=False, delay=0, every=3600) as p:
            for k in range(10):
                p.update(k + 1)
    assert out.getvalue() == ""
    logs = [r.getMessage() for r in caplog.records]
    assert len(logs) == 2  # the first update, then throttled until the end
    assert logs[0].startswith("torchloom: building 1/10 (")
    assert logs[1].startswith("torchloom: building: done in ")


def test_a_fast_step_says_nothing(caplog):
    out = io.StringIO()
    with caplog.at_level(logging.INFO, logger="torchloom.progress"):
        for tty in (True, False):
            with Progress("quick", total=2, stream=out, tty=tty) as p:  # default delay
                p.update(1)
                p.update(2)
    assert out.getvalue() == "" and caplog.records == []


def test_activity_ticks_by_itself_until_it_ends():
    out = io.StringIO()
    with Activity("cc building k1", stream=out, tty=True, delay=0, tick=0.02):
        time.sleep(0.3)
    frames = [f for f in out.getvalue().split("\r\033[K") if f]
    assert len(frames) >= 3 and all(f.startswith("cc building k1 (") for f in frames)
    assert out.getvalue().endswith("\r\033[K")
    time.sleep(0.1)
    assert out.getvalue().endswith("\r\033[K")  # the thread stopped with the step


def test_bench_reports_its_compiles_and_rounds(tmp_path, monkeypatch, caplog):
    from torchloom.cli.bench import bench
    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "w.py"
    work.write_text(textwrap.dedent("""
        import torch

        def workload():
            return (lambda x: torch.relu(x) * 2), [torch.randn(8, 8)]
    """))
    with caplog.at_level(logging.INFO, logger="torchloom.progress"):
        bench(work, pipeline="none", iters=1, rounds=2, warmup=0, inductor=False)
    logs = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("torchloom: bench: compiling torchloom (") for m in logs)
    assert any(m.startswith("torchloom: bench: compiling torchloom: done in ") for m in logs)
    assert any(m.startswith("torchloom: bench: timing rounds 1/2 (") for m in logs)


@pytest.mark.parametrize("tty", [True, False])
def test_progress_never_raises_on_a_closed_step(tty):
    out = io.StringIO()
    p = Progress("x", stream=out, tty=tty, delay=0)
    p.update(1)
    p.close()
    p.close()  # twice: no second erase or "done"
    assert out.getvalue().count("\r\033[K") == (2 if tty else 0)
