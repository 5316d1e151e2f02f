"""Max pooling of NCHW tensors through eager's channels-last kernel (``library_call``).

Eager's ``max_pool2d_with_indices`` over a contiguous NCHW tensor walks each output's
window element by element; over a channels-last one it runs SIMD loops along the channels.
ResNet's stem, ``[2, 32, 112, 112]``, 3 x 3 windows, stride 2, padding 1 (2 threads, AMD
Zen 4, RESULTS.md session 65): 3,148 us NCHW against 667 us for the copy to channels-last,
the channels-last pooling and the copies of its two outputs back; ``[2, 64, 56, 56]`` 1,570
against 492. The two kernels compare and pick alike: the same values and indices, bit for
bit (NaN, inf and -0.0 in the windows, ties), for f32 and f64 (bf16's differ: not taken).
Small pools lose to the copies (``[2, 16, 32, 32]``, 2 x 2: 39 against 145 us), so only
pools of ``MIN_WORK`` window elements and ``MIN_CHANNELS`` channels or more are offered.
"""

from __future__ import annotations

import torch

from torchloom.api import TensorType

OP = "aten.max_pool2d_with_indices.default"
#: output elements times window elements below which eager's NCHW kernel is kept
MIN_WORK = 1 << 19
#: channels below which eager's NCHW kernel is kept (the channels-last one runs along them)
MIN_CHANNELS = 16


def _window(node) -> int:
    kernel = node.attrs.get("kernel_size")
    if not isinstance(kernel, (list, tuple)) or not kernel:
        return 0
    kh, kw = (kernel[0], kernel[0]) if len(kernel) == 1 else kernel[:2]
    return kh * kw if isinstance(kh, int) and isinstance(kw, int) else 0


def offered(node) -> bool:
    """Whether ``node`` is a max pooling of a static contiguous NCHW f32/f64 CPU tensor big
    enough to gain (its layout is checked again at each call)."""
    if node.op != OP or not node.inputs or not node.outputs:
        return False
    x, out = node.inputs[0].type, node.outputs[0].type
    if not (isinstance(x, TensorType) and isinstance(out, TensorType)) or \
            x.device != "cpu" or x.dtype not in ("f32", "f64") or len(x.shape) != 4 or \
            not x.is_static or not out.is_static:
        return False
    n, c, h, w = x.shape
    if tuple(x.actual_strides()) != (c * h * w, h * w, w, 1) or c < MIN_CHANNELS:
        return False
    on, oc, oh, ow = out.shape
    return on * oc * oh * ow * _window(node) >= MIN_WORK


def max_pool(x: torch.Tensor, *args, **kwargs):
    """``max_pool2d_with_indices(x, *args, **kwargs)``: through a channels-last copy of
    ``x`` where ``x`` is a contiguous 4-D tensor, both outputs contiguous again (as
    eager's are from such an input); else eager's op as it is."""
    op = torch.ops.aten.max_pool2d_with_indices.default
    if x.dim() != 4 or not x.is_contiguous() or x.is_contiguous(
            memory_format=torch.channels_last) or x.device.type != "cpu" or \
            (torch.is_grad_enabled() and x.requires_grad):
        return op(x, *args, **kwargs)
    values, indices = op(x.contiguous(memory_format=torch.channels_last), *args, **kwargs)
    return values.contiguous(), indices.contiguous()


__all__ = ["MIN_CHANNELS", "MIN_WORK", "OP", "max_pool", "offered"]
