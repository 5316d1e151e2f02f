"""LayerNorm over the last dim with weight and bias, forward and backward."""
import torch


def workload(device="cpu"):
    torch.manual_seed(0)
    model = torch.nn.LayerNorm(96).to(device)
    with torch.no_grad():
        model.weight.uniform_(0.5, 1.5)
        model.bias.uniform_(-0.5, 0.5)
    x = torch.randn(32, 96, device=device, requires_grad=True)
    return model, [x]
