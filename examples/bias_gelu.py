"""A linear layer followed by GELU: the bias add joins the GELU group beside the matmul.
Forward and backward."""
import torch


def workload(device="cpu"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU()).to(device)
    x = torch.randn(16, 48, device=device, requires_grad=True)
    return model, [x]
