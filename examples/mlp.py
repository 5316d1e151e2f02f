"""A two-layer MLP with GELU, forward and backward."""
import torch


def workload(device="cpu"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 16)).to(device)
    x = torch.randn(8, 32, device=device)
    return model, [x]
