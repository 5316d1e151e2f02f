"""GELU without views: the baseline the bookend-view workload must match."""
import torch


def workload(device="cpu"):
    rows, cols = (8192, 3072) if str(device).startswith("cuda") else (256, 96)
    return torch.nn.functional.gelu, [torch.randn(rows, cols, device=device)]
