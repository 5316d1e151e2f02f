"""glibc keeps the memory a step frees for the next step's kernel outputs (memory.py):
set when the cpu codegen loads a kernel, left alone with TORCHLOOM_CPU_MALLOC=system or
an explicit MALLOC_*_THRESHOLD_ variable, a wrong setting named."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from torchloom_codegen_cpu import CpuCodegen, memory

#: in a fresh process: twelve tensors of 2 to 24 MB written and freed per round (what a
#: step's outputs do), minor page faults of the last three of six rounds
_ROUNDS = """
import json, resource, sys, torch
from torchloom_codegen_cpu import memory
kept = memory.keep_freed_memory()
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    ts = [torch.empty((k + 1) << 19).fill_(1.0) for k in range(12)]
    del ts
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": sum(faults[3:])}))
"""


def _rounds(**env) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if k not in memory.GLIBC_VARIABLES and k != "TORCHLOOM_CPU_MALLOC"}
    out = subprocess.run([sys.executable, "-c", _ROUNDS], capture_output=True, text=True,
                         env={**clean, **env}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux")
def test_freed_memory_is_kept_for_the_next_round_and_explicit_thresholds_are_left_alone():
    kept = _rounds()
    # glibc's own dynamic thresholds fault or not by the process's allocation history
    # (87,456 faults in one environment, 0 in another): a fixed 128 KB mmap threshold
    # (glibc's start) makes every tensor fresh pages, and memory.py leaves it alone
    fixed = _rounds(MALLOC_MMAP_THRESHOLD_="131072")
    assert kept["kept"] and not fixed["kept"]
    # a round writes 39,936 pages of 4 KB: every one fresh with the fixed threshold; none
    # once glibc keeps what it freed
    assert fixed["faults"] >= 3 * 39_936 * 0.9, fixed
    assert kept["faults"] < 2_000, kept


def test_explicit_glibc_variables_are_never_overridden():
    assert not memory.keep_freed_memory({"MALLOC_TRIM_THRESHOLD_": "1000"})
    assert not memory.keep_freed_memory({"TORCHLOOM_CPU_MALLOC": "system"})


@pytest.mark.parametrize("value", ["keeps", "1", "on"])
def test_a_wrong_setting_is_named_when_the_codegen_is_made(monkeypatch, value):
    monkeypatch.setenv("TORCHLOOM_CPU_MALLOC", value)
    with pytest.raises(ValueError, match="TORCHLOOM_CPU_MALLOC is .*choose keep"):
        CpuCodegen()
