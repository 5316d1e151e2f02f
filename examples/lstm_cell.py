"""One LSTM cell step written out (as in the nvFuser LSTM benchmarks): two matmuls, then
bias adds, the gate chunk, four activations and the cell update. Forward and backward."""
import torch


def lstm_cell(x, hx, cx, w_ih, w_hh, b_ih, b_hh):
    gates = x @ w_ih.t() + hx @ w_hh.t() + b_ih + b_hh
    ingate, forgetgate, cellgate, outgate = gates.chunk(4, 1)
    ingate = torch.sigmoid(ingate)
    forgetgate = torch.sigmoid(forgetgate)
    cellgate = torch.tanh(cellgate)
    outgate = torch.sigmoid(outgate)
    cy = forgetgate * cx + ingate * cellgate
    hy = outgate * torch.tanh(cy)
    return hy, cy


def workload(device="cpu"):
    torch.manual_seed(0)
    batch, inp, hidden = 8, 16, 32

    def t(*shape):
        return (torch.randn(*shape, device=device) * 0.3).requires_grad_()

    return lstm_cell, [t(batch, inp), t(batch, hidden), t(batch, hidden),
                       t(4 * hidden, inp), t(4 * hidden, hidden), t(4 * hidden), t(4 * hidden)]
