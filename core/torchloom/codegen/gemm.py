"""Matrix products the plan calls in blocks of columns or rows, where that was measured
faster and gives the same bits.

A library GEMM is not equally fast at every shape: on the 2-vCPU AMD Zen 3 machine of
``benchmarks/RESULTS.md``, MKL's ``mm`` of ``[512, 256] x [256, 8192]`` (a language model's
head) ran at 72 GFLOP/s where ``[512, 256] x [256, 704]`` ran at 123; called on blocks of
1,024 columns (each block's result written in place into the output, a strided view) the
same product took 18-20 instead of 23-30 ms, and every element was the same (each output
element is the same dot product, summed by the same kernel). The head's weight gradient,
``[8192, 512] x [512, 256]``, gained the same way in blocks of 1,024 rows (21.5 against
25.2 ms). Eager and Inductor call them whole.

:class:`GemmBlocks` decides per static ``aten.mm`` and ``aten.addmm`` node of a plan (the
head of a model whose head has a bias, Phi's), once per shape, layout,
dtype and thread count: it times the whole call against blocks of about 512 and 1,024
columns and rows (as many as the product has twice over) on random operands of the
node's layout (interleaved rounds, the minimum of each; after ``EARLY_ROUNDS`` no more
where no block was faster at all), and takes the fastest blocks
only where they are at least ``MIN_GAIN`` faster and their result is bit for bit the
whole call's (else the node calls ``mm`` as it is: a block of a few columns, or of one
row, is multiplied by another kernel than the whole, with other bits; the bits are
compared at the thread count measured, and a plan keeps its choice if the count changes). Only products big
enough to gain (``MIN_MACS``, ``MIN_SIDE``), small enough to time in a fraction of a
second (``MAX_MACS``) and in little memory (``MAX_ELEMENTS``) are timed, for at most
``BUDGET_S`` seconds per compiler (about 0.4 s for a language model's head; what was
measured is kept in the cache directory for the next process).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch
from torch.utils._python_dispatch import _disable_current_modes

from torchloom.ir import Graph, Node, TensorType

log = logging.getLogger("torchloom.runtime")

MM = "aten.mm.default"
ADDMM = "aten.addmm.default"
#: multiply-adds below which a product is not timed (per-call costs dominate)
MIN_MACS = 1 << 26
#: multiply-adds above which a product is not timed (the timing would cost seconds)
MAX_MACS = 1 << 32
#: elements of the operands and two results above which a product is not timed (memory)
MAX_ELEMENTS = 1 << 25
#: a block width is taken where it is this much faster than the whole call (time ratio)
MIN_GAIN = 0.9
SIZES = (512, 1024)
ROUNDS = 4
#: rounds after which timing stops where every block was slower than the whole call (where
#: none wins, as on the Intel Xeon of RESULTS.md's sessions 42-46, half the timing is saved)
EARLY_ROUNDS = 2
#: the side (rows of the result, or columns) below which a product is not timed: the
#: gains measured were on 8,192 (a vocabulary); an MLP's 2,048 costs time to measure
MIN_SIDE = 4096
#: seconds of measuring a compiler spends at most (shapes after that are called whole)
BUDGET_S = 2.0


#: how a product is cut: ("cols" or "rows", about how many per block)
Blocks = tuple[str, int]


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
    bias as it is along a dim it broadcasts)."""
    axis, size = blocks

    def addmm(bias, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1,
              out: torch.Tensor | None = None):
        m, n = a.shape[0], b.shape[1]
        if out is None:
            if torch.is_grad_enabled() and any(
                    t is not None and t.requires_grad for t in (bias, a, b)):
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


def _operand(t: TensorType, generator: torch.Generator) -> torch.Tensor:
    dtype = t.torch_dtype  # (devices explicit: a ``torch.device`` context may be active)
    x = torch.empty_strided(t.shape, t.actual_strides(), dtype=dtype, device="cpu")
    return x.copy_(torch.randn(t.shape, generator=generator, dtype=torch.float32,
                               device="cpu").to(dtype))


def _seconds(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@attrs.define
class GemmBlocks:
    """The blocks each ``aten.mm`` and ``aten.addmm`` shape is called in (None: whole),
    measured once per shape, layouts, dtype and thread count (a :class:`Compiler` holds
    one for all its graphs). With a ``path`` (``<cache_dir>/gemm-blocks.json``) what was
    measured is kept for later processes on this machine: a warm start measures nothing.
    The file is data (JSON): an entry that is not a known choice is measured again."""

    enabled: bool = True
    #: (shapes, strides, bias shape, dtype, threads) -> the blocks chosen (None: whole)
    chosen: dict[tuple, Blocks | None] = attrs.field(factory=dict)
    #: ``measure(a, b, bias)``: the blocks for a product of operand types ``a`` and ``b``
    #: (``bias``: addmm's bias shape, None for mm)
    measure: Callable[..., Blocks | None] = attrs.field(factory=lambda: measure)
    path: Path | None = None
    #: the measurements read from ``path`` (key text -> choice), read on first need
    stored: dict[str, Blocks | None] | None = None
    #: seconds of measuring left (``BUDGET_S``): a compiler of many shapes (dynamic
    #: sizes recompiled) stops measuring, and calls the shapes after that whole
    budget_s: float = BUDGET_S

    def _decided(self, key: tuple, a: TensorType, b: TensorType,
                 bias: tuple[int, ...] | None) -> Blocks | None:
        if key in self.chosen:
            return self.chosen[key]
        if self.stored is None:
            self.stored = _read(self.path)
        text = repr(key)
        if text in self.stored:
            self.chosen[key] = self.stored[text]
            return self.chosen[key]
        if self.budget_s <= 0:
            return None  # (not kept: a later compiler measures it)
        start = time.perf_counter()
        # (plans are built under the tracer's fake tensor mode: real tensors here)
        with _disable_current_modes(), torch.no_grad():
            try:
                self.chosen[key] = self.stored[text] = self.measure(a, b, bias)
            except Exception as exc:  # (a library's error, memory): the whole call, as ever
                log.warning("torchloom: timing mm of %s x %s failed (%s: %s); it is called "
                            "whole", a.shape, b.shape, type(exc).__name__, exc)
                self.chosen[key] = self.stored[text] = None
        self.budget_s -= time.perf_counter() - start
        _write(self.path, text, self.chosen[key])
        return self.chosen[key]

    def callable_for(self, node: Node) -> Callable | None:
        """The blocked ``mm``/``addmm`` to call for ``node`` in place of its op, or None."""
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
        if not MIN_MACS <= m * k * n <= MAX_MACS or max(m, n) < MIN_SIDE or \
                m * k + k * n + 2 * m * n > MAX_ELEMENTS:
            return None
        shape = None if bias is None else tuple(bias.shape)
        key = (a.shape, a.actual_strides(), b.shape, b.actual_strides(), shape, a.dtype,
               torch.get_num_threads())
        blocks = self._decided(key, a, b, shape)
        if blocks is None:
            return None
        return blocked_mm(blocks) if bias is None else blocked_addmm(blocks)


def decide_products(graph: Graph, gemms: GemmBlocks) -> None:
    """Time every product of ``graph`` (its shared subgraphs too) that ``gemms`` would
    time when the plan asks, now: before a compiler starts beside the plan's making (the
    ``cpu`` codegen's ``prepare``), which would share the cores the timing measures."""
    for g in (graph.root, *graph.root.subgraphs.values()):
        for node in g.nodes:
            if node.op in (MM, ADDMM):
                gemms.callable_for(node)


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
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def measure(a: TensorType, b: TensorType, bias: tuple[int, ...] | None = None
            ) -> Blocks | None:
    """The fastest blocks for ``a @ b`` (``bias + a @ b``: addmm with a contiguous bias
    of that shape) if they beat the whole call by ``MIN_GAIN`` and give its bits, else
    None."""
    generator = torch.Generator().manual_seed(0)
    x, y = _operand(a, generator), _operand(b, generator)
    c = None if bias is None else torch.randn(bias, generator=generator, device="cpu").to(
        x.dtype)

    def whole(out=None):
        return torch.mm(x, y, out=out) if c is None else torch.addmm(c, x, y, out=out)
    reference = whole()
    candidates = [(axis, size) for axis, n in (("cols", b.shape[1]), ("rows", a.shape[0]))
                  for size in SIZES if 2 * size <= n]
    variants: dict[Blocks | None, Callable[[], Any]] = {
        None: lambda: whole(out=reference)}
    out = torch.empty_like(reference)
    for blocks in candidates:
        variants[blocks] = (lambda f: lambda: f(c, x, y, out=out))(blocked_addmm(blocks))
    best = {key: float("inf") for key in variants}
    for fn in variants.values():  # warm-up: first-touch of the outputs, library set-up
        fn()
    for r in range(ROUNDS):
        for key, fn in variants.items():
            best[key] = min(best[key], _seconds(fn))
        if r + 1 >= EARLY_ROUNDS and all(best[c] >= best[None] for c in candidates):
            break  # no block is faster at all yet: none will be MIN_GAIN faster
    chosen = min(candidates, key=lambda key: best[key], default=None)
    if chosen is None or best[chosen] > MIN_GAIN * best[None]:
        return None
    return chosen if torch.equal(variants[chosen](), whole()) else None
