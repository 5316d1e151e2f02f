"""Generated aten programs of any size and shape, for scaling and property tests of passes.

A :class:`Program` is a list of aten ops over a few inputs; it builds the same program
as an IR graph (:meth:`Program.graph`, fast enough for 50k nodes) or as a torch function
(:meth:`Program.function`, for ``torch.compile``). Every value no later op reads is an
output, as in the graphs aot_autograd hands over, so no pass can drop dead code and
every op counts.

Values are ``[rows, cols]`` tensors, or ``[rows, 1]`` for row reductions; the inputs are
two ``[rows, cols]`` tensors ``x0``, ``x1``, a ``[rows, 1]`` column ``b`` and a
``[cols, cols]`` matrix ``w`` (the right operand of every matmul).

The families (:data:`FAMILIES`) are the graph shapes a pass must handle in linear time::

    chain          each op reads the previous value
    window{k}      operands drawn from the last k values (k = 4, 16, 64), a matmul every 12th op
    fanout         one value read by 32 siblings, summed back by a chain of adds
    diamond        a -> f(a), g(a) -> f(a) * g(a), repeated
    opaque         one or two pointwise ops between opaque ops (cumsum, matmul)
    reductions     a row reduction broadcast back every 4th op, operands from the last 8
    repeated       one 40-op block repeated on the previous block's result, for dedup
    mixed          operands from the last 64, a row reduction broadcast back every 5th op
                   and a matmul every 37th (the shape of issue 20's non-converging graph)
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import attrs
import torch

from torchloom.ir.graph import Graph
from torchloom.ir.types import TensorType

UNARY = ("aten.tanh.default", "aten.sigmoid.default", "aten.sin.default", "aten.neg.default",
         "aten.relu.default")
BINARY = ("aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.maximum.default")
REDUCTIONS = ("aten.sum.dim_IntList", "aten.amax.default", "aten.mean.dim")
MATMUL = "aten.mm.default"
CUMSUM = "aten.cumsum.default"
ROW = {"dim": (-1,), "keepdim": True}

#: input names and whether each is a [rows, 1] column (else [rows, cols]); ``w`` is last
INPUTS = (("x0", False), ("x1", False), ("b", True))
FULL, COLUMN, MATRIX = "full", "column", "matrix"


@attrs.frozen
class Op:
    """One aten op: its name, operands (indices into the program's values: the inputs
    come first) and attributes (keyword arguments of the aten overload)."""

    op: str
    args: tuple[int, ...]
    attrs: tuple[tuple[str, Any], ...] = ()


@attrs.frozen
class Program:
    ops: tuple[Op, ...]
    rows: int = 8
    cols: int = 16

    @property
    def num_inputs(self) -> int:
        return len(INPUTS) + 1

    def kinds(self) -> list[str]:
        """The shape kind of every value (inputs first)."""
        kinds = [COLUMN if col else FULL for _, col in INPUTS] + [MATRIX]
        for op in self.ops:
            kinds.append(_result_kind(op, kinds))
        return kinds

    def outputs(self) -> list[int]:
        """Values no op reads (the program's results), in order."""
        read = {a for op in self.ops for a in op.args}
        first = self.num_inputs
        return [i for i in range(first, first + len(self.ops)) if i not in read]

    def graph(self, name: str = "program", dtype: str = "f32") -> Graph:
        types = {FULL: TensorType.make((self.rows, self.cols), dtype),
                 COLUMN: TensorType.make((self.rows, 1), dtype),
                 MATRIX: TensorType.make((self.cols, self.cols), dtype)}
        g = Graph(name)
        kinds = self.kinds()
        values = [g.add_input(types[kinds[i]], n) for i, (n, _) in enumerate(INPUTS)]
        values.append(g.add_input(types[MATRIX], "w"))
        for op, kind in zip(self.ops, kinds[self.num_inputs:]):
            node = g.create(op.op, [values[a] for a in op.args], [types[kind]], dict(op.attrs))
            values.append(node.output)
        g.set_outputs([values[i] for i in self.outputs()])
        return g

    def function(self) -> Callable[..., tuple]:
        """The program as a torch function of ``(x0, x1, b, w)``."""
        calls = [(_overload(op.op), op.args, dict(op.attrs)) for op in self.ops]
        outputs = self.outputs()

        def program(*inputs):
            values = list(inputs)
            for fn, args, kwargs in calls:
                values.append(fn(*[values[a] for a in args], **kwargs))
            return tuple(values[i] for i in outputs)

        return program

    def example_inputs(self, seed: int = 0, dtype=torch.float32) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        shapes = [(self.rows, 1) if col else (self.rows, self.cols) for _, col in INPUTS]
        inputs = [torch.randn(s, generator=gen, dtype=dtype) for s in shapes]
        # a small matrix: repeated matmuls neither overflow nor vanish quickly
        inputs.append(torch.randn(self.cols, self.cols, generator=gen, dtype=dtype)
                      / self.cols)
        return inputs


def _overload(name: str):
    _, op, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, op), overload)


def _result_kind(op: Op, kinds: list[str]) -> str:
    if op.op in REDUCTIONS:
        return COLUMN
    if op.op == MATMUL:
        return FULL
    return FULL if any(kinds[a] == FULL for a in op.args) else COLUMN


class _Builder:
    """Appends ops and tracks which values are [rows, cols] tensors (the operands)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.ops: list[Op] = []
        self.full: list[int] = [0, 1]  # x0, x1
        self.next = len(INPUTS) + 1

    def add(self, op: str, *args: int, full: bool = True, **kwargs) -> int:
        self.ops.append(Op(op, tuple(args), tuple(sorted(kwargs.items()))))
        value, self.next = self.next, self.next + 1
        if full:
            self.full.append(value)
        return value

    def recent(self, k: int) -> int:
        return self.rng.choice(self.full[-k:])

    def pointwise(self, a: int, b: int | None = None) -> int:
        if b is None:
            return self.add(self.rng.choice(UNARY), a)
        return self.add(self.rng.choice(BINARY), a, b)

    def row_reduction(self, a: int) -> int:
        """``a - reduce(a, -1, keepdim)``: a reduction broadcast back to the row."""
        r = self.add(self.rng.choice(REDUCTIONS), a, full=False, **ROW)
        return self.add("aten.sub.Tensor", a, r)

    def matmul(self, a: int) -> int:
        return self.add(MATMUL, a, len(INPUTS))

    def program(self) -> Program:
        return Program(tuple(self.ops))


def random_program(n: int, seed: int = 0, *, window: int = 16, reduce_every: int = 0,
                   matmul_every: int = 0, opaque_every: int = 0, unary: float = 0.4) -> Program:
    """About ``n`` ops whose operands come from the last ``window`` values; a row reduction
    broadcast back every ``reduce_every`` ops, a matmul every ``matmul_every`` and a
    cumsum every ``opaque_every`` (0: never); the others are pointwise (``unary`` of them
    unary)."""
    b = _Builder(seed)
    i = 0
    while len(b.ops) < n:
        i += 1
        a = b.recent(window)
        if matmul_every and i % matmul_every == 0:
            b.matmul(a)
        elif opaque_every and i % opaque_every == 0:
            b.add(CUMSUM, a, dim=1)
        elif reduce_every and i % reduce_every == 0:
            b.row_reduction(a)
        elif b.rng.random() < unary:
            b.pointwise(a)
        elif b.rng.random() < 0.1:
            b.add(b.rng.choice(BINARY), a, 2)  # broadcast of the [rows, 1] input
        else:
            b.pointwise(a, b.recent(window))
    return b.program()


def _chain(n: int, seed: int) -> Program:
    return random_program(n, seed, window=1)


def _fanout(n: int, seed: int) -> Program:
    b = _Builder(seed)
    v = 0
    while len(b.ops) < n:
        leaves = [b.pointwise(v) if i % 2 else b.pointwise(v, 1) for i in range(32)]
        acc = leaves[0]
        for leaf in leaves[1:]:
            acc = b.add("aten.add.Tensor", acc, leaf)
        v = acc
    return b.program()


def _diamond(n: int, seed: int) -> Program:
    b = _Builder(seed)
    v = 0
    while len(b.ops) < n:
        left, right = b.pointwise(v), b.pointwise(v)
        v = b.pointwise(left, right)
    return b.program()


def _opaque(n: int, seed: int) -> Program:
    b = _Builder(seed)
    v = 0
    while len(b.ops) < n:
        for _ in range(b.rng.randint(1, 2)):
            v = b.pointwise(v, b.recent(4))
        v = b.matmul(v) if b.rng.random() < 0.5 else b.add(CUMSUM, v, dim=1)
    return b.program()


def _repeated(n: int, seed: int, block: int = 40) -> Program:
    """One block structure (drawn once), repeated on the previous block's result."""
    shape = random_program(block, seed, window=6, reduce_every=7)
    b = _Builder(seed)
    v = 0
    while len(b.ops) < n:
        local = {i: i for i in range(len(INPUTS) + 1)}
        local[0] = v
        for k, op in enumerate(shape.ops):
            local[len(INPUTS) + 1 + k] = b.add(op.op, *[local[a] for a in op.args],
                                               full=op.op not in REDUCTIONS, **dict(op.attrs))
        v = b.full[-1]
    return b.program()


FAMILIES: dict[str, Callable[[int, int], Program]] = {
    "chain": _chain,
    "window4": lambda n, seed: random_program(n, seed, window=4, matmul_every=12),
    "window16": lambda n, seed: random_program(n, seed, window=16, matmul_every=12),
    "window64": lambda n, seed: random_program(n, seed, window=64, matmul_every=12),
    "fanout": _fanout,
    "diamond": _diamond,
    "opaque": _opaque,
    "reductions": lambda n, seed: random_program(n, seed, window=8, reduce_every=4),
    "repeated": _repeated,
    "mixed": lambda n, seed: random_program(n, seed, window=64, reduce_every=5,
                                            matmul_every=37),
}


def family(name: str, n: int, seed: int = 0) -> Program:
    """A program of about ``n`` ops of the named family (see :data:`FAMILIES`)."""
    return FAMILIES[name](n, seed)
