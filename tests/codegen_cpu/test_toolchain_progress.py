"""The C compiler's runs show progress (toolchain.build inside an Activity): a compiler
that takes a while is reported through logging when stderr is not a terminal."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

from torchloom import progress

from torchloom_codegen_cpu.toolchain import Toolchain, build


def test_a_slow_compiler_run_is_reported(tmp_path: Path, monkeypatch, caplog):
    monkeypatch.setattr(progress, "DELAY", 0.0)
    cc = tmp_path / "slowcc"  # sleeps, then "builds" the library (copies the source)
    cc.write_text('#!/bin/sh\nsleep 1.2\nout=""\nwhile [ $# -gt 0 ]; do\n'
                  '  if [ "$1" = -o ]; then out="$2"; shift; fi\n  shift\ndone\n'
                  'echo built > "$out"\n')
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    tc = Toolchain(cc=str(cc), version="slowcc 1", flags=("-O3",), libs=(), vector_math=False,
                   cpu="test-cpu")
    with caplog.at_level(logging.INFO, logger="torchloom.progress"):
        path = build("int f(void) { return 1; }\n", tc, tmp_path / "lib", timeout=60)
    assert path.read_text() == "built\n"
    logs = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"torchloom: cpu codegen: slowcc building {path.stem} (")
               for m in logs)
    assert any(m.startswith(f"torchloom: cpu codegen: slowcc building {path.stem}: done in ")
               for m in logs)
