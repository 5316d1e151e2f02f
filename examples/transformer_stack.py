"""A stack of identical pre-norm transformer layers (attention + GELU MLP), forward and
backward: the workload for ``dedup.regions`` (one shared layer subgraph, called per layer).
``workload(layers=N)`` builds N layers (12 by default)."""
import torch
from torch import nn

from transformer_block import Block  # the file beside this one: one layer


class Stack(nn.Module):
    def __init__(self, layers=12, dim=32):
        super().__init__()
        self.layers = nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def workload(device="cpu", layers=12):
    torch.manual_seed(0)
    model = Stack(layers).to(device)
    x = torch.randn(2, 8, 32, device=device, requires_grad=True)
    return model, [x]
