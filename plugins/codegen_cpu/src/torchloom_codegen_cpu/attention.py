"""Causal attention on the CPU: ``aten._scaled_dot_product_flash_attention_for_cpu`` and its
backward, computed block by block so that the keys a causal mask hides are never multiplied.

Eager's (and Inductor's, which calls it) CPU flash attention takes query blocks of 64 rows
and key blocks of 512 (``kvSplitSize``): at 512 tokens or fewer there is one key block, and a
causal row block multiplies every key, then masks the half it may not see. This module
takes blocks of 64 queries and 64 keys and stops each row block at its diagonal (a causal
flag), or skips each block an additive f32 mask hides whole (``-inf``, or the ``finfo.min``
language models write: Llama's and Qwen2's causal masks, sliding windows, padded keys; a map
of the dead blocks is made once per call and mask batch and head): about half the products
under a causal mask, the same algorithm otherwise (online softmax forward, the logsumexp
eager saves, FlashAttention-2's backward recomputing the probabilities from it). Its
products are the BLAS's own ``sgemm`` (the one torch links: MKL on x86), called on each
block from C (``tl_gemm``), the softmax between them SIMD loops. Measured on the 2-vCPU
Intel Xeon of ``benchmarks/RESULTS.md`` (``[1, 8, 512, 32]``, one process, interleaved):
forward 1.7-1.9x and backward 1.6-1.9x eager's; without blocks to skip it is no faster
(0.75-1.0x at head dims 32 and 64: eager's one block of 512 keys makes larger products), so
a call with neither a causal flag nor a mask never comes here and a mask that hides fewer
than a quarter of the blocks whole (BERT's padded tail of an eighth) is handed back to
eager's op (the C functions' answer 3), and the mask is remembered (:class:`Declined`): the
model's later layers, given the same mask, call eager's op without asking again.

Values are eager's within float rounding (each probability is the same exponential of the
same scaled dot product, summed in another order; tests/codegen_cpu/test_cpu_attention.py
compares with eager's op), and the outputs have eager's layouts (the meta functions': the
output like the query, the logsumexp ``[B, L, H]`` transposed, gradients ``[B, L, H, D]``
permuted), so either side's backward takes either side's forward. Exponentials below -80
are 0 (``tl_attn_exp``: e^-80 is 2e-35, nothing beside a row's largest term of 1) so that
no subnormal ever costs a microcode assist. A query row that sees no key of the blocks
computed (its mask hides all, so its softmax is over hidden values) is eager's op's. Eager's
op multiplies a hidden key's zero weight by its key and value and by the queries (and in
the backward the output and its gradient), so one inf or NaN among them gives NaN rows:
where blocks are to be skipped the keys and values are read once a call
(``tl_attn_key_bounds``) and each task reads its own rows (``tl_attn_most``), and any
value that is not finite sends the call to eager's op, as a NaN or +inf in the mask does.
A block hidden by finite values (``finfo.min``, -1e30) is skipped only where its scores
are bounded below 1e22 (``D * |scale| * max|q| * max|k|``), so that it adds nothing to
eager's softmax either (``tl_attn_skips``).

Anything else calls eager's op: a dtype other than f32, dropout, a bool mask, a causal flag
with a mask, a last dim that is not contiguous, a tensor that needs its gradient under grad
mode, strides from 2^31 on, a torch whose BLAS exports no ``sgemm_``, or one whose results
on small cases (checked once) are not eager's.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import os
import sys
import weakref
from collections.abc import Callable
from pathlib import Path

import torch

from torchloom_codegen_cpu.deferred import Ahead
from torchloom_codegen_cpu.prelude import prelude

log = logging.getLogger("torchloom.codegen_cpu")

FORWARD = "aten._scaled_dot_product_flash_attention_for_cpu.default"
BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
#: the largest size or stride the BLAS's 32-bit integers take
_INT_MAX = (1 << 31) - 1

_MASKS = (Path(__file__).parent / "attention_masks.c").read_text
_ATTENTION = (Path(__file__).parent / "attention.c").read_text


#: the two libraries, one per direction (attention.c's halves; their functions: ``_FUNCTIONS``)
DIRECTIONS = ("forward", "backward")


def source(direction: str) -> str:
    """The translation unit of one direction's library: the prelude (its ``tl_exp_core``),
    then the attention's C (attention_masks.c, attention.c) with that direction's half.
    Two libraries, not one: inference builds only the forward's (0.6 of the 1.1 s gcc
    takes for both on the Intel Xeon of RESULTS.md), training builds the backward's at its
    first call."""
    if direction not in DIRECTIONS:
        raise ValueError(f"attention library {direction!r}: expected one of {DIRECTIONS}")
    return (f"#define TL_ATTN_{direction.upper()} 1\n" + prelude() +
            "#include <math.h>\n#include <stdlib.h>\n" + _MASKS() + _ATTENTION())


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
                                      _P, _P, ctypes.c_double, ctypes.c_int)
_BACKWARD_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, *([_P] * 10), *([_I] * 6),
                                       _P, _P, ctypes.c_double, ctypes.c_int)
#: the C side's answers that send a call to eager's op (attention.c): a row whose mask
#: hides every key it computed (or an input that is not finite), a mask that hides fewer
#: than a quarter of the blocks whole (or holds a NaN or +inf), a key or value that is not
#: finite; and this module's own -1 (a stride the BLAS cannot take)
_EAGERS = (-1, 2, 3, 4)
#: the answer that is the mask's own, whatever the other inputs (:class:`Declined`)
_MASK_DECLINED = 3


class Declined:
    """The masks the C side declined for themselves (``_MASK_DECLINED``), by identity: a
    model passes one mask to every layer, and a later call with a declined mask goes
    straight to eager's op (the declining C call cost 20-100 us of eager's 1.4-1.5 ms at
    BERT's ``[1, 4, 512, 64]`` with its padding mask, on the 2-vCPU Xeon of RESULTS.md). A
    mask is the same while it is the same object at the same version, address, shape and
    strides, for the same batch, heads and lengths; the last 16 are kept. An inference
    tensor (``torch.inference_mode``) has no version to tell a change by: never kept."""

    _MOST = 16

    def __init__(self):
        #: id(mask) -> (a weak reference to it, what it was seen with)
        self._seen: dict[int, tuple[weakref.ref, tuple]] = {}

    @staticmethod
    def _seen_with(mask, query, key) -> tuple:
        return (mask._version, mask.data_ptr(), tuple(mask.shape), mask.stride(),
                tuple(query.shape[:3]), key.shape[2])

    def has(self, mask, query, key) -> bool:
        entry = self._seen.get(id(mask))
        return entry is not None and entry[0]() is mask and \
            entry[1] == self._seen_with(mask, query, key)

    def add(self, mask, query, key) -> None:
        if mask.is_inference():
            return
        if len(self._seen) >= self._MOST:
            self._seen.clear()
        self._seen[id(mask)] = (weakref.ref(mask), self._seen_with(mask, query, key))


def _strides(tensors) -> ctypes.Array | None:
    """The first three strides of each tensor (0s for None) as one C array, or None where
    one is 2^31 or more (the BLAS's 32-bit integers)."""
    flat = []
    for t in tensors:
        flat += t.stride()[:3] if t is not None else (0, 0, 0)
    if max(flat) > _INT_MAX or min(flat) < 0:
        return None
    return (ctypes.c_int64 * len(flat))(*flat)


def _mask(mask, query, key):
    """The mask expanded to ``[B, H, Lq, Lk]`` (broadcast dims of stride 0), or None."""
    if mask is None:
        return None
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


class Attention:
    """Eager's CPU flash attention and its backward, causal f32 calls by blocks (see the
    module's doc); each direction's C function comes from ``library(direction)`` (a path
    to the built :func:`source`), loaded and checked on the first call that can use it."""

    def __init__(self, library: Callable[[str], Path]):
        #: direction -> its library (built ahead of its first call, or by it)
        self._libraries = {d: Ahead(f"attention-{d}", functools.partial(library, d),
                                    f"attention {d}", "attention runs as eager's op")
                           for d in DIRECTIONS}
        #: direction -> (its C function, sgemm), or None (eager's op), once loaded
        self._functions: dict[str, tuple[Callable, int] | None] = {}
        #: the masks the C side declined (either direction: its verdict is the same)
        self._declined = Declined()

    def started_ahead(self) -> list[str]:
        """The directions whose builds were started ahead (``build_ahead``)."""
        return sorted(d for d, lib in self._libraries.items() if lib.started)

    def build_ahead(self, direction: str, after: str | None = None) -> None:
        """Start building ``direction``'s library on a thread, once: a plan that will call
        it is being made, and the graph's own library builds meanwhile (two compilers at
        once; the first call waits for this build, never starts another). With ``after``
        (a direction), the compiler starts once that direction's build started ahead has
        ended: the backward's library, wanted later, does not slow the forward's. An error
        is its first call's to report, as when built then."""
        if direction not in self._functions:
            self._libraries[direction].start(
                self._libraries[after] if after is not None else None)

    def ready(self, direction: str) -> bool:
        """Whether a call of ``direction`` would not wait for its library (built, or its
        build never started ahead: then the call builds it)."""
        return self._libraries[direction].ready()

    def _loaded(self, direction: str) -> tuple[Callable, int] | None:
        """``(function, sgemm)`` of ``direction``, built, loaded and checked once; None
        (eager's ops) where there is no ``sgemm_``, the build failed or a small case
        differs."""
        if direction not in self._functions:
            self._functions[direction] = self._load(direction)
        return self._functions[direction]

    def _load(self, direction: str) -> tuple[Callable, int] | None:
        sgemm = _blas_sgemm() if sys.byteorder == "little" else None
        if sgemm is None:
            log.info("torchloom: cpu codegen: torch's BLAS exports no sgemm_; causal "
                     "attention runs as eager's op")
            return None
        lib = self._libraries[direction].open(log)
        if lib is None:
            return None
        signature, name = _FUNCTIONS[direction]
        fn = signature((name, lib))
        if not _AGREES[direction](fn, sgemm):
            log.warning("torchloom: cpu codegen: blocked attention's %s differs from eager's "
                        "on a check case (torch's sgemm_ is not the BLAS it expects); "
                        "attention runs as eager's op", direction)
            return None
        return fn, sgemm

    def forward(self, query, key, value, dropout_p=0.0, is_causal=False, attn_mask=None,
                scale=None):
        """``_scaled_dot_product_flash_attention_for_cpu``: ``(output, logsumexp)``."""
        ready = self._loaded("forward") if _fast(query, key, value, (), dropout_p,
                                                 is_causal, attn_mask) and \
            not self._mask_declined(attn_mask, query, key) else None
        found = None if ready is None else \
            _forward(*ready, query, key, value, attn_mask, is_causal, scale)
        if not isinstance(found, tuple):
            self._note(found, attn_mask, query, key)
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
                query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
        return found

    def backward(self, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                 attn_mask=None, scale=None):
        """``_scaled_dot_product_flash_attention_for_cpu_backward``: the three gradients."""
        ready = self._loaded("backward") if _fast(
            query, key, value, (grad_out, out), dropout_p, is_causal, attn_mask) and \
            _lse_ok(logsumexp, query) and grad_out.shape == query.shape == out.shape and \
            not self._mask_declined(attn_mask, query, key) else None
        found = None if ready is None else _backward(
            *ready, grad_out, query, key, value, out, logsumexp, attn_mask, is_causal, scale)
        if not isinstance(found, tuple):
            self._note(found, attn_mask, query, key)
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
                grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                attn_mask=attn_mask, scale=scale)
        return found

    def _mask_declined(self, mask, query, key) -> bool:
        """Whether the C side declined ``mask`` (for these sizes) already."""
        return mask is not None and self._declined.has(mask, query, key)

    def _note(self, answer: int | None, mask, query, key) -> None:
        """Keeps ``mask`` where the C side's ``answer`` (None: not called) declined it."""
        if answer == _MASK_DECLINED:
            self._declined.add(mask, query, key)


def _forward(fn, sgemm, query, key, value, mask, is_causal, scale):
    """``(output, logsumexp)``, or the answer (one of ``_EAGERS``) where eager's op must
    run: a stride from 2^31 on, a row whose mask hides every key, a mask that hides too
    few whole blocks, an input that is not finite."""
    B, H, Lq, D = query.shape
    Hk, Lk = key.shape[1], key.shape[2]
    mask = _mask(mask, query, key)
    out = torch.empty_like(query)
    lse = torch.empty((B, Lq, H), dtype=torch.float32, device="cpu").transpose(1, 2)
    strides = _strides((query, key, value, out, lse, mask))
    if strides is None:
        return -1
    failed = fn(torch.get_num_threads(), sgemm, query.data_ptr(), key.data_ptr(),
                value.data_ptr(), out.data_ptr(), lse.data_ptr(), B, H, Hk, Lq, Lk, D,
                mask.data_ptr() if mask is not None else None, strides, _scale(scale, D),
                int(is_causal))
    if failed in _EAGERS:
        return failed
    if failed:
        raise MemoryError("torchloom: cpu attention: out of memory for its scratch blocks")
    return out, lse


def _backward(fn, sgemm, grad_out, query, key, value, out, lse, mask, is_causal, scale):
    """The three gradients, or the answer (one of ``_EAGERS``) where eager's op must run:
    a stride from 2^31 on, a mask that hides too few whole blocks, an input that is not
    finite."""
    B, H, Lq, D = query.shape
    Hk, Lk = key.shape[1], key.shape[2]
    mask = _mask(mask, query, key)
    grads = [torch.empty_permuted(t.shape, (0, 2, 1, 3), dtype=t.dtype, device="cpu")
             for t in (query, key, value)]
    tensors = (grad_out, query, key, value, out, lse, *grads)
    strides = _strides((*tensors, mask))
    if strides is None:
        return -1
    failed = fn(torch.get_num_threads(), sgemm, *(t.data_ptr() for t in tensors), B, H, Hk,
                Lq, Lk, D, mask.data_ptr() if mask is not None else None, strides,
                _scale(scale, D), int(is_causal))
    if failed in _EAGERS:
        return failed
    if failed:
        raise MemoryError("torchloom: cpu attention: out of memory for its scratch blocks")
    return tuple(grads)


#: keys per block of the blocked path (attention_masks.c's ``TL_ABK``)
KEY_BLOCK = 64


def _scale(scale, D: int) -> float:
    return 1.0 / math.sqrt(D) if scale is None else float(scale)


def _fast(query, key, value, others, dropout_p, is_causal, attn_mask) -> bool:
    """Whether the blocked path takes this call: plain f32 CPU tensors of 4 dims with
    elements whose last dim is contiguous, none needing its gradient, a query head count a
    multiple of the key's, no dropout, and a causal flag or an additive f32 mask (whether
    the mask hides a quarter of the blocks whole, below which eager's op is faster, the C
    side finds; with one block of keys, ``KEY_BLOCK`` or fewer, a block the mask hides
    whole leaves its queries no key, which eager's op decides: a mask then never skips
    anything, and eager's op runs without the C side counting it, as Swin's windows of 49
    keys, 0.1 ms a call)."""
    # exactly one of a causal flag (True) and a mask
    if dropout_p != 0.0 or is_causal is not (attn_mask is None) or \
            (attn_mask is not None and not _mask_ok(attn_mask, query, key)):
        return False
    for t in (query, key, value, *others):
        if type(t) is not torch.Tensor or t.dtype is not torch.float32 or not t.is_cpu or \
                t.dim() != 4 or (t.stride(3) != 1 and t.shape[3] != 1) or 0 in t.shape:
            return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value, *others)):
        return False
    B, H, _, D = query.shape
    return key.shape == value.shape and key.shape[0] == B and key.shape[3] == D and \
        H % key.shape[1] == 0 and (attn_mask is None or key.shape[2] > KEY_BLOCK)


def _mask_ok(mask, query, key) -> bool:
    """A plain f32 CPU tensor of 2 to 4 dims that broadcasts to ``[B, H, Lq, Lk]``, its
    last dim Lk long and contiguous, not needing its gradient."""
    if type(mask) is not torch.Tensor or mask.dtype is not torch.float32 or \
            not mask.is_cpu or not 2 <= mask.dim() <= 4 or mask.shape[-1] != key.shape[2] or \
            (mask.stride(-1) != 1 and mask.shape[-1] != 1) or \
            (mask.requires_grad and torch.is_grad_enabled()):
        return False
    full = (*query.shape[:3], key.shape[2])
    return all(m in (1, f) for m, f in zip(reversed(mask.shape), reversed(full)))


def _lse_ok(lse, query) -> bool:
    return type(lse) is torch.Tensor and lse.dtype is torch.float32 and lse.is_cpu and \
        lse.shape == query.shape[:3]


def _check_cases():
    """Small cases with partial blocks, two query heads per key head, a transposed layout,
    a causal flag and a causal mask (a BLAS with other conventions would not give eager's
    values on them): ``(q, k, v, grad_out, mask, causal)`` each."""
    g = torch.Generator().manual_seed(0)
    q, go = (torch.randn(1, 70, 4, 16, generator=g).transpose(1, 2) for _ in range(2))
    k, v = (torch.randn(1, 70, 2, 16, generator=g).transpose(1, 2) for _ in range(2))
    hidden = torch.full((70, 70), torch.finfo(torch.float32).min).triu(1)
    return [(q, k, v, go, mask, causal) for mask, causal in ((None, True), (hidden, False))]


def _close(got, want) -> bool:
    return isinstance(got, tuple) and all(torch.allclose(a, b, rtol=1e-4, atol=1e-5)
                                   for a, b in zip(got, want))


def _forward_agrees(forward, sgemm) -> bool:
    """Whether the blocked forward gives eager's values on :func:`_check_cases`."""
    aten = torch.ops.aten
    with torch.no_grad():
        return all(_close(_forward(forward, sgemm, q, k, v, mask, causal, None),
                          aten._scaled_dot_product_flash_attention_for_cpu.default(
                              q, k, v, 0.0, causal, attn_mask=mask))
                   for q, k, v, _, mask, causal in _check_cases())


def _backward_agrees(backward, sgemm) -> bool:
    """Whether the blocked backward gives eager's gradients on :func:`_check_cases`, from
    eager's forward (either side's backward takes either side's forward)."""
    aten = torch.ops.aten
    with torch.no_grad():
        for q, k, v, go, mask, causal in _check_cases():
            fwd = aten._scaled_dot_product_flash_attention_for_cpu.default(
                q, k, v, 0.0, causal, attn_mask=mask)
            want = aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
                go, q, k, v, *fwd, 0.0, causal, attn_mask=mask)
            if not _close(_backward(backward, sgemm, go, q, k, v, *fwd, mask, causal, None),
                          want):
                return False
    return True


#: direction -> (ctypes signature, C function name); the check of its values
_FUNCTIONS = {"forward": (_FORWARD_SIGNATURE, "tl_attn_fwd_f32"),
              "backward": (_BACKWARD_SIGNATURE, "tl_attn_bwd_f32")}
_AGREES = {"forward": _forward_agrees, "backward": _backward_agrees}
