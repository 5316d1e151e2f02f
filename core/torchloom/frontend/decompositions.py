"""torch's decomposition table, with the arithmetic of eager's CPU kernels where it differs
from torch's decompositions (which follow the CUDA kernels).

- ``native_layer_norm`` without a bias: eager's CPU kernel computes ``(x * rstd - mean *
  rstd) * gamma + beta`` with ``gamma = 1`` and ``beta = 0`` where they are not given, so
  a zero result is ``+0.0``; the decomposition's ``(x - mean) * rstd`` gives ``-0.0`` for
  an element ``-0.0`` on a row whose mean is ``+0.0``. On the CPU it adds ``0.0`` last
  (one vector add per element; CUDA's kernel adds no zero, so elsewhere it does not).
  A row whose variance overflows (``[1e30, -1e30, 0.5e30, 1.0]`` in f32: the squares pass
  f32's largest value) has NaN for ``rstd`` and every element, as eager's kernel gives,
  where the decomposition's ``rsqrt(inf)`` is 0 and normalizes the row to zeros (which
  hides exploding activations; the gradients were 0 too). Every device: a silent 0 is
  never the answer.

- ``_softmax_backward_data``: eager's CPU kernels compute ``y * (g - sum(g * y))`` where
  the decomposition computes ``g * y - y * sum(g * y)``: where ``y`` is 0 (a masked
  element) and ``g - sum`` is negative, eager's gradient is ``-0.0`` and the
  decomposition's ``+0.0`` (and the two round differently elsewhere). On the CPU the
  gradient is computed as eager's (in f32 for bf16/f16, as eager and the decomposition
  do).

- ``_safe_softmax`` (SDPA's math path, which training on the CPU takes): torch's
  decomposition makes a tensor of zeros (``zeros_like``, a factory no group fuses) for the
  rows of -inf; on the CPU ``masked_fill`` writes a scalar 0 there (the same values, one
  group; the Triton codegen has no ``masked_fill``, so elsewhere torch's stays).

- ``slice_backward`` (a slice's gradient: eager fills a tensor of zeros, then copies the
  gradient into the slice: a factory and a copy outside any kernel, twice per rotary
  embedding): on the CPU, for static sizes along the sliced dim, the
  gradient read through views that tile it along the dim (``unsqueeze``, ``expand``,
  ``reshape``, ``slice``: element ``c`` reads ``grad[(c - start) mod length]``, always in
  bounds) and ``masked_fill`` with 0 outside ``[start, start + length)`` (a mask from
  ``arange`` over the dim). A step above 1 (Swin's patch merging takes every other row
  and column) first spreads the gradient by views, element ``c`` reading ``grad[c //
  step]``, and masks the elements between the steps too. Every op is pointwise or a view
  but ``arange``, so the zeros are written by the kernel that reads the gradient.

- ``nll_loss_backward`` without class weights (cross entropy's gradient: eager fills a
  ``[N, C]`` tensor of zeros and writes one element per row): on the CPU ``-(g /
  total_weight)`` (``-g`` without the mean) where ``arange(C) == target`` and the target
  is not ``ignore_index``, 0 elsewhere, as eager's kernel computes it; the log_softmax
  gradient's kernel then reads the targets instead of the zeros. A target out of range
  gives a row of zeros where eager raises (the forward's ``nll_loss`` raises first).

- ``cat`` of tensors of one rank along a dim of int sizes, other dims any (rotary embeddings'
  ``rotate_half``, ``cat((-x2, x1), -1)``, four per layer): on the CPU each piece read
  through the views that tile it along the dim (as the slice's gradient above: element
  ``c`` reads ``piece[(c - offset) mod length]``) and the pieces chosen by ``where`` on the
  dim's index, each first cast to the result's dtype. The kernel reading the
  concatenation (``q * cos + rotate_half(q) * sin``) computes it, where eager (and a
  codegen given the ``cat``) writes it out and reads it back.

- ``max_pool2d_with_indices`` with a dilation of 1 and a floating dtype, on the CPU: each
  window element read through a view of the input padded by tiling (as the slice's
  gradient above) and sliced with the stride, kept where it is greater than the maximum
  so far or NaN (eager's loop: the first of equal values stays, ``-0.0`` before ``+0.0``
  included), and its index likewise, from the window's first element inside the input;
  positions outside the input are never kept. Bit for bit eager's values and indices (NaN
  payloads aside), laid out as eager's (channels-last where the input suggests it: then
  pooled over an NHWC view). ``fusion.decompose`` uses it where it pays (channels-last,
  indices unread).

- ``roll`` along dims of int sizes, on the CPU: the input read through the views that tile
  it along each rolled dim (element ``c`` reads ``x[(c - shift) mod n]``, as above), then
  copied contiguous (eager's ``roll`` is two ``cat`` calls a dim on the CPU: Swin's shifted
  windows roll twice a block). The kernel reading the rolled tensor computes it.

- ``constant_pad_nd`` on the CPU, pads of int sizes along dims of int sizes: negative pads
  narrow the input, positive ones tile it along the dim (as above) and ``masked_fill`` the
  value outside it; all pads 0 is a ``clone``. Laid out as eager's (the layout the input
  suggests). The kernel reading the padded tensor computes it.

Used by the backend (the composites decomposed before aot_autograd's split) and by
``fusion.decompose`` (through ``torchloom.api``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any


def decomposition_table(ops: Iterable[Any], device: str | None = None) -> dict[Any, Callable]:
    """``torch._decomp.get_decompositions(ops)`` with the CPU's overrides above. ``device``:
    where the traced op runs (``"cpu"``, ``"cuda"``, ...); None: read from the traced
    input's device at trace time (give it when tracing on meta tensors)."""
    import torch
    from torch._decomp import get_decompositions
    table = get_decompositions(list(ops))
    # eager's CPU arithmetic where torch's decomposition differs from it
    as_cpu = {torch.ops.aten.native_layer_norm.default: _layer_norm_as_cpu,
              torch.ops.aten._softmax_backward_data.default: _softmax_backward_as_cpu,
              torch.ops.aten._safe_softmax.default: _safe_softmax_as_cpu,
              torch.ops.aten.slice_backward.default: _slice_backward_as_cpu,
              torch.ops.aten.nll_loss_backward.default: _nll_loss_backward_as_cpu,
              torch.ops.aten.cat.default: _cat_as_cpu,
              torch.ops.aten.max_pool2d_with_indices.default: _max_pool2d_as_cpu,
              torch.ops.aten.roll.default: _roll_as_cpu,
              torch.ops.aten.constant_pad_nd.default: _constant_pad_as_cpu}
    for op, wrap in as_cpu.items():
        if op in table:
            table[op] = wrap(table[op], device)
    return table


def _tiled(t, d: int, first: int, n: int):
    """``t`` read along dim ``d`` as ``n`` elements of which element ``c`` is
    ``t[(c - first) mod length]`` (``length``: ``t``'s size there): views only, every
    element in bounds."""
    length = t.shape[d]
    offset = (-first) % length  # tiled[offset + c] is t[(c - first) mod length]
    copies = -(-(offset + n) // length)
    sizes = list(t.shape)
    tiled = t.unsqueeze(d).expand(*sizes[:d], copies, *sizes[d:])
    tiled = tiled.reshape(*sizes[:d], copies * length, *sizes[d + 1:])
    return tiled.narrow(d, offset, n)


def _dim_index(n: int, d: int, rank: int, device):
    """``arange(n)`` along dim ``d`` of a tensor of ``rank`` dims (size 1 elsewhere)."""
    import torch
    return torch.arange(n, device=device).view([n if k == d else 1 for k in range(rank)])


def _slice_backward_as_cpu(decomposed: Callable, device: str | None) -> Callable:
    """The gradient tiled along ``dim`` by views and masked outside the slice (see the
    module docstring); torch's ``new_zeros`` + ``slice_scatter`` elsewhere."""
    def slice_backward(grad_output, input_sizes, dim, start, end, step):
        rank = len(input_sizes)
        d = dim % rank
        n, length = input_sizes[d], grad_output.shape[d]
        # (symbolic sizes along dim, or nothing to pad: torch's)
        if (device or grad_output.device.type) != "cpu" or type(step) is not int or \
                step < 1 or type(n) is not int or type(length) is not int or \
                not 0 < length < n:
            return decomposed(grad_output, input_sizes, dim, start, end, step)
        first = min(max(start + n if start < 0 else start, 0), n)
        index = _dim_index(n, d, rank, grad_output.device)
        outside = (index < first) | (index >= first + length * step)
        grad = grad_output
        if step > 1:  # element c of the spread gradient is grad[c // step]
            sizes = list(grad.shape)
            grad = grad.unsqueeze(d + 1).expand(*sizes[:d + 1], step, *sizes[d + 1:])
            grad = grad.reshape(*sizes[:d], length * step, *sizes[d + 1:])
            outside = outside | ((index - first).remainder(step) != 0)
        return _tiled(grad, d, first, n).masked_fill(outside, 0)
    return slice_backward


def _cat_as_cpu(decomposed: Callable, device: str | None) -> Callable:
    """Each piece tiled along ``dim`` by views, chosen by ``where`` on the dim's index (see
    the module docstring); torch's ``cat`` where the sizes along ``dim`` are not ints, a
    piece is empty or of another rank, or off the CPU."""
    import torch

    def cat(tensors, dim=0):
        tensors = list(tensors)
        rank = tensors[0].dim() if tensors else 0
        if not tensors or rank == 0 or \
                (device or tensors[0].device.type) != "cpu" or len(tensors) < 2 or \
                any(t.dim() != rank or type(t.shape[dim % rank]) is not int or
                    t.shape[dim % rank] == 0 for t in tensors):
            return torch.ops.aten.cat.default(tensors, dim)
        d = dim % rank
        dtype = _promoted(tensors)  # (every piece has dims: no 0-dim tensor's lower rank)
        firsts, n = [], 0
        for t in tensors:
            firsts.append(n)
            n += t.shape[d]
        index = _dim_index(n, d, rank, tensors[0].device)
        pieces = [_tiled(t.to(dtype), d, first, n) for t, first in zip(tensors, firsts)]
        result = pieces[-1]
        for piece, first in zip(pieces[-2::-1], firsts[-1:0:-1]):
            result = torch.where(index < first, piece, result)
        return result
    return cat


def _max_pool2d_as_cpu(decomposed: Callable, device: str | None) -> Callable:
    """Each window element read through a padded view of the input (tiled along H and W:
    ``_tiled``) sliced with the stride, and kept as eager's loop keeps it where it is inside
    the input and greater than the maximum so far or NaN; the index of the element kept
    likewise, starting at the window's first element inside the input (see the module
    docstring). torch's decomposition off the CPU, for integer dtypes, a dilation other
    than 1 or sizes that are not ints."""
    import torch

    def max_pool2d_with_indices(self, kernel_size, stride=(), padding=(0,), dilation=(1,),
                                ceil_mode=False):
        def pair(v, default):
            v = list(v) if isinstance(v, (list, tuple)) else [v]
            v = v or list(default)
            return v * 2 if len(v) == 1 else v
        k, p, dil = pair(kernel_size, ()), pair(padding, (0,)), pair(dilation, (1,))
        s = pair(stride, k)
        if self.dim() in (3, 4) and any(type(d) is int and d == 0 for d in self.shape[-3:]):
            # (eager's check: a batch of 0 runs)
            raise RuntimeError("Expected 3D or 4D (batch mode) tensor with optional 0 dim "
                               f"batch size for input, but got:{list(self.shape)}")
        if (device or self.device.type) != "cpu" or not self.dtype.is_floating_point or \
                self.dim() not in (3, 4) or dil != [1, 1] or \
                any(type(n) is not int for n in (*self.shape[-2:], *k, *s, *p)) or \
                any(n <= 0 for n in (*self.shape[-2:], *k, *s)) or \
                any(2 * pad > kk for pad, kk in zip(p, k)):
            return decomposed(self, kernel_size, stride, padding, dilation, ceil_mode)
        # eager's output has the layout the input suggests (channels-last or
        # contiguous): pooled over H and W of an NHWC view where channels-last; other
        # layouts read as a contiguous copy, as eager's kernel reads them
        from torch._prims_common import suggest_memory_format
        nhwc = self.dim() == 4 and suggest_memory_format(self) == torch.channels_last
        if not nhwc and not self.is_contiguous():
            self = self.contiguous()
        x = self.permute(0, 2, 3, 1) if nhwc else self
        rank, dims = x.dim(), ((1, 2) if nhwc else (self.dim() - 2, self.dim() - 1))
        sizes = self.shape[-2:]
        outs = [_pooled_size(n, kk, ss, pp, ceil_mode) for n, kk, ss, pp in zip(sizes, k, s, p)]
        if min(outs) < 1:  # (eager raises: so does torch's decomposition)
            return decomposed(self, kernel_size, stride, padding, dilation, ceil_mode)
        padded = x
        for i, d in enumerate(dims):
            n = max(sizes[i] + 2 * p[i], (outs[i] - 1) * s[i] + k[i])
            padded = _tiled(padded, d, p[i], n)
        starts = [_dim_index(o, d, rank, self.device) * s[i] - p[i]
                  for i, (o, d) in enumerate(zip(outs, dims))]
        best = float("-inf")
        where = starts[0].clamp_min(0) * sizes[1] + starts[1].clamp_min(0)
        for kh in range(k[0]):
            rows = padded.narrow(dims[0], kh, (outs[0] - 1) * s[0] + 1)
            rows = rows[(slice(None),) * dims[0] + (slice(None, None, s[0]),)]
            row = starts[0] + kh
            row_inside = (row >= 0) & (row < sizes[0])
            for kw in range(k[1]):
                value = rows.narrow(dims[1], kw, (outs[1] - 1) * s[1] + 1)
                value = value[(slice(None),) * dims[1] + (slice(None, None, s[1]),)]
                col = starts[1] + kw
                inside = row_inside & (col >= 0) & (col < sizes[1])
                # eager's rule: greater than the maximum so far, or NaN, replaces it
                take = inside & ((value > best) | value.isnan())
                best = torch.where(take, value, best)
                where = torch.where(take, row * sizes[1] + col, where)
        if nhwc:
            best, where = best.permute(0, 3, 1, 2), where.permute(0, 3, 1, 2)
        layout = torch.channels_last if nhwc else torch.contiguous_format
        # (the selects' layout follows their operands': a dim of one element may order
        # them otherwise)
        return tuple(t if t.is_contiguous(memory_format=layout) else
                     t.contiguous(memory_format=layout) for t in (best, where))
    return max_pool2d_with_indices


def _roll_as_cpu(decomposed: Callable, device: str | None) -> Callable:
    """The input tiled along each rolled dim by views, copied contiguous (see the module
    docstring); torch's decomposition off the CPU, without dims (a flattened roll), for
    a dim out of range or of a size that is not a positive int, or a shift that is not an
    int."""
    import torch

    def roll(self, shifts, dims=()):
        shifts = list(shifts) if isinstance(shifts, (list, tuple)) else [shifts]
        dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
        rank = self.dim()
        if (device or self.device.type) != "cpu" or not dims or len(shifts) != len(dims) or \
                any(type(s) is not int for s in shifts) or \
                any(type(d) is not int or not -rank <= d < rank or
                    type(self.shape[d]) is not int or self.shape[d] <= 0 for d in dims):
            return decomposed(self, shifts, dims)
        x = self
        for s, d in zip(shifts, dims):  # (a dim named twice rolls twice, as eager's)
            n = x.shape[d % rank]
            if s % n:
                x = _tiled(x, d % rank, s % n, n)
        return x.clone(memory_format=torch.contiguous_format)
    return roll


def _constant_pad_as_cpu(decomposed: Callable, device: str | None) -> Callable:
    """Negative pads narrowed, positive ones tiled by views and filled by ``masked_fill``
    (see the module docstring); torch's decomposition off the CPU, for pads or sizes that
    are not ints, a size that would be negative or empty along a padded dim, or a value
    the dtype cannot hold (:func:`pad_fill`; ``fusion.decompose`` leaves those to eager's
    op, which raises)."""
    import torch
    from torch._prims_common import suggest_memory_format

    def constant_pad_nd(input, pad, value=0):
        rank, pad = input.dim(), list(pad)
        if (device or input.device.type) != "cpu" or len(pad) % 2 or len(pad) // 2 > rank or \
                any(type(p) is not int for p in pad):
            return decomposed(input, pad, value)
        if all(p == 0 for p in pad):  # (eager's copy, whatever the value)
            return input.clone()
        fill = pad_fill(value, input.dtype)
        if fill is None and any(p > 0 for p in pad):  # (eager raises: its op must run)
            return decomposed(input, pad, value)
        x, mask = input, None
        for i in range(len(pad) // 2):
            d, before, after = rank - 1 - i, pad[2 * i], pad[2 * i + 1]
            n = x.shape[d]
            if type(n) is not int or n + min(before, 0) + min(after, 0) <= 0:
                return decomposed(input, pad, value)
            x = x.narrow(d, -min(before, 0), n + min(before, 0) + min(after, 0))
            n, before, after = x.shape[d], max(before, 0), max(after, 0)
            if before or after:
                x = _tiled(x, d, before, before + n + after)
                index = _dim_index(before + n + after, d, rank, input.device)
                outside = (index < before) | (index >= before + n)
                mask = outside if mask is None else mask | outside
        if mask is None:  # (only narrowed: a copy, as torch's)
            return x.clone()
        return x.masked_fill(mask, fill).contiguous(memory_format=suggest_memory_format(input))
    return constant_pad_nd


def pad_fill(value, dtype):
    """The value a constant pad of ``dtype`` writes for ``value``, converted as eager
    converts it (a bool's truth, an integer's truncation: an int64 label pad's ``-100.0`` an
    int fill), or None where eager's op raises (a value the dtype cannot hold: ``1e39`` in
    f32, 300 in int8, NaN in an integer) or is complex."""
    import torch
    if dtype is torch.bool:
        return bool(value)
    if dtype.is_complex or isinstance(value, complex):
        return None
    if dtype.is_floating_point:
        v = float(value)
        return v if not math.isfinite(v) or abs(v) <= torch.finfo(dtype).max else None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        value = int(value)
    info = torch.iinfo(dtype)
    return int(value) if info.min <= value <= info.max else None


def _pooled_size(n: int, kernel: int, stride: int, pad: int, ceil_mode: bool) -> int:
    """A pooled dim's size, as eager's ``pooling_output_shape`` (dilation 1)."""
    out = (n + 2 * pad - kernel + ((stride - 1) if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= n + pad:
        out -= 1
    return out


def _promoted(tensors):
    """The dtype ``cat`` gives ``tensors`` (all of rank >= 1)."""
    import torch
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _nll_loss_backward_as_cpu(decomposed: Callable, device: str | None) -> Callable:
    """``-(g / total_weight)`` at each row's target, 0 elsewhere (see the module
    docstring); torch's decomposition with class weights or off the CPU."""
    import torch

    def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index,
                          total_weight):
        if (device or self.device.type) != "cpu" or weight is not None or self.dim() != 2:
            return decomposed(grad_output, self, target, weight, reduction, ignore_index,
                              total_weight)
        rows = target.unsqueeze(1)
        classes = torch.arange(self.shape[1], device=self.device)
        hit = (classes == rows) & (rows != ignore_index)
        g = grad_output.unsqueeze(1) if grad_output.dim() == 1 else grad_output
        if reduction == 1:  # mean
            g = g / total_weight
        return (-g).expand(self.shape).masked_fill(hit.logical_not(), 0)
    return nll_loss_backward


def _safe_softmax_as_cpu(decomposed: Callable, device: str | None) -> Callable:
    """Softmax over ``dim`` with rows of -inf made 0: torch's decomposition, with a
    scalar 0 in place of its tensor of zeros on the CPU (see the module docstring)."""
    import torch

    def _safe_softmax(self, dim, dtype=None):
        if (device or self.device.type) != "cpu":
            return decomposed(self, dim, dtype=dtype)
        out = torch.softmax(self, dim=dim, dtype=dtype)
        return out.masked_fill(torch.all(self.eq(float("-inf")), dim=dim, keepdim=True), 0.0)
    return _safe_softmax


def _layer_norm_as_cpu(decomposed: Callable, device: str | None) -> Callable:
    """torch's reference ``native_layer_norm`` (``torch._refs``), with an overflowed
    variance made NaN and the CPU's ``+ 0.0`` (see the module docstring)."""
    import torch

    def native_layer_norm(input, normalized_shape, weight, bias, eps):
        on_cpu = (device or input.device.type) == "cpu"
        input = input.contiguous()
        dims = list(range(input.dim() - len(normalized_shape), input.dim()))
        low = input.dtype in (torch.bfloat16, torch.float16)
        x = input.float() if low else input
        var, mean = torch.var_mean(x, dim=dims, unbiased=False, keepdim=True)
        # inf - inf is NaN, finite - itself +0.0 (var + 0.0 is var): a row's overflowed
        # variance made NaN with the ops every codegen has (no IEEE-breaking flags fold it)
        var = var + (var - var)
        rstd = torch.rsqrt(var + eps)
        out = (x - mean) * rstd
        if weight is not None:
            out = out * weight.contiguous()
        if bias is not None:
            out = out + bias.contiguous()
        elif on_cpu:
            out = out + 0.0
        out = out.to(input.dtype)
        if on_cpu:
            mean, rstd = mean.to(input.dtype), rstd.to(input.dtype)
        return out, mean, rstd
    return native_layer_norm


def _softmax_backward_as_cpu(decomposed: Callable, device: str | None) -> Callable:
    import torch

    def _softmax_backward_data(grad_output, output, dim, input_dtype):
        if (device or grad_output.device.type) != "cpu":
            return decomposed(grad_output, output, dim, input_dtype)
        g, y = grad_output, output
        if g.dtype in (torch.bfloat16, torch.float16):
            g, y = g.float(), y.float()
        grad_input = (y * (g - torch.sum(g * y, dim=dim, keepdim=True))).to(grad_output.dtype)
        if grad_output.dtype != input_dtype:
            grad_input = grad_input.to(input_dtype)
        return grad_input.contiguous()
    return _softmax_backward_data
