"""An LSTM cell unrolled over 8 time steps (the seed of kernel dedup, PyTorch PR #14541):
every step's pointwise gate math is the same fusion group, so it compiles once. Forward
and backward."""
import torch

from lstm_cell import lstm_cell  # the file beside this one

STEPS = 8


def lstm_unrolled(xs, hx, cx, w_ih, w_hh, b_ih, b_hh):
    outputs = []
    for t in range(xs.shape[0]):
        hx, cx = lstm_cell(xs[t], hx, cx, w_ih, w_hh, b_ih, b_hh)
        outputs.append(hx)
    return torch.stack(outputs), cx


def workload(device="cpu"):
    torch.manual_seed(0)
    batch, inp, hidden = 4, 16, 32

    def t(*shape):
        return (torch.randn(*shape, device=device) * 0.3).requires_grad_()

    return lstm_unrolled, [t(STEPS, batch, inp), t(batch, hidden), t(batch, hidden),
                           t(4 * hidden, inp), t(4 * hidden, hidden), t(4 * hidden),
                           t(4 * hidden)]
