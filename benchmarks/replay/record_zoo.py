"""Record the groups the cpu codegen sees while the model zoo compiles each model once
(train step with the optimizer, inference, and the dynamic-length row where there is one):

    .venv/bin/python benchmarks/replay/record_zoo.py /tmp/zoo_groups.jsonl

Appends to the file as ``record_groups`` does (README.md beside this file)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import torch  # noqa: E402

import model_zoo  # noqa: E402
import record_groups  # noqa: E402


def main(out: str) -> None:
    from torchloom_codegen_cpu.codegen import CpuCodegen
    torch.set_num_threads(2)
    record_groups._Recorder(out).wrap(CpuCodegen, "cpu")
    cache = Path(tempfile.mkdtemp(prefix="torchloom-replay-zoo-"))
    for name in model_zoo.ZOO:
        for mode in ("step", "infer", "dynamic"):
            if (name, mode) not in model_zoo.rows([name], [mode]):
                continue
            torch._dynamo.reset()  # (one process: every model below the recompile limit)
            side = model_zoo.make_side(name, mode, "torchloom", cache)
            print(f"{name} {mode}: compiled in {side.first_call_s:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
