"""The views issue's GPU gate: GELU 8192x3072 f32 with bookend views costs what the same
GELU without views costs (within 3%), and no more than Inductor's bookend version; all
three measured in one run on the same inputs.

Run on a GPU: ``python -m pytest benchmarks/gpu/test_views_bench.py -s``.
"""

from __future__ import annotations

import pytest
import torch

from torchloom.workloads import load_workload

from gpu_common import CUDA_ONLY, EXAMPLES

pytestmark = CUDA_ONLY


def _compiled(name: str, backend: str):
    fn, inputs = load_workload(EXAMPLES / f"{name}.py", device="cuda")
    compiled = torch.compile(fn, backend=backend)
    with torch.no_grad():
        compiled(*inputs)  # compile outside the timed rounds
    return compiled, inputs


def test_gelu_bookend_views_cost_nothing(perf_gate):
    torch._dynamo.reset()
    bookend, inputs = _compiled("gelu_bookend", "torchloom")
    plain, _ = _compiled("gelu_plain", "torchloom")
    x = inputs[0]
    with torch.no_grad():
        perf_gate(bookend, plain, args=(x,),
                  min_speedup=0.97, sync=torch.cuda.synchronize,
                  names=("torchloom_bookend", "torchloom_plain"))


def test_gelu_bookend_at_or_under_inductor(perf_gate):
    torch._dynamo.reset()
    ours, inputs = _compiled("gelu_bookend", "torchloom")
    inductor, _ = _compiled("gelu_bookend", "inductor")
    with torch.no_grad():
        perf_gate(ours, inductor, args=tuple(inputs), min_speedup=1.0,
                  sync=torch.cuda.synchronize, names=("torchloom", "inductor"))
