"""Causal attention on the CPU: ``aten._scaled_dot_product_flash_attention_for_cpu`` and its
backward, computed block by block so that the keys a causal mask hides are never multiplied.

Eager's (and Inductor's, which calls it) CPU flash attention takes query blocks of 64 rows
and key blocks of 512 (``kvSplitSize``): at 512 tokens or fewer there is one key block, and a
causal row block multiplies every key, then masks the half it may not see. This module
takes blocks of 64 queries and 64 keys and stops each row block at its diagonal: about half
the products, the same algorithm otherwise (online softmax forward, the logsumexp eager
saves, FlashAttention-2's backward recomputing the probabilities from it). Its products are
the BLAS's own ``sgemm`` (the one torch links: MKL on x86), called on each block from C
(``tl_gemm``), the softmax between them SIMD loops. Measured on the 2-vCPU Intel Xeon of
``benchmarks/RESULTS.md`` (``[1, 8, 512, 32]``, 4 key heads or 8): forward 1.4-2.0x and
backward 1.5-2.1x eager's; without a causal mask it was no faster (0.6-1.0x), so only causal
calls come here.

Values are eager's within float rounding (each probability is the same exponential of the
same scaled dot product, summed in another order; tests/codegen_cpu/test_cpu_attention.py
compares with eager's op), and the outputs have eager's layouts (the meta functions': the
output like the query, the logsumexp ``[B, L, H]`` transposed, gradients ``[B, L, H, D]``
permuted), so either side's backward takes either side's forward. Exponentials below -80
are 0 (``tl_attn_exp``: e^-80 is 2e-35, nothing beside a row's largest term of 1) so that
no subnormal ever costs a microcode assist.

Anything else calls eager's op: a dtype other than f32, dropout, an ``attn_mask``, no
causal mask, a last dim that is not contiguous, a tensor that needs its gradient under
grad mode, sizes or strides from 2^31 on, a torch whose BLAS exports no ``sgemm_``, or one
whose results on a small case (checked once) are not eager's.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from torchloom_codegen_cpu.prelude import prelude

log = logging.getLogger("torchloom.codegen_cpu")

FORWARD = "aten._scaled_dot_product_flash_attention_for_cpu.default"
BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
#: the largest size or stride the BLAS's 32-bit integers take
_INT_MAX = (1 << 31) - 1
#: a mask value at or below which a key is hidden (-inf, or models' finfo.min): attention.c
_DEAD = -1e30

_ATTENTION = (Path(__file__).parent / "attention.c").read_text


def source() -> str:
    """The translation unit of the attention library: the prelude (its ``tl_exp_core``),
    then the attention's C (attention.c)."""
    return prelude() + "#include <math.h>\n#include <stdlib.h>\n" + _ATTENTION()


def _blas_sgemm() -> int | None:
    """The address of the Fortran ``sgemm_`` torch's CPU library links (MKL on x86), or
    None where none is exported."""
    where = [os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"), None]
    for path in where:
        try:
            lib = ctypes.CDLL(path)
            return ctypes.cast(lib.sgemm_, ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
    return None


_P, _I = ctypes.c_void_p, ctypes.c_int64
_FORWARD_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, *([_P] * 6), *([_I] * 6),
                                      *([_P] * 7), ctypes.c_double, ctypes.c_int)
_BACKWARD_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, *([_P] * 10), *([_I] * 6),
                                       *([_P] * 11), ctypes.c_double, ctypes.c_int)
#: the C side's answer for a row whose mask hides every key it computed (eager's op runs)
_DEAD_ROW = 2


def _strides(t: torch.Tensor | None):
    return (ctypes.c_int64 * 3)(*(t.stride()[:3] if t is not None else (0, 0, 0)))


def _mask(mask, query, key):
    """The mask expanded to ``[B, H, Lq, Lk]`` (broadcast dims of stride 0), or None."""
    if mask is None:
        return None
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


class Attention:
    """Eager's CPU flash attention and its backward, causal f32 calls by blocks (see the
    module's doc); the C functions come from ``library()`` (a path to the built
    :func:`source`), loaded and checked on the first call that can use them."""

    def __init__(self, library: Callable[[], Path]):
        self._library = library
        self._functions: tuple[Callable, Callable, int] | None | bool = False

    def _loaded(self) -> tuple[Callable, Callable, int] | None:
        """``(forward, backward, sgemm)``, built, loaded and checked once; None (eager's
        ops) where there is no ``sgemm_``, the build failed or a small case differs."""
        if self._functions is False:
            self._functions = None
            sgemm = _blas_sgemm() if sys.byteorder == "little" else None
            if sgemm is None:
                log.info("torchloom: cpu codegen: torch's BLAS exports no sgemm_; causal "
                         "attention runs as eager's op")
                return None
            try:
                lib = ctypes.CDLL(str(self._library()))
            except (RuntimeError, OSError) as exc:
                log.warning("torchloom: cpu codegen: the attention library did not build (%s); "
                            "attention runs as eager's op", exc)
                return None
            found = (_FORWARD_SIGNATURE(("tl_attn_fwd_f32", lib)),
                     _BACKWARD_SIGNATURE(("tl_attn_bwd_f32", lib)), sgemm)
            if not _agrees(*found):
                log.warning("torchloom: cpu codegen: blocked attention differs from eager's on "
                            "a check case (torch's sgemm_ is not the BLAS it expects); "
                            "attention runs as eager's op")
                return None
            self._functions = found
        return self._functions

    def forward(self, query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None,
                scale=None):
        """``_scaled_dot_product_flash_attention_for_cpu``: ``(output, logsumexp)``."""
        ready = self._loaded() if _fast(query, key, value, (), dropout_p, is_causal,
                                        attn_mask) else None
        found = None if ready is None else \
            _forward(ready[0], ready[2], query, key, value, attn_mask, is_causal, scale)
        if found is None:
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
                query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
        return found

    def backward(self, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                 attn_mask=None, scale=None):
        """``_scaled_dot_product_flash_attention_for_cpu_backward``: the three gradients."""
        ready = self._loaded() if _fast(query, key, value, (grad_out, out), dropout_p,
                                        is_causal, attn_mask) and \
            _lse_ok(logsumexp, query) and grad_out.shape == query.shape == out.shape else None
        if ready is None:
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
                grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                attn_mask=attn_mask, scale=scale)
        return _backward(ready[1], ready[2], grad_out, query, key, value, out, logsumexp,
                         attn_mask, is_causal, scale)


def _forward(fn, sgemm, query, key, value, mask, is_causal, scale):
    """``(output, logsumexp)``, or None where a row's mask hides every key (eager's op)."""
    B, H, Lq, D = query.shape
    Hk, Lk = key.shape[1], key.shape[2]
    mask = _mask(mask, query, key)
    out = torch.empty_like(query)
    lse = torch.empty((B, Lq, H), dtype=torch.float32, device="cpu").transpose(1, 2)
    strides = [_strides(t) for t in (query, key, value, out, lse, mask)]
    failed = fn(torch.get_num_threads(), sgemm, query.data_ptr(), key.data_ptr(),
                value.data_ptr(), out.data_ptr(), lse.data_ptr(), B, H, Hk, Lq, Lk, D,
                mask.data_ptr() if mask is not None else None, *strides, _scale(scale, D),
                int(is_causal))
    if failed == _DEAD_ROW:
        return None
    if failed:
        raise MemoryError("torchloom: cpu attention: out of memory for its scratch blocks")
    return out, lse


def _backward(fn, sgemm, grad_out, query, key, value, out, lse, mask, is_causal, scale):
    B, H, Lq, D = query.shape
    Hk, Lk = key.shape[1], key.shape[2]
    mask = _mask(mask, query, key)
    grads = [torch.empty_permuted(t.shape, (0, 2, 1, 3), dtype=t.dtype, device="cpu")
             for t in (query, key, value)]
    tensors = (grad_out, query, key, value, out, lse, *grads)
    if fn(torch.get_num_threads(), sgemm, *(t.data_ptr() for t in tensors), B, H, Hk, Lq, Lk,
          D, mask.data_ptr() if mask is not None else None,
          *(_strides(t) for t in (*tensors, mask)), _scale(scale, D), int(is_causal)):
        raise MemoryError("torchloom: cpu attention: out of memory for its scratch blocks")
    return tuple(grads)


def _scale(scale, D: int) -> float:
    return 1.0 / math.sqrt(D) if scale is None else float(scale)


def _fast(query, key, value, others, dropout_p, is_causal, attn_mask) -> bool:
    """Whether the blocked path computes this call: plain f32 CPU tensors of 4 dims whose
    last dim is contiguous, none needing its gradient, a query head count a multiple of the
    key's, sizes and strides below 2^31, no dropout, and a causal mask or an additive f32
    mask that hides the first query block's last key block (:func:`_skips`)."""
    if dropout_p != 0.0 or not isinstance(is_causal, bool) or \
            (is_causal and attn_mask is not None):
        return False
    for t in (query, key, value, *others):
        if type(t) is not torch.Tensor or t.device.type != "cpu" or \
                t.dtype != torch.float32 or t.dim() != 4 or t.numel() == 0 or \
                (t.stride(3) != 1 and t.shape[3] != 1) or \
                (t.requires_grad and torch.is_grad_enabled()) or \
                max(*t.shape, *(abs(s) for s in t.stride())) > _INT_MAX:
            return False
    B, H, _, D = query.shape
    if not (key.shape == value.shape and key.shape[0] == B and key.shape[3] == D and
            H % key.shape[1] == 0):
        return False
    return is_causal if attn_mask is None else _skips(attn_mask, query, key)


def _skips(mask, query, key) -> bool:
    """Whether a mask is one this path takes, and hides whole blocks: a plain f32 CPU
    tensor that broadcasts to ``[B, H, Lq, Lk]`` with a contiguous last dim, not needing
    its gradient, whose first block of 64 queries sees none of the keys of the last block
    (a causal mask's shape, a sliding window's, padded keys'; without such blocks eager's op
    was as fast)."""
    shape = (*query.shape[:3], key.shape[2])
    if type(mask) is not torch.Tensor or mask.device.type != "cpu" or \
            mask.dtype != torch.float32 or not 2 <= mask.dim() <= 4 or \
            (mask.requires_grad and torch.is_grad_enabled()) or \
            torch.broadcast_shapes(mask.shape, shape) != shape:
        return False
    full = _mask(mask, query, key)
    if full.stride(3) != 1 and shape[3] != 1 or \
            max(abs(s) for s in full.stride()) > _INT_MAX:
        return False
    last = (shape[3] - 1) // 64 * 64  # the last key block (attention.c's TL_ABK)
    return last > 0 and bool((mask[..., :64, last:] <= _DEAD).all())


def _lse_ok(lse, query) -> bool:
    return type(lse) is torch.Tensor and lse.dtype == torch.float32 and \
        lse.device.type == "cpu" and tuple(lse.shape) == tuple(query.shape[:3]) and \
        max(abs(s) for s in lse.stride()) <= _INT_MAX


def _agrees(forward, backward, sgemm) -> bool:
    """Whether the blocked path gives eager's values on small cases with partial blocks,
    two query heads per key head, a transposed layout, a causal flag and a causal mask (a
    BLAS with other conventions would not)."""
    g = torch.Generator().manual_seed(0)
    q, go = (torch.randn(1, 70, 4, 16, generator=g).transpose(1, 2) for _ in range(2))
    k, v = (torch.randn(1, 70, 2, 16, generator=g).transpose(1, 2) for _ in range(2))
    hidden = torch.full((70, 70), torch.finfo(torch.float32).min).triu(1)
    aten = torch.ops.aten
    for mask, causal in ((None, True), (hidden, False)):
        with torch.no_grad():
            want = aten._scaled_dot_product_flash_attention_for_cpu.default(
                q, k, v, 0.0, causal, attn_mask=mask)
            got = _forward(forward, sgemm, q, k, v, mask, causal, None)
            want_grads = aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
                go, q, k, v, *want, 0.0, causal, attn_mask=mask)
            got_grads = _backward(backward, sgemm, go, q, k, v, *want, mask, causal, None)
        if got is None or not all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in
                                  zip((*got, *got_grads), (*want, *want_grads))):
            return False
    return True
