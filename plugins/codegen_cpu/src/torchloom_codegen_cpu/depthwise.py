"""The backward of depthwise 2-D convolutions on the CPU (ConvNeXt's 7x7 blocks,
MobileNet's and EfficientNet's 3x3 and 5x5): ``aten.convolution_backward`` of f32 tensors
with one filter per channel, as loops over the channels (depthwise.c).

Eager (and Inductor, which calls eager's op) sends them to oneDNN, whose weight gradient
is slow here: on the 2-vCPU Intel Xeon of ``benchmarks/RESULTS.md``, ConvNeXt's four block
shapes (``[2, C, 56^2 .. 7^2]``, C = 32 .. 256, 7x7, channels-last) took 0.7-1.9 ms a
backward, 12 ms of a 55 ms training step. depthwise.c walks the channels as the inner loop
(the channels-last layout makes them contiguous), a few pixels at once with their sums in
registers: the backward 3.5-4x eager's speed (2 threads). The forward is eager's op: the
same loops were 0.9-1.2x its speed alone, and slower in the models (ConvNeXt's inference
step 2.4 % faster, its training step 1.1 %, with eager's forward: ``benchmarks/RESULTS.md``,
session 70).

Values are eager's within float rounding: an input gradient element's products are summed
in f32 by fused multiply-adds in another order; the weight's gradient, a sum over every
output element, is summed in f32 over rows of at least 64 output pixels together and in
double across those and threads (tests/codegen_cpu/test_cpu_depthwise.py compares with
eager's op). A tap outside the input is skipped, never multiplied by a zero (an infinite
tap gives no NaN there, as eager's). Outputs have eager's layouts: for channels-last calls
the input's gradient channels-last, the weight's gradient in the weight's channels-last
strides; for contiguous ones all contiguous; the bias's gradient contiguous.

Contiguous (channels-first) calls are copied to channels-last for the loops and their
results back (eager's oneDNN path is slower still there: ConvNeXt's first stage's backward
took 5.5 ms, 1.4 ms so).

Anything else calls eager's op: a dtype other than f32, a transposed convolution, a
filter count other than the channels (a channel multiplier), an input and an output
gradient not both channels-last or both contiguous (or both at once: one channel or one
pixel, whose layouts eager picks by other rules; a contiguous input with a weight of other
strides), a tensor subclass, a tensor that needs its gradient under grad mode, a kernel
taller than 64 rows, or a build whose results on small cases (checked once) are not
eager's. Gradients ``output_mask`` does not ask for are None (eager's oneDNN path gives
the weight's with the bias's).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch._prims_common import suggest_memory_format

from torchloom.api import TensorType

from torchloom_codegen_cpu.deferred import Ahead

log = logging.getLogger("torchloom.codegen_cpu")

BACKWARD = "aten.convolution_backward.default"
#: the ops this module takes (the forward, ``aten.convolution``, stays eager's)
OPS = (BACKWARD,)
#: the tallest kernel depthwise.c takes (its ``TL_DW_MAX_KH``)
MAX_KH = 64

_DEPTHWISE = (Path(__file__).parent / "depthwise.c").read_text


def source() -> str:
    """The library's translation unit (depthwise.c)."""
    return _DEPTHWISE()


def offered(node) -> bool:
    """Whether ``node`` may be the backward of a depthwise f32 CPU convolution, by its
    types and arguments (the layout is checked at each call)."""
    if node.op != BACKWARD or len(node.inputs) < 3:
        return False
    x, w = node.inputs[1].type, node.inputs[2].type  # (after grad_output)
    if not (isinstance(x, TensorType) and isinstance(w, TensorType)) or \
            x.device != "cpu" or x.dtype != "f32" or w.dtype != "f32" or \
            len(x.shape) != 4 or len(w.shape) != 4:
        return False
    groups, channels = node.attrs.get("groups"), x.shape[1]
    return node.attrs.get("transposed") is False and isinstance(channels, int) and \
        groups == channels == w.shape[0] and w.shape[1] == 1 and \
        isinstance(w.shape[2], int) and w.shape[2] <= MAX_KH


_P, _I = ctypes.c_void_p, ctypes.c_int
_INPUT_SIGNATURE = ctypes.CFUNCTYPE(_I, _I, _P, _P, _P, _P)
_WEIGHT_SIGNATURE = ctypes.CFUNCTYPE(_I, _I, _P, _P, _P, _P, _P)


#: the tensor types read by pointer (a subclass may hold its data elsewhere)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _plain4(t) -> bool:
    return type(t) in _PLAIN and t.dtype is torch.float32 and t.is_cpu and t.dim() == 4


def _layout(tensors, weight) -> str | None:
    """``"last"`` where every tensor is laid out channels-last and not also contiguous and
    eager lays out its results channels-last, ``"first"`` where every one is contiguous
    and not also channels-last, the weight has a contiguous weight's strides and eager lays
    out its results contiguous, else None (one channel or one pixel is both layouts, a
    weight's strides can make eager's results channels-last: eager picks those layouts by
    its own rules). Eager's rule (oneDNN's, ``mkldnn_conv_use_channels_last``): results
    channels-last where the input's or the weight's suggested memory format is; that
    reads the strides of dims of size 1 (``[N, C, H, 1]`` strided ``(C * H, 1, C, 1)`` is
    channels-last for ``is_contiguous`` and not for it), so it is asked too."""
    if not all(_plain4(t) for t in (*tensors, weight)):
        return None
    last = [t.is_contiguous(memory_format=torch.channels_last) for t in tensors]
    first = [t.is_contiguous() for t in tensors]
    eager_last = torch.channels_last in (suggest_memory_format(tensors[0]),
                                         suggest_memory_format(weight))
    if all(last) and not any(first):
        return "last" if eager_last else None
    KH, KW = weight.shape[2], weight.shape[3]
    if all(first) and not any(last) and weight.stride() == (KH * KW, KH * KW, KW, 1) and \
            not eager_last:
        return "first"
    return None


def _pair(v) -> tuple[int, int] | None:
    v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    v = v * 2 if len(v) == 1 else v
    return (int(v[0]), int(v[1])) if len(v) == 2 and all(isinstance(i, int) for i in v) \
        else None


class Depthwise:
    """Eager's depthwise convolution backward, f32 calls by loops over the channels (see
    the module's doc); the C functions come from ``library()`` (a path to the built
    :func:`source`), loaded and checked on the first call that can use them."""

    def __init__(self, library: Callable[[], Path]):
        self._library = Ahead("depthwise", library, "depthwise convolution",
                              "depthwise convolutions run as eager's op")
        #: (input gradient, weight gradient), or None (eager's op), once loaded
        self._functions: tuple | None = None
        self._loaded_once = False

    def build_ahead(self) -> None:
        """Start building the library on a thread, once (the first call waits for it; an
        error is its to report)."""
        if not self._loaded_once:
            self._library.start()

    def ready(self) -> bool:
        """Whether a call would not wait for the library."""
        return self._loaded_once or self._library.ready()

    def _loaded(self) -> tuple | None:
        if not self._loaded_once:
            self._functions = self._load()
            self._loaded_once = True
        return self._functions

    def _load(self) -> tuple | None:
        lib = self._library.open(log)
        if lib is None:
            return None
        functions = (_INPUT_SIGNATURE(("tl_dw_bwd_input_f32", lib)),
                     _WEIGHT_SIGNATURE(("tl_dw_bwd_weight_f32", lib)))
        if not _agrees(functions):
            log.warning("torchloom: cpu codegen: the depthwise convolution library differs "
                        "from eager's op on a check case; depthwise convolutions run as "
                        "eager's op")
            return None
        return functions

    def backward(self, grad_output, input, weight, bias_sizes, stride, padding, dilation,
                 transposed, output_padding, groups, output_mask):
        """``aten.convolution_backward``: the gradients ``output_mask`` asks for (None for
        the others)."""
        found = None
        layout = _fast(input, weight, transposed, groups, (input, grad_output))
        if layout is not None and (functions := self._loaded()) is not None:
            found = _backward(functions[0], functions[1], _last(grad_output, layout),
                              _last(input, layout), weight, stride, padding, dilation,
                              output_mask, layout)
        if found is None:
            return torch.ops.aten.convolution_backward.default(
                grad_output, input, weight, bias_sizes, stride, padding, dilation,
                transposed, output_padding, groups, output_mask)
        return found


def _last(t, layout: str):
    """``t`` channels-last (a copy where it is contiguous: depthwise.c reads channels as
    its inner loop)."""
    return t.contiguous(memory_format=torch.channels_last) if layout == "first" else t


def _fast(input, weight, transposed, groups, layouts) -> str | None:
    """The layout (:func:`_layout`) where depthwise.c takes the call: plain f32 CPU
    tensors, one filter per channel, not transposed, nothing needing its gradient under
    grad mode; else None."""
    layout = _layout(layouts, weight)
    if transposed or layout is None:
        return None
    C = input.shape[1]
    if groups != C or weight.shape[0] != C or weight.shape[1] != 1 or \
            weight.shape[2] > MAX_KH or C == 0 or 0 in input.shape:
        return None
    needs = torch.is_grad_enabled() and any(
        t.requires_grad for t in (*layouts, weight))
    return None if needs else layout


def _params(input, weight, stride, padding, dilation) -> list[int] | None:
    """depthwise.c's sizes (``g[]`` up to its strides: N, H, W, C, OH, OW, KH, KW, then
    strides, paddings and dilations), or None where those are not two ints each (positive;
    paddings not negative) or the output would be empty."""
    s, p, d = _pair(stride), _pair(padding), _pair(dilation)
    if s is None or p is None or d is None or min(*s, *d) < 1 or min(p) < 0:
        return None
    N, C, H, W = input.shape
    KH, KW = weight.shape[2], weight.shape[3]
    OH = (H + 2 * p[0] - d[0] * (KH - 1) - 1) // s[0] + 1
    OW = (W + 2 * p[1] - d[1] * (KW - 1) - 1) // s[1] + 1
    return [N, H, W, C, OH, OW, KH, KW, *s, *p, *d] if OH > 0 and OW > 0 else None


def _geometry(sizes: list[int], a, b, w) -> ctypes.Array:
    """``g[]``: ``sizes``, the n, h, w strides of ``a`` and ``b``, the c, kh, kw strides of
    the weight (or of its gradient) ``w``."""
    sa, sb, sw = a.stride(), b.stride(), w.stride()
    g = [*sizes, sa[0], sa[2], sa[3], sb[0], sb[2], sb[3], sw[0], sw[2], sw[3]]
    return (ctypes.c_int64 * len(g))(*g)  # (depthwise.c's G_SIZE)


def _backward(grad_input_fn, grad_weight_fn, grad_output, input, weight, stride, padding,
              dilation, output_mask, layout: str = "last"):
    """The gradients from channels-last ``grad_output`` and ``input``, laid out as eager
    lays them out for ``layout``'s (:func:`_layout`), or None where eager's op must run."""
    sizes = _params(input, weight, stride, padding, dilation)
    if sizes is None or tuple(grad_output.shape) != (*input.shape[:2], *sizes[4:6]):
        return None
    threads = torch.get_num_threads()
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        grad_input = torch.empty(input.shape, dtype=torch.float32,
                                 memory_format=torch.channels_last)
        if grad_input_fn(threads, grad_output.data_ptr(), weight.data_ptr(),
                         grad_input.data_ptr(),
                         _geometry(sizes, grad_output, grad_input, weight)):
            raise _out_of_memory()
        if layout == "first":
            grad_input = grad_input.contiguous()
    if output_mask[1] or output_mask[2]:
        # (written whole either way: the sums give both)
        grad_weight = torch.empty(weight.shape, dtype=torch.float32, memory_format=(
            torch.contiguous_format if layout == "first" else torch.channels_last))
        grad_bias = torch.empty((input.shape[1],), dtype=torch.float32) \
            if output_mask[2] else None
        if grad_weight_fn(threads, grad_output.data_ptr(), input.data_ptr(),
                          grad_weight.data_ptr(),
                          grad_bias.data_ptr() if grad_bias is not None else None,
                          _geometry(sizes, grad_output, input, grad_weight)):
            raise _out_of_memory()
        if not output_mask[1]:
            grad_weight = None
    return grad_input, grad_weight, grad_bias


def _out_of_memory() -> MemoryError:
    return MemoryError("torchloom: cpu depthwise convolution: out of memory for its taps "
                       "or its sums")


def _check_cases():
    """Small cases: borders, channels past the last block of 16, strides, dilation,
    a bias and none: ``(x, w, bias, stride, padding, dilation)`` each."""
    g = torch.Generator().manual_seed(0)

    def case(C, H, W, K, s, p, d, bias):
        x = torch.randn(2, C, H, W, generator=g).to(memory_format=torch.channels_last)
        w = torch.randn(C, 1, K, K, generator=g)
        return x, w, torch.randn(C, generator=g) if bias else None, [s, s], [p, p], [d, d]
    return [case(20, 9, 11, 3, 1, 1, 1, True), case(33, 12, 10, 5, 2, 2, 1, False),
            case(16, 8, 8, 3, 1, 2, 2, True)]


def _close(got, want) -> bool:
    return all((a is None and b is None) or (a is not None and b is not None and
               a.shape == b.shape and a.stride() == b.stride() and
               torch.allclose(a, b, rtol=1e-4, atol=1e-4)) for a, b in zip(got, want))


def _agrees(functions) -> bool:
    """Whether the library gives eager's gradients and layouts on :func:`_check_cases`,
    laid out channels-last and contiguous."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(1)  # (never the caller's random stream)
    with torch.no_grad():
        for x, w, b, s, p, d in _check_cases():
            for layout, x in (("last", x), ("first", x.contiguous())):
                C = x.shape[1]
                if _fast(x, w, False, C, (x,)) != layout:
                    return False
                out = aten.convolution.default(x, w, b, s, p, d, False, [0, 0], C)
                go = torch.randn(out.shape, generator=g).contiguous(memory_format=(
                    torch.contiguous_format if layout == "first" else torch.channels_last))
                mask = [True, True, b is not None]
                want = aten.convolution_backward.default(
                    go, x, w, [C] if b is not None else None, s, p, d, False, [0, 0], C, mask)
                got = _backward(functions[0], functions[1], _last(go, layout),
                                _last(x, layout), w, s, p, d, mask, layout)
                if got is None or not _close(got, want):
                    return False
    return True
