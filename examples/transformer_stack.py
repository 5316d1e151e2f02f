"""A stack of identical pre-norm transformer layers (attention + GELU MLP), forward and
backward: the workload for ``dedup.regions`` (one shared layer subgraph, called per layer).
``workload(layers=N)`` builds N layers (12 by default)."""
import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for t in (q, k, v))
        att = torch.softmax((q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class Stack(nn.Module):
    def __init__(self, layers=12, dim=32):
        super().__init__()
        self.layers = nn.ModuleList(Layer(dim) for _ in range(layers))
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
