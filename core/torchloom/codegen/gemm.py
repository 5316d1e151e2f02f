"""Matrix products the plan calls in blocks of columns or rows, where that was measured
faster and gives the same bits, or through oneDNN where that was measured faster.

A library GEMM is not equally fast at every shape: on the 2-vCPU AMD Zen 3 machine of
``benchmarks/RESULTS.md``, MKL's ``mm`` of ``[512, 256] x [256, 8192]`` (a language model's
head) ran at 72 GFLOP/s where ``[512, 256] x [256, 704]`` ran at 123; called on blocks of
1,024 columns (each block's result written in place into the output, a strided view) the
same product took 18-20 instead of 23-30 ms, and every element was the same (each output
element is the same dot product, summed by the same kernel). The head's weight gradient,
``[8192, 512] x [512, 256]``, gained the same way in blocks of 1,024 rows (21.5 against
25.2 ms). Eager and Inductor call them whole. On the AMD EPYC Zen 4 of RESULTS.md's
session 71, MKL's whole call was slower than oneDNN's linear of the same operands
(``torch.ops.mkldnn._linear_pointwise``, the op Inductor's frozen CPU graphs call):
``[512, 256] x [256, 8192]`` 13.4 against 10.7 ms, ``[128, 256] x [256, 8192]`` 3.8
against 3.0, the head's input gradient ``[512, 8192] x [8192, 256]`` 12.5 against 11.0
(its weight gradient, a transposed operand, slower: 15.1 against 19.0). oneDNN is
another library: its products are the values within rounding, not the same bits, as
the cpu codegen's attention is (docs/design.md).

:class:`GemmBlocks` decides per static ``aten.mm`` and ``aten.addmm`` node of a plan (the
head of a model whose head has a bias, Phi's), once per shape, layout, dtype and thread
count, in the product's own first calls, not when the plan is built (timing there cost a
first call 0.1-0.4 s a head, on a machine where no block ever won): a :class:`Trial` calls
the whole product, blocks of about 512 and 1,024 columns and rows (as many as the product
has twice over) and, for f32 products without a bias or with one per column, oneDNN's
linear (:data:`ONEDNN`) in turn, one per call, on the caller's operands, timing each; the
first call of each is not counted (first touch, library set-up), then ``ROUNDS`` rounds,
or ``EARLY_ROUNDS`` where no block was faster at all. It takes the fastest blocks only
where they were at least ``MIN_GAIN`` faster and, called once more beside the whole
product on the same operands, gave its bits (oneDNN's: its values within
:data:`ONEDNN_TOLERANCE` of the result's largest magnitude; else the node calls ``mm`` as
it is: a block of a few columns, or of one row, is multiplied by another kernel than the
whole, with other bits); the bits are compared at the thread count of that call, and a
plan keeps its choice if the count changes. Every call returns the product's values (a
block's or oneDNN's within rounding while it is timed; once chosen, the same bits, or
oneDNN's values); calls made while autograd records the product (``out=`` refuses that)
or under ``torch.use_deterministic_algorithms`` are the whole product, untimed. Only
products big enough to gain (``MIN_MACS``; blocks only where a side is ``MIN_SIDE`` or
more), whose slower trial calls cost a fraction of a second (``MAX_MACS``) and whose
check takes little memory (``MAX_ELEMENTS``) are tried; what was decided is kept in the
cache directory for the next process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch

from torchloom.ir import Node, TensorType

log = logging.getLogger("torchloom.runtime")

MM = "aten.mm.default"
ADDMM = "aten.addmm.default"
#: multiply-adds below which a product is not tried (per-call costs dominate)
MIN_MACS = 1 << 26
#: multiply-adds above which a product is not tried (its slower trial calls would cost
#: seconds)
MAX_MACS = 1 << 32
#: elements of the operands and two results above which a product is not tried (the
#: check's second result)
MAX_ELEMENTS = 1 << 25
#: a block width is taken where it is this much faster than the whole call (time ratio)
MIN_GAIN = 0.9
SIZES = (512, 1024)
ROUNDS = 4
#: timed rounds after which a trial stops where every block was slower than the whole call
#: (where none wins, as on the Intel Xeon of RESULTS.md's sessions 42-46)
EARLY_ROUNDS = 2
#: the side (rows of the result, or columns) below which a product is not tried in
#: blocks (oneDNN's linear still is): the gains measured were on 8,192 (a vocabulary)
MIN_SIDE = 4096


#: how a product is cut: ("cols" or "rows", about how many per block), or :data:`ONEDNN`
Blocks = tuple[str, int]

#: the candidate calling oneDNN's linear (``torch.ops.mkldnn._linear_pointwise``, the op
#: Inductor's frozen CPU graphs call) instead of the BLAS ``mm``: another library, so the
#: values within rounding, not the bits (module text)
ONEDNN: Blocks = ("onednn", 0)
#: the rounding a product of oneDNN's may differ by from the whole call's (relative to
#: the largest magnitude of the result)
ONEDNN_TOLERANCE = 1e-4


def _steps(n: int, size: int) -> range:
    """Starts of equal blocks of about ``size`` of ``n``, a multiple of 16 but for the
    last (no narrow remainder, which the library would multiply by another kernel)."""
    step = -(-n // -(-n // size))  # ceil(n / count), count = ceil(n / size)
    step = -(-step // 16) * 16
    return range(0, n, step)


def blocked_mm(blocks: Blocks) -> Callable[..., torch.Tensor]:
    """``mm(a, b, out=None)`` computed in ``blocks``: about ``size`` columns of ``b`` (rows
    of ``a``) at a time (:func:`_steps`), each block's result written into its part of
    the output (MKL takes the strided view as its output). Where autograd would record
    the product (out= refuses that), the whole ``mm``."""
    addmm = blocked_addmm(blocks)

    def mm(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None):
        return addmm(None, a, b, out=out)
    mm.__name__ = f"mm_{blocks[0]}_of_{blocks[1]}"
    return mm


def blocked_addmm(blocks: Blocks) -> Callable[..., torch.Tensor]:
    """``addmm(bias, a, b, beta=1, alpha=1, out=None)`` in ``blocks`` as
    :func:`blocked_mm` (bias None: ``mm``), each block with its part of ``bias`` (the
    bias as it is along a dim it broadcasts). :data:`ONEDNN`: :func:`onednn_addmm`."""
    if blocks == ONEDNN:
        return onednn_addmm
    axis, size = blocks

    def addmm(bias, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1,
              out: torch.Tensor | None = None):
        m, n = a.shape[0], b.shape[1]
        if out is None:
            if _recorded(bias, a, b):
                return torch.mm(a, b) if bias is None else torch.addmm(
                    bias, a, b, beta=beta, alpha=alpha)
            out = torch.empty((m, n), dtype=a.dtype, device=a.device)
        cols = axis == "cols"
        starts = _steps(n if cols else m, size)
        for j in starts:
            part = slice(j, j + starts.step)
            x, y = (a, b[:, part]) if cols else (a[part], b)
            into = out[:, part] if cols else out[part]
            if bias is None:
                torch.mm(x, y, out=into)
            else:
                torch.addmm(_bias_part(bias, cols, part, m, n), x, y, beta=beta,
                            alpha=alpha, out=into)
        return out
    addmm.__name__ = f"addmm_{axis}_of_{size}"
    return addmm


def onednn_addmm(bias, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """``addmm(bias, a, b)`` (bias None: ``mm``; bias of ``b``'s columns, beta and alpha
    1: :meth:`GemmBlocks.callable_for` offers it so) by oneDNN's linear of ``a`` and the
    weight ``b.t()``, a new tensor (``out`` is not written: the plan takes the result).
    Where autograd would record the product, the whole call."""
    if _recorded(bias, a, b):
        return _whole(bias, a, b, beta=beta, alpha=alpha)
    return torch.ops.mkldnn._linear_pointwise(a, b.t(), bias, "none", [], "")


def _recorded(*operands) -> bool:
    """Whether autograd records a product of ``operands`` (None: no operand)."""
    return torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in operands)


def _onednn_linear() -> bool:
    """Whether this torch has oneDNN's linear op (CPU builds with oneDNN)."""
    try:
        return torch.backends.mkldnn.is_available() and \
            torch.ops.mkldnn._linear_pointwise is not None
    except (AttributeError, RuntimeError):
        return False


def _within_rounding(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether ``x`` is ``y`` but for rounding (:data:`ONEDNN_TOLERANCE`); NaN where it is."""
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    finite = y[y.isfinite()]
    scale = float(finite.abs().max()) if finite.numel() else 1.0
    return torch.allclose(x, y, rtol=ONEDNN_TOLERANCE, atol=ONEDNN_TOLERANCE * scale,
                          equal_nan=True)


def _bias_part(bias: Any, cols: bool, part: slice, m: int, n: int) -> Any:
    """The part of ``addmm``'s ``bias`` (broadcast to ``[m, n]``) a block adds."""
    if not isinstance(bias, torch.Tensor) or bias.dim() == 0:
        return bias
    if cols:
        return bias[..., part] if bias.shape[-1] == n and n > 1 else bias
    return bias[part] if bias.dim() == 2 and bias.shape[0] == m and m > 1 else bias


def _dense(t: Any) -> bool:
    """A static 2-D tensor type laid out densely (row- or column-major), on the CPU."""
    if not isinstance(t, TensorType) or len(t.shape) != 2 or t.device != "cpu":
        return False
    if not t.is_static:
        return False
    rows, cols = t.shape
    return tuple(t.actual_strides()) in ((cols, 1), (1, rows))


@attrs.define
class GemmBlocks:
    """The blocks each ``aten.mm`` and ``aten.addmm`` shape is called in (None: whole),
    decided once per shape, layouts, dtype and thread count by a :class:`Trial` of its
    first calls (a :class:`Compiler` holds one for all its graphs: the products of one
    shape in every graph share a trial). With a ``path``
    (``<cache_dir>/gemm-blocks.json``) what was decided is kept for later processes on
    this machine: a warm start tries nothing. The file is data (JSON): an entry that is
    not a known choice is tried again."""

    enabled: bool = True
    #: whether oneDNN's linear is a candidate (:data:`ONEDNN`)
    onednn: bool = True
    #: (shapes, strides, bias shape, dtype, threads) -> the blocks chosen (None: whole)
    chosen: dict[tuple, Blocks | None] = attrs.field(factory=dict)
    path: Path | None = None
    #: the decisions read from ``path`` (key text -> choice), read on first need
    stored: dict[str, Blocks | None] | None = None
    #: the trials under way, by key
    trials: dict[tuple, Trial] = attrs.field(factory=dict)
    #: what a trial times its calls with (seconds)
    clock: Callable[[], float] = time.perf_counter

    def decided(self, key: tuple) -> Blocks | None | bool:
        """The blocks decided for ``key`` (None: whole), or False while undecided."""
        if key in self.chosen:
            return self.chosen[key]
        text = repr(key)
        if text in self._stored():
            self.chosen[key] = self.stored[text]
            return self.chosen[key]
        return False

    def _stored(self) -> dict[str, Blocks | None]:
        """``stored``, read from ``path`` at the first need."""
        if self.stored is None:
            self.stored = _read(self.path)
        return self.stored

    def settle(self, key: tuple, blocks: Blocks | None) -> None:
        """Record a trial's decision (and keep it in ``path``)."""
        self.chosen[key] = self._stored()[repr(key)] = blocks
        self.trials.pop(key, None)
        _write(self.path, repr(key), blocks)

    def key(self, node: Node) -> tuple | None:
        """What ``node``'s product is decided by (shapes, strides, bias shape, dtype,
        threads), or None where it is not tried: not a product, off, or outside the
        bounds (module text)."""
        if not self.enabled or node.op not in (MM, ADDMM) or any(
                node.attrs.get(k, 1) != 1 for k in ("beta", "alpha")):
            return None
        types = [v.type for v in node.inputs]
        bias = types.pop(0) if node.op == ADDMM else None
        if len(types) != 2 or (bias is not None and not (
                isinstance(bias, TensorType) and bias.is_static and len(bias.shape) <= 2
                and bias.dtype == types[0].dtype)):
            return None
        a, b = types
        if not (_dense(a) and _dense(b)) or a.dtype != b.dtype or a.dtype not in (
                "f32", "f64", "bf16"):
            return None
        (m, k), n = a.shape, b.shape[1]
        if not MIN_MACS <= m * k * n <= MAX_MACS or \
                m * k + k * n + 2 * m * n > MAX_ELEMENTS:
            return None
        shape = None if bias is None else tuple(bias.shape)
        return (a.shape, a.actual_strides(), b.shape, b.actual_strides(), shape, a.dtype,
                torch.get_num_threads())

    def candidates(self, key: tuple | None) -> list[Blocks]:
        """What a trial of ``key``'s product times beside the whole call: blocks of
        :data:`SIZES` columns and rows where a side is ``MIN_SIDE`` or more (as many as
        the side has twice over), and :data:`ONEDNN` for f32 products without a bias or
        with one per column, of any side."""
        if key is None:
            return []
        (m, _), (_, n) = key[0], key[2]
        candidates = [(axis, size) for axis, side in (("cols", n), ("rows", m))
                      for size in SIZES if 2 * size <= side] \
            if max(m, n) >= MIN_SIDE else []
        if self.onednn and key[5] == "f32" and key[4] in (None, (n,)) and \
                _onednn_linear():
            candidates.append(ONEDNN)
        return candidates

    def callable_for(self, node: Node) -> Callable | None:
        """The ``mm``/``addmm`` to call for ``node`` in place of its op (blocked, or a
        trial while undecided), or None."""
        key = self.key(node)
        candidates = self.candidates(key)
        if not candidates:
            return None
        mm = node.op == MM
        blocks = self.decided(key)
        if blocks is False:
            trial = self.trials.get(key)
            if trial is None:
                trial = self.trials[key] = Trial(key, candidates, self.settle, self.clock)
            return trial.mm if mm else trial.addmm
        if blocks is None:
            return None
        return blocked_mm(blocks) if mm else blocked_addmm(blocks)


def _whole(bias, a, b, *, beta=1, alpha=1, out=None):
    """``mm`` (bias None) or ``addmm``, whole."""
    if bias is None:
        return torch.mm(a, b, out=out)
    return torch.addmm(bias, a, b, beta=beta, alpha=alpha, out=out)


@attrs.define
class Trial:
    """The first calls of one product shape: each variant (the whole call, then each
    candidate's blocks) called in turn and timed; the first call of each not counted;
    then the decision (:class:`GemmBlocks` module text) handed to ``settle(key,
    blocks)``. Once decided, the chosen function is called (a plan built before the
    decision keeps calling the trial). One call at a time takes part: a call made while
    another thread's does is the whole product, untimed."""

    key: tuple
    candidates: list[Blocks]
    settle: Callable[[tuple, Blocks | None], None]
    clock: Callable[[], float] = time.perf_counter
    #: timed calls made so far (the warm-up round included)
    calls: int = 0
    #: the fastest time of each variant (index 0: the whole call)
    best: list[float] = attrs.field(init=False)
    #: the candidate (its index) whose bits the next call compares, once timing chose it
    checking: int | None = None
    #: the function to call, once decided
    decided: Callable | None = None
    #: the functions timed: the whole call, then each candidate's blocks
    variants: list[Callable] = attrs.field(init=False)
    #: held by the call taking part (timing, checking, deciding)
    lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        self.best = [float("inf")] * (1 + len(self.candidates))
        self.variants = [_whole, *map(blocked_addmm, self.candidates)]

    def mm(self, a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None):
        return self.addmm(None, a, b, out=out)

    def addmm(self, bias, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1,
              out: torch.Tensor | None = None):
        if self.decided is not None:
            return self.decided(bias, a, b, beta=beta, alpha=alpha, out=out)
        if _recorded(bias, a, b) or \
                torch.are_deterministic_algorithms_enabled() or \
                not self.lock.acquire(blocking=False):
            return _whole(bias, a, b, beta=beta, alpha=alpha, out=out)
        try:
            if self.decided is not None:  # (another thread's call decided it just before)
                return self.decided(bias, a, b, beta=beta, alpha=alpha, out=out)
            if self.checking is not None:
                return self._check(bias, a, b, beta=beta, alpha=alpha, out=out)
            return self._timed(bias, a, b, beta=beta, alpha=alpha, out=out)
        finally:
            self.lock.release()

    def _timed(self, bias, a, b, **kwargs):
        """The next variant's call, timed (the lock held)."""
        count = len(self.variants)
        index = self.calls % count
        start = self.clock()
        try:
            result = self.variants[index](bias, a, b, **kwargs)
        except Exception as exc:  # (memory, a library's error): the whole call, as ever
            if index == 0:
                raise
            self._failed(a, b, index - 1, exc)
            return _whole(bias, a, b, **kwargs)
        seconds = self.clock() - start
        self.calls += 1
        if self.calls > count:  # (the first round warms each variant up)
            self.best[index] = min(self.best[index], seconds)
        if self.calls % count == 0:
            self._round_done(self.calls // count - 1)
        return result

    def _round_done(self, rounds: int) -> None:
        whole, blocks = self.best[0], self.best[1:]
        if not blocks:
            self._decide(None)
        elif rounds >= EARLY_ROUNDS and all(t >= whole for t in blocks):
            self._decide(None)  # no block is faster at all yet: none will be MIN_GAIN faster
        elif rounds >= ROUNDS:
            fastest = min(range(len(blocks)), key=blocks.__getitem__)
            if blocks[fastest] > MIN_GAIN * whole:
                self._decide(None)
            else:
                self.checking = fastest

    def _check(self, bias, a, b, **kwargs):
        """The whole call, and the chosen blocks beside it: blocks only with its bits
        (oneDNN's product within rounding of its values)."""
        result = _whole(bias, a, b, **kwargs)
        candidate = self.checking
        try:
            blocked = self.variants[1 + candidate](bias, a, b, beta=kwargs["beta"],
                                                   alpha=kwargs["alpha"])
        except Exception as exc:  # (memory): whole
            self._failed(a, b, candidate, exc)
            return result
        same = _within_rounding(blocked, result) if self.candidates[candidate] == ONEDNN \
            else torch.equal(blocked, result)
        self._decide(candidate if same else None)
        return result

    def _failed(self, a, b, candidate: int, exc: Exception) -> None:
        """A candidate's blocks raised: logged, and the product is called whole."""
        log.warning("torchloom: mm of %s x %s in blocks %s failed (%s: %s); it is called "
                    "whole", tuple(a.shape), tuple(b.shape), self.candidates[candidate],
                    type(exc).__name__, exc)
        self._decide(None)

    def _decide(self, candidate: int | None) -> None:
        """Settle on a candidate's blocks (its index), or None: whole."""
        self.checking = None
        self.decided = self.variants[0 if candidate is None else 1 + candidate]
        self.settle(self.key, None if candidate is None else self.candidates[candidate])


def _machine() -> str:
    """What the measurements hold for: this CPU, torch (and its BLAS) and its threads."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        model = next((line.split(":", 1)[1].strip() for line in
                      Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), model)
    return f"{model} | torch {torch.__version__} | {os.cpu_count()} cpus"


def _choice(value: Any) -> Blocks | None | bool:
    """A stored choice read back (None: whole), or False where it is not one."""
    if value is None:
        return None
    if isinstance(value, list) and len(value) == 2 and value[0] in ("cols", "rows") and \
            value[1] in SIZES:
        return value[0], value[1]
    if value == list(ONEDNN):
        return ONEDNN
    return False


def _read(path: Path | None) -> dict[str, Blocks | None]:
    """The choices stored at ``path`` for this machine (none where unreadable)."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("machine") != _machine() or \
            not isinstance(data.get("chosen"), dict):
        return {}
    return {k: c for k, v in data["chosen"].items() if (c := _choice(v)) is not False}


def _write(path: Path | None, key: str, blocks: Blocks | None) -> None:
    """Add one choice to the file at ``path`` (written whole, then renamed: readers see
    the old file or the new one); a file that cannot be written is left as it is."""
    if path is None:
        return
    chosen = _read(path) | {key: blocks}
    text = json.dumps({"machine": _machine(), "chosen": {
        k: None if v is None else list(v) for k, v in sorted(chosen.items())}}, indent=1)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
