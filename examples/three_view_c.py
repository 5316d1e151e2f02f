"""Three-view study, case C: views at both ends and in the middle."""
import torch


def views_everywhere(x):
    rows, cols = x.shape
    y = (x.view(rows // 64, 64, cols) + 1.0).view(rows, cols)
    return (y * 2.0).view(rows // 64, 64, cols)


def workload(device="cpu"):
    rows, cols = (8192, 3072) if str(device).startswith("cuda") else (256, 96)
    return views_everywhere, [torch.randn(rows, cols, device=device)]
