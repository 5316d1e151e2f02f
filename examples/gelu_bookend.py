"""GELU with bookend views (PyTorch issue "bookend view should be stripped from fusion").

The tensor is viewed to 3-D before GELU and back to 2-D after it. Eager runs the views as
free metadata changes around one GELU kernel; a fuser that keeps the views in its group
used to split it into two kernels. Full size (8192 x 3072 f32) on CUDA, small on CPU.
"""
import torch


def gelu_bookend(x):
    rows, cols = x.shape
    y = x.view(rows // 64, 64, cols)
    return torch.nn.functional.gelu(y).view(rows, cols)


def workload(device="cpu"):
    rows, cols = (8192, 3072) if str(device).startswith("cuda") else (256, 96)
    return gelu_bookend, [torch.randn(rows, cols, device=device)]
