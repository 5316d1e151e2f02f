"""LayerNorm then GELU, forward and backward: the training step of issue 15's traffic gate.
8192 x 3072 f32 on a GPU or when traced for one (``explain --target``: the meta device),
small on the CPU."""
import torch


def workload(device="cpu"):
    rows, cols = (32, 96) if str(device) == "cpu" else (8192, 3072)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(cols), torch.nn.GELU()).to(device)
    with torch.no_grad():
        model[0].weight.uniform_(0.5, 1.5)
        model[0].bias.uniform_(-0.5, 0.5)
    x = torch.randn(rows, cols, device=device, requires_grad=True)
    return model, [x]
