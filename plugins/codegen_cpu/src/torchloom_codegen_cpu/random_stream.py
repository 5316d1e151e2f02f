"""Eager's dropout, bit for bit, at SIMD speed: ``aten.native_dropout`` on the CPU.

Eager's ``native_dropout`` (training) fills its mask with ``bernoulli_(1 - p)`` from torch's
default CPU generator (mt19937), one element after another in one thread: each element
draws two 32-bit words (``random64()``: the first is the high half), keeps their low 53
bits and is kept where ``bits * 2^-53 < 1 - p``; then ``output = input * mask * scale``
(``scale = 1 / (1 - p)``, 0 when p is 1; two products, each rounded as eager rounds it).
That loop spends ~7 ns an element (a GPT-2 training step's attention dropouts draw 4 M
elements: ~30 ms, a fifth of the step on the 2-vCPU machine of ``benchmarks/RESULTS.md``).

This module computes the same stream in C: the generator's state comes from
``torch.default_generator.get_state()`` (the CPU generator's 5,056-byte record), its words
are regenerated a block of 624 at a time (the twist and the tempering are loops a compiler
vectorizes), the mask and the output are written in the same pass over each chunk, and the
advanced state goes back with ``set_state``. The mask, the output and every later random
number are eager's, bit for bit (tests/codegen_cpu/test_cpu_dropout_stream.py), in a tenth of
the time. It is what :meth:`CpuCodegen.library_call` hands the plan for a ``native_dropout``
node outside any group; anything else (a non-contiguous input, a dtype other than f32, f64
and bf16, a tensor that needs its gradient, a generator state it does not recognise, ``p``
outside [0, 1]) calls eager's op. bf16 values are multiplied in f32 by the scale rounded to
bf16 and rounded to nearest even, as eager's are (a NaN result is NaN: eager's vector and
scalar loops spell it with other bits, so the tests compare NaN as NaN there).

The same draws give ``bernoulli.p(x, p)`` of f32/f64 (``bernoulli_(p)`` of a new tensor
shaped as ``x``: 1 where kept), the mask ``frontend.checkpointed_dropout`` draws for a
checkpointed dropout. Activation checkpointing runs either op through
``run_and_save_rng_state`` (the generator's state, then the op) and, in the backward's
recomputation, ``run_with_rng_state`` (the op drawn from that state, the generator left
as it was): :meth:`Dropout.saving` and :meth:`Dropout.replaying` are those, with the
same results.

Caveat, shared with every reader of a generator state: the state is read before the C
function runs and written after it, so another thread drawing from the default generator
while a dropout runs would draw the same numbers (eager holds the generator's lock instead).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torchloom.api import InputRef

from torchloom_codegen_cpu.deferred import Ahead
from torchloom_codegen_cpu.prelude import prelude

log = logging.getLogger("torchloom.codegen_cpu")

OP = "aten.native_dropout.default"
#: ``bernoulli.p(self, p)``: a tensor shaped as ``self`` of 1 (probability p) and 0
BERNOULLI = "aten.bernoulli.p"
#: activation checkpointing's wrappers of a random op (torch._prims.rng_prims): the forward
#: saves the generator's state and runs the op, the recomputation runs it from that state
SAVING, REPLAYING = "higher_order.run_and_save_rng_state", "higher_order.run_with_rng_state"
#: the size of the CPU generator's state record (``CPUGeneratorImplState``)
STATE_BYTES = 5056

#: the stream's C functions, after the prelude (its bf16 conversions: c10::BFloat16's)
_STREAM = r"""
#define TL_MT_N 624
#define TL_MT_M 397
#define TL_CHUNK 1024

/* The head of torch's CPU generator state (legacy TH_Generator_State; offsets checked by
   the Python side against torch.default_generator.get_state()). */
typedef struct {
  uint64_t seed;
  int32_t left;
  int32_t seeded;
  uint64_t next;
  uint64_t state[TL_MT_N];
} tl_mt_record;

typedef struct {
  uint32_t s[TL_MT_N];
  int64_t next;   /* the next word of s to read */
  int64_t avail;  /* words of s left before the next twist (the record's left - 1) */
} tl_mt;

static inline uint32_t tl_mt_mix(uint32_t u, uint32_t v) {
  return (((u & 0x80000000u) | (v & 0x7fffffffu)) >> 1) ^ ((v & 1u) ? 0x9908b0dfu : 0u);
}

/* mt19937's next block, as ATen's mt19937::next_state computes it in place */
static void tl_mt_twist(uint32_t *restrict s) {
  uint32_t t[TL_MT_N];
  for (int i = 0; i < TL_MT_N - TL_MT_M; i++)
    t[i] = s[i + TL_MT_M] ^ tl_mt_mix(s[i], s[i + 1]);
  for (int i = TL_MT_N - TL_MT_M; i < TL_MT_N - 1; i++)
    t[i] = t[i + TL_MT_M - TL_MT_N] ^ tl_mt_mix(s[i], s[i + 1]);
  t[TL_MT_N - 1] = t[TL_MT_M - 1] ^ tl_mt_mix(s[TL_MT_N - 1], t[0]);
  memcpy(s, t, sizeof t);
}

/* the next count tempered words of the stream */
static void tl_mt_words(tl_mt *g, uint32_t *restrict w, int64_t count) {
  while (count > 0) {
    if (g->avail == 0) {
      tl_mt_twist(g->s);
      g->next = 0;
      g->avail = TL_MT_N;
    }
    int64_t k = count < g->avail ? count : g->avail;
    const uint32_t *restrict s = g->s + g->next;
    for (int64_t i = 0; i < k; i++) {
      uint32_t y = s[i];
      y ^= y >> 11;
      y ^= (y << 7) & 0x9d2c5680u;
      y ^= (y << 15) & 0xefc60000u;
      y ^= y >> 18;
      w[i] = y;
    }
    g->next += k;
    g->avail -= k;
    w += k;
    count -= k;
  }
}

static int tl_mt_read(tl_mt *g, const tl_mt_record *r) {
  if (r->left < 1 || r->left > TL_MT_N + 1 || r->next > TL_MT_N ||
      (int64_t)r->next + r->left - 1 > TL_MT_N)
    return 1;
  for (int i = 0; i < TL_MT_N; i++) g->s[i] = (uint32_t)r->state[i];
  g->next = (int64_t)r->next;
  g->avail = r->left - 1;
  return 0;
}

static void tl_mt_write(const tl_mt *g, tl_mt_record *r) {
  for (int i = 0; i < TL_MT_N; i++) r->state[i] = g->s[i];
  r->next = (uint64_t)g->next;
  r->left = (int32_t)(g->avail + 1);
}

/* bits * 2^-53 < keep  <=>  bits < ceil(keep * 2^53): the integer bound of the 53-bit draws */
static inline int64_t tl_keep_bound(double keep) {
  double t = keep * 9007199254740992.0;
  int64_t b = (int64_t)t;
  return (double)b < t ? b + 1 : b;
}

/* one chunk's keep flags: element j draws words 2j (high) and 2j + 1 (low) */
static void tl_keep(const uint32_t *restrict w, uint8_t *restrict kept, int64_t m,
                    int64_t bound) {
  for (int64_t j = 0; j < m; j++) {
    int64_t bits = ((int64_t)(w[2 * j] & 0x1fffffu) << 32) | (int64_t)w[2 * j + 1];
    kept[j] = bits < bound;
  }
}

#define TL_SAME(v) (v)

/* T: the tensor's element, S: the compute type (eager's: float for bf16), LOAD/STORE
   between them; out = (x * kept) * scale, each product rounded to S (x * kept is exact) */
#define TL_DROPOUT(NAME, T, S, LOAD, STORE)                                              \
int NAME(void *record, const T *restrict x, T *restrict out, uint8_t *restrict mask,     \
         int64_t n, double keep, S scale) {                                             \
  tl_mt g;                                                                              \
  if (tl_mt_read(&g, (const tl_mt_record *)record)) return 1;                           \
  const int64_t bound = tl_keep_bound(keep);                                            \
  uint32_t w[2 * TL_CHUNK];                                                             \
  for (int64_t at = 0; at < n; at += TL_CHUNK) {                                        \
    int64_t m = n - at < TL_CHUNK ? n - at : TL_CHUNK;                                  \
    tl_mt_words(&g, w, 2 * m);                                                          \
    uint8_t *restrict kept = mask + at;                                                 \
    tl_keep(w, kept, m, bound);                                                         \
    const T *restrict xs = x + at;                                                      \
    T *restrict os = out + at;                                                          \
    for (int64_t j = 0; j < m; j++)                                                     \
      os[j] = STORE((LOAD(xs[j]) * (S)kept[j]) * scale);                                \
  }                                                                                     \
  tl_mt_write(&g, (tl_mt_record *)record);                                              \
  return 0;                                                                             \
}

TL_DROPOUT(tl_dropout_f32, float, float, TL_SAME, TL_SAME)
TL_DROPOUT(tl_dropout_f64, double, double, TL_SAME, TL_SAME)
TL_DROPOUT(tl_dropout_bf16, uint16_t, float, tl_bf16_to_f32, tl_f32_to_bf16)

/* bernoulli(p) of n elements of T (1 where kept, else 0): the same draws as a dropout's */
#define TL_BERNOULLI(NAME, T)                                                            \
int NAME(void *record, T *restrict out, int64_t n, double keep) {                       \
  tl_mt g;                                                                              \
  if (tl_mt_read(&g, (const tl_mt_record *)record)) return 1;                           \
  const int64_t bound = tl_keep_bound(keep);                                            \
  uint32_t w[2 * TL_CHUNK];                                                             \
  uint8_t kept[TL_CHUNK];                                                               \
  for (int64_t at = 0; at < n; at += TL_CHUNK) {                                        \
    int64_t m = n - at < TL_CHUNK ? n - at : TL_CHUNK;                                  \
    tl_mt_words(&g, w, 2 * m);                                                          \
    tl_keep(w, kept, m, bound);                                                         \
    for (int64_t j = 0; j < m; j++) out[at + j] = (T)kept[j];                           \
  }                                                                                     \
  tl_mt_write(&g, (tl_mt_record *)record);                                              \
  return 0;                                                                             \
}

TL_BERNOULLI(tl_bernoulli_f32, float)
TL_BERNOULLI(tl_bernoulli_f64, double)
"""



def source() -> str:
    """The translation unit of the dropout library: the prelude, then the stream."""
    return prelude() + _STREAM


_FUNCTIONS = {torch.float32: ("tl_dropout_f32", ctypes.c_float),
              torch.float64: ("tl_dropout_f64", ctypes.c_double),
              torch.bfloat16: ("tl_dropout_bf16", ctypes.c_float)}
#: ``bernoulli.p``'s functions (``bernoulli_(p)`` of a new tensor: a dropout's draws)
_MASKS = {torch.float32: "tl_bernoulli_f32", torch.float64: "tl_bernoulli_f64"}
#: the IR's names of those dtypes
DTYPES = ("f32", "f64", "bf16")
MASK_DTYPES = ("f32", "f64")


def _record_layout_ok() -> bool:
    """Whether torch's CPU generator state is the record the C side reads: its size, and a
    fresh seed's ``left`` (1) and ``next`` (0) where the record keeps them."""
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    if state.numel() != STATE_BYTES or state.dtype != torch.uint8:
        return False
    head = state[:24].numpy().tobytes()
    return int.from_bytes(head[8:12], "little", signed=True) == 1 and \
        int.from_bytes(head[16:24], "little") == 0


class Dropout:
    """``native_dropout(input, p, train)`` with eager's results and random stream; the C
    functions come from ``library()`` (a path to the built :func:`source`), loaded on the
    first call that can use them."""

    def __init__(self, library: Callable[[], Path]):
        self._library = Ahead("dropout", library, "dropout", "dropout runs as eager's op")
        self._functions: dict[torch.dtype, Callable] | None = None
        self._masks: dict[torch.dtype, Callable] = {}  # (loaded with _functions)

    def build_ahead(self) -> None:
        """Start building the library on a thread, once: a plan that calls it is being
        made (the first call waits for this build; an error is its to report)."""
        if self._functions is None:
            self._library.start()

    def ready(self) -> bool:
        """Whether a call would not wait for the library (loaded, built, or never started
        ahead: then the call builds it)."""
        return self._functions is not None or self._library.ready()

    def _loaded(self) -> dict[torch.dtype, Callable]:
        """The C functions per dtype, built and loaded once; none (every call is eager's)
        where torch's generator state is not the record they read or the build failed."""
        if self._functions is None:
            self._functions = {}
            if not _record_layout_ok():
                log.warning("torchloom: cpu codegen: torch's CPU generator state is not the "
                            "record it knows; dropout runs as eager's op")
                return self._functions
            lib = self._library.open(log)
            if lib is None:
                return self._functions
            for dtype, (name, scalar) in _FUNCTIONS.items():
                signature = ctypes.CFUNCTYPE(
                    ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                    ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, scalar)
                self._functions[dtype] = signature((name, lib))
            for dtype, name in _MASKS.items():
                signature = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                             ctypes.c_int64, ctypes.c_double)
                self._masks[dtype] = signature((name, lib))
        return self._functions

    def __call__(self, input, p, train):
        return self._drawn(input, p, train, None)

    def bernoulli(self, input, p=0.5, generator=None):
        """``bernoulli.p(input, p)`` from the default generator's stream."""
        return self._mask(input, p, generator, None)

    def saving(self, op, *args):
        """``run_and_save_rng_state(op, *args)`` (a checkpointed layer's random op,
        ``native_dropout`` or ``bernoulli.p``): the generator's state before the draw,
        and the op's results."""
        state = torch.get_rng_state()
        if op is torch.ops.aten.bernoulli.p:
            return state, self._mask(*args, None, None)
        return state, self._drawn(*args, None)

    def replaying(self, state, op, *args):
        """``run_with_rng_state(state, op, *args)`` (its recomputation): the op's results
        drawn from ``state``; the generator is left as it was."""
        if op is torch.ops.aten.bernoulli.p:
            return self._mask(*args, None, state)
        return self._drawn(*args, state)

    def _mask(self, input, p, generator, state):
        """``bernoulli.p(input, p)`` from the default generator (advanced past the draw)
        or from ``state`` (left unchanged, as is the generator)."""
        self._loaded()
        fn = self._masks.get(input.dtype)
        if fn is None or generator is not None or not _plain(input) or \
                not _probability(p) or not (state is None or _state_ok(state)):
            return _eager_op(torch.ops.aten.bernoulli.p, state, input, p, generator=generator)
        out = torch.empty(input.shape, dtype=input.dtype)  # (eager's: contiguous)
        record = torch.default_generator.get_state() if state is None else state.clone()
        if fn(record.data_ptr(), out.data_ptr(), out.numel(), float(p)):
            return _eager_op(torch.ops.aten.bernoulli.p, state, input, p, generator=generator)
        if state is None:
            torch.default_generator.set_state(record)
        return out

    def _drawn(self, input, p, train, state):
        """The dropout from the default generator's state (advanced past the draw), or
        from ``state`` (a generator record, left unchanged, as is the generator)."""
        fn = self._loaded().get(input.dtype) if _fast(input, p, train) and \
            (state is None or _state_ok(state)) else None
        if fn is None:
            return _eager(input, p, train, state)
        keep = 1.0 - p
        scale = 0.0 if keep == 0 else 1.0 / keep
        if input.dtype == torch.bfloat16:  # eager multiplies by the scale rounded to bf16
            scale = torch.tensor(scale, dtype=torch.bfloat16, device="cpu").item()
        out = torch.empty_like(input)
        mask = torch.empty_like(input, dtype=torch.bool)  # (contiguous, as eager's)
        generator = torch.default_generator
        record = generator.get_state() if state is None else state.clone()
        if fn(record.data_ptr(), input.data_ptr(), out.data_ptr(), mask.data_ptr(),
              input.numel(), keep, scale):
            # a state the C side does not read (left, next out of range): untouched
            return _eager(input, p, train, state)
        if state is None:
            generator.set_state(record)
        return out, mask


#: the ops the library draws for, with their arguments' count and the dtypes it takes
_DRAWN = {torch.ops.aten.native_dropout.default: (3, DTYPES),
          torch.ops.aten.bernoulli.p: (2, MASK_DTYPES)}


def form(node) -> tuple[str, object, tuple[str, ...]] | None:
    """How the library runs ``node``: the name of the :class:`Dropout` method
    (``"__call__"`` for ``native_dropout``, ``"bernoulli"`` for ``bernoulli.p``,
    ``"saving"``/``"replaying"`` for either op run by checkpointing's wrappers, every
    argument in its place), the value drawn for (its dtype, the draw's) and the dtypes
    the library takes there; None for any other node."""
    if node.op in (OP, BERNOULLI):
        if not node.inputs or node.attrs.get("generator") is not None:
            return None
        return ("__call__" if node.op == OP else "bernoulli"), node.inputs[0], \
            _DRAWN[torch.ops.aten.native_dropout.default if node.op == OP
                   else torch.ops.aten.bernoulli.p][1]
    at = {SAVING: 0, REPLAYING: 1}.get(node.op)
    args = node.attrs.get("args")
    if at is None or node.attrs.get("kwargs") or not isinstance(args, tuple) or \
            len(args) <= at or args[at] not in _DRAWN:
        return None
    count, dtypes = _DRAWN[args[at]]
    if len(args) != at + 1 + count or \
            not all(isinstance(a, InputRef) for a in args[:at] + args[at + 1:at + 2]):
        return None
    return ("saving" if at == 0 else "replaying"), node.inputs[args[at + 1]], dtypes


def _eager(input, p, train, state):
    """Eager's dropout: from the generator, or from ``state`` as ``run_with_rng_state``."""
    return _eager_op(torch.ops.aten.native_dropout.default, state, input, p, train)


def _eager_op(op, state, *args, **kwargs):
    """Eager's ``op(*args, **kwargs)``: from the generator, or from ``state`` as
    ``run_with_rng_state``."""
    if state is None:
        return op(*args, **kwargs)
    return torch.ops.higher_order.run_with_rng_state(state, op, *args, **kwargs)


def _plain(input) -> bool:
    """A plain CPU tensor with elements, outside autograd."""
    return type(input) is torch.Tensor and input.device.type == "cpu" and \
        input.numel() > 0 and not (input.requires_grad and torch.is_grad_enabled())


def _probability(p) -> bool:
    return isinstance(p, (int, float)) and not isinstance(p, bool) and 0.0 <= p <= 1.0


def _state_ok(state) -> bool:
    """Whether ``state`` is a CPU generator record (``run_with_rng_state``'s state)."""
    return type(state) is torch.Tensor and state.device.type == "cpu" and \
        state.dtype == torch.uint8 and state.dim() == 1 and state.numel() == STATE_BYTES and \
        state.is_contiguous()


def _fast(input, p, train) -> bool:
    """Whether the C path computes this call exactly as eager: a plain contiguous f32/f64/bf16
    CPU tensor with elements, outside autograd, p in [0, 1], training."""
    return (train is None or train is True) and _plain(input) and \
        input.dtype in _FUNCTIONS and input.is_contiguous() and _probability(p)
