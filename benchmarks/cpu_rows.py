"""The issue-14 CPU rows at the issue's sizes: ``row(name) -> (callable, inputs, train)``.

Shared by the cpu codegen benchmark (``test_codegen_cpu_bench.py``), its compile-time
benchmark (``test_codegen_cpu_compile.py``, whose fresh processes time from after
``import torch``: so nothing here imports torchloom at module level) and the eager-codegen
benchmark (``test_eager_codegen.py``).
"""

from __future__ import annotations

from pathlib import Path

import torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NAMES = ("gelu_bookend", "layer_norm_residual_gelu", "bias_gelu_bf16", "softmax", "lstm_cell",
         "mlp_block_training_step")


def _ln_residual_gelu(x, r, w, b):
    h = torch.nn.functional.layer_norm(x + r, (x.shape[-1],), w, b)
    return torch.nn.functional.gelu(h) * 0.5 + r


def _bias_gelu(y, b):
    return torch.nn.functional.gelu(y + b)


def _softmax(x):
    return torch.softmax(x, dim=-1)


class _MLPBlock(torch.nn.Module):
    def __init__(self, dim=512, hidden=2048):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


def _workload(file: str, name: str):
    from torchloom.tools import import_workload
    return getattr(import_workload(EXAMPLES / file), name)


def row(name: str):
    """(callable, inputs, train) at the issue's sizes."""
    torch.manual_seed(0)
    if name == "layer_norm_residual_gelu":
        return _ln_residual_gelu, [torch.randn(2048, 1024), torch.randn(2048, 1024),
                                   torch.rand(1024) + 0.5, torch.randn(1024)], False
    if name == "gelu_bookend":
        return _workload("gelu_bookend.py", "gelu_bookend"), [torch.randn(1024, 3072)], False
    if name == "softmax":
        return _softmax, [torch.randn(2048, 1024)], False
    if name == "lstm_cell":
        batch, hidden = 64, 1024
        shapes = [(batch, hidden), (batch, hidden), (batch, hidden), (4 * hidden, hidden),
                  (4 * hidden, hidden), (4 * hidden,), (4 * hidden,)]
        return _workload("lstm_cell.py", "lstm_cell"), [torch.randn(*s) * 0.3 for s in shapes], \
            False
    if name == "bias_gelu_bf16":
        return _bias_gelu, [torch.randn(2048, 3072, dtype=torch.bfloat16),
                            torch.randn(3072, dtype=torch.bfloat16)], False
    if name == "mlp_block_training_step":
        return _MLPBlock(), [torch.randn(1024, 512, requires_grad=True)], True
    raise KeyError(f"no CPU row {name!r}; rows: {', '.join(NAMES)}")


def step(fn, inputs, train):
    """One call of the row (and its backward when it trains), returning nothing."""
    if not train:
        def run():
            with torch.no_grad():
                fn(*inputs)
        return run

    def run_train():
        fn(*inputs).sum().backward()  # parameter grads accumulate alike on every side
    return run_train
