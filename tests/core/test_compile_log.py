"""The compiler's decisions at INFO on ``torchloom.*`` loggers (pipeline, passes that
changed the graph, each group's codegen and who declined it, the kernel cache's work,
fallbacks with their reproducer), shown by ``TORCH_LOGS=+torchloom``, and the compile
events as structured trace entries for tlparse (``TORCH_TRACE``)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from torchloom.compiler import Compiler

from test_compiler_reproducers import PIPELINE as BOOM_PIPELINE
from test_plugins_support import fake_plugins, fake_site  # noqa: F401 (fixtures)

SCRIPT = textwrap.dedent("""
    import torch
    f = lambda x: torch.nn.functional.gelu(x.view(4, 2, 8)).view(8, 8) * 2
    print(torch.compile(f, backend="torchloom")(torch.randn(8, 8)).sum().item())
""")


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("torchloom")]


def _gelu(x):
    return torch.nn.functional.gelu(x * 2) + 1


def _gelu_again(x):  # the same graph, another function: its kernel comes from the cache
    return torch.nn.functional.gelu(x * 2) + 1


def test_each_graph_logs_pipeline_passes_groups_and_kernel_cache(tmp_path, caplog):
    compiler = Compiler("default", cache_dir=tmp_path, compile_cache=False)
    x = torch.randn(16, 8)
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="torchloom"):
        for fn in (_gelu, _gelu_again):
            got = torch.compile(fn, backend="torchloom", options={"compiler": compiler})(x)
            torch.testing.assert_close(got, fn(x))
    torch._dynamo.reset()
    logs = _messages(caplog)
    assert f"torchloom: graph0: pipeline 'default' ({len(compiler.pipeline.flat_steps())} " \
           f"passes, codegens triton, cpu) on 3 nodes" in logs
    changed = [r for r in compiler.compilations[0].report.records if r.changed]
    assert changed and all(any(m.startswith(f"torchloom: graph0: pass {r.name} changed the "
                                            f"graph in ") for m in logs) for r in changed)
    (choice,) = compiler.compilations[0].compiled.choices
    group_line = next(m for m in logs if m.startswith("torchloom: graph0: group "))
    assert f" on {choice.codegen}" in group_line
    for reason in choice.fallback_reasons:  # triton declines this CPU group, and says why
        assert str(reason) in group_line
    assert any(re.search(r"torchloom: graph0: 3 -> \d+ nodes, 1 fusion groups \(\w+ 1\) in "
                         r"[\d.]+ ms; kernel cache: 1 compiled, 0 hit\(s\), 0 from disk", m)
               for m in logs)
    assert any(m.startswith("torchloom: graph1: ") and
               m.endswith("kernel cache: 0 compiled, 1 hit(s), 0 from disk") for m in logs)


def test_a_fallback_logs_its_whole_reason_and_reproducer(fake_plugins, tmp_path, caplog):
    pipeline = tmp_path / "boom.toml"
    pipeline.write_text(BOOM_PIPELINE)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, y: torch.exp(x + y) * 2, backend="torchloom",
                             options={"pipeline": str(pipeline), "cache_dir": str(tmp_path)})
    with caplog.at_level(logging.INFO, logger="torchloom"):
        compiled(torch.randn(4), torch.randn(4))
    torch._dynamo.reset()
    line = next(m for m in _messages(caplog) if "runs eagerly" in m)
    assert line.startswith("torchloom: graph0: runs eagerly (")
    assert "pass 'fake.boom'" in line
    repro = Path(re.search(r"Reproducer: (\S+) \(", line).group(1))
    assert (repro / "before.ir").is_file() and repro.is_absolute()


def _run(script: str, tmp_path: Path, **env) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text(script)
    full = {k: v for k, v in os.environ.items() if k not in ("TORCH_LOGS", "TORCH_TRACE")}
    full.update(TORCHLOOM_CACHE_DIR=str(tmp_path / "cache"), **env)
    run = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                         env=full, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.mark.slow
def test_torch_logs_plus_torchloom_shows_the_decisions(tmp_path):
    shown = _run(SCRIPT, tmp_path, TORCH_LOGS="+torchloom").stderr
    assert "torchloom: graph0: pipeline 'default'" in shown
    assert re.search(r"torchloom: graph0: group k_\w+ \(\d+ ops\) on \w+", shown)
    quiet = _run(SCRIPT, tmp_path).stderr
    assert "torchloom: graph0: pipeline" not in quiet


@pytest.mark.slow
def test_torch_trace_holds_torchloom_graphs_beside_dynamos(tmp_path):
    trace = tmp_path / "trace"
    _run(SCRIPT, tmp_path, TORCH_TRACE=str(trace))
    (log,) = trace.glob("*.log")
    entries, payloads, current = [], {}, None
    for line in log.read_text().splitlines():
        if line.startswith("\t"):  # a payload line of the entry above
            payloads[current] = payloads.get(current, "") + line[1:] + "\n"
            continue
        entry = json.loads(line[line.index("{"):])
        entries.append(entry)
        current = entry.get("artifact", {}).get("name")
    names = [e["artifact"]["name"] for e in entries if "artifact" in e]
    assert "torchloom_graph0_ir" in names and "torchloom_graph0_compile" in names
    assert any("dynamo_output_graph" in e for e in entries)  # Dynamo's, in the same trace
    ir = next(e for e in entries if e.get("artifact", {}).get("name") == "torchloom_graph0_ir")
    assert "frame_id" in ir  # attached to Dynamo's compile, as tlparse groups them
    assert "torchloom.fusion_group" in payloads["torchloom_graph0_ir"]
    summary = json.loads(payloads["torchloom_graph0_compile"])
    assert summary["pipeline"] == "default" and summary["groups"][0]["ops"] >= 1
    assert summary["passes"] and summary["fallback"] is None
