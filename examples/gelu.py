"""GELU on a 2-D tensor: one pointwise op."""
import torch


def workload(device="cpu"):
    x = torch.randn(64, 48, device=device)
    return torch.nn.functional.gelu, [x]
