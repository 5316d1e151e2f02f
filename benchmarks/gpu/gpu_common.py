"""What the GPU suites share: the CUDA-only marks, the examples they time, and appending
a result to the JSON file named by ``TORCHLOOM_BENCH_JSON``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from torchloom.tools import import_workload

#: ``pytestmark`` of every GPU suite: marked ``cuda``, skipped cleanly without a GPU
CUDA_ONLY = [pytest.mark.cuda,
             pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: the LSTM cell step of examples/lstm_cell.py
lstm_cell = import_workload(EXAMPLES / "lstm_cell.py").lstm_cell


def append_json(section: str, result: dict) -> None:
    """Append ``result`` to the list ``section`` of the ``TORCHLOOM_BENCH_JSON`` file."""
    path = os.environ.get("TORCHLOOM_BENCH_JSON")
    if not path:
        return
    data = {}
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
    data.setdefault(section, []).append(result)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
