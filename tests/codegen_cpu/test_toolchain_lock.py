"""Processes building the same library at once (DDP ranks starting together) take a file
lock: the compiler runs once, the others wait and load what it built."""

from __future__ import annotations

import multiprocessing
import stat
from pathlib import Path

import pytest

from torchloom_codegen_cpu.toolchain import Toolchain, build, cached_library

SOURCE = "int f(void) { return 1; }\n"


def _toolchain(tmp: Path) -> Toolchain:
    cc = tmp / "countingcc"  # notes each run, takes a while, "builds" the library
    if not cc.exists():
        cc.write_text(f'#!/bin/sh\necho run >> "{tmp}/runs.txt"\nsleep 1\nout=""\n'
                      'while [ $# -gt 0 ]; do\n  if [ "$1" = -o ]; then out="$2"; shift; fi\n'
                      '  shift\ndone\necho built > "$out"\n')
        cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    return Toolchain(cc=str(cc), version="countingcc 1", flags=("-O3",), libs=(),
                     vector_math=False, cpu="test-cpu")


def _build_in_child(tmp: str) -> str:
    return str(build(SOURCE, _toolchain(Path(tmp)), Path(tmp) / "lib", timeout=60))


@pytest.mark.slow
def test_concurrent_builds_run_the_compiler_once(tmp_path):
    _toolchain(tmp_path)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        paths = pool.map_async(_build_in_child, [str(tmp_path)] * 4).get(timeout=300)
    assert len(set(paths)) == 1 and cached_library(Path(paths[0]))
    assert (tmp_path / "runs.txt").read_text() == "run\n"  # once, not four times
    assert Path(paths[0]).read_text() == "built\n"
