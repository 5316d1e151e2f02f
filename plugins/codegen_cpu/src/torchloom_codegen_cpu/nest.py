"""What the kernel writer (kernel.py) and its helpers (tiles, columns, rows_and_columns,
reduction, overrun) exchange: the plan of a nest's parallel loop, frozen, which a helper
returns and the writer keeps, and :class:`Writer`, what a helper may read of the writer it
is given.
Helpers name this module, never kernel.py, so the package has no import cycle.

A nest is one parallel loop over rows (``x``); a pointwise walk read across its rows
loops over tiles instead (``xt``, tiles.py) and the column form over blocks of columns,
as many as the threads share (``xb``, columns.py)::

    ParallelLoop("x", 8)                              for (x = 0; x < 8; x++)
    ParallelLoop("xt", 4096)                          for (xt = 0; xt < 4096; xt++)
    ParallelLoop("xb", 64, ThreadBlocks(64, Literal("64"), 128))
                                const int64_t n_xb = ...;  for (xb = 0; xb < n_xb; xb++)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs

from torchloom.api import Node, Value, expr, indexing, stmt, writer

from torchloom_codegen_cpu.emitter import Emitter
from torchloom_codegen_cpu.render import compare, smaller, ternary

Coords = indexing.Coords


@attrs.frozen
class ThreadBlocks:
    """A loop over blocks of ``units`` units (an int, or a size; ``size``: its C expression,
    in parentheses where needed), one block per thread where there are units enough, and
    at most ``most`` units a block: ``max(min(threads, units), ceil(units / most))``
    blocks."""

    units: Any
    size: expr.Code
    most: int

    def count(self, threads: str) -> expr.Code:
        """The block count, ``threads`` the thread count's C (``"1"``: a kernel too small
        for threads)."""
        least = expr.over(expr.plus(self.size, self.most - 1), self.most)
        if threads == "1":
            return expr.as_node(-(-self.units // self.most)) if isinstance(self.units, int) \
                else least
        share = expr.wrapped(smaller(expr.as_node(threads), self.size))
        return ternary(compare(">", share, least), share, least)


@attrs.frozen
class ParallelLoop:
    """A nest's parallel loop: its variable and trip count (an int, or a size expression).
    With ``blocks``, the loop runs the block count the threads at the call take (``n_xb``)
    and ``trips`` is the units count, whether there is work for threads decided on it."""

    var: str
    trips: Any
    blocks: ThreadBlocks | None = None
    #: statements before the loop (after its block count) and after it: the column form
    #: split by rows allocates its threads' partials before and adds them after
    #: (columns.py)
    before: tuple = ()
    after: tuple = ()


class Writer(Protocol):
    """What a helper reads of the kernel writer it is given (kernel.KernelWriter), and the
    writer's methods it calls; it assigns none of its fields. The reduction nest's fields
    (``shape`` to ``rbound``) are set once its body is planned; ``full``, ``row``,
    ``row_keepdim`` are the coordinates of the row form's element ``(x, r)``, row and
    keepdim row."""

    em: Emitter
    ix: indexing.IndexMath
    region: Any
    reductions: list[Node]
    outputs: list[Value]
    out_names: list[str]
    read_back: dict[Value, str]
    columns: list[tuple[str, Node]]
    known: dict
    loaded: set[Value]
    loop: ParallelLoop
    parallel: bool
    shape: tuple
    rdims: tuple[int, ...]
    kept: list[int]
    kept_shape: list
    red_shape: list
    rows: Any
    rnumel: Any
    numel: Any
    r_header: list[stmt.Declare]
    rbound: Any
    full: Coords | None
    row: Coords | None
    row_keepdim: Coords | None
    row_walks: list[tuple[str, tuple]]

    def value_at(self, v: Value, coords: Coords) -> writer.Expr: ...

    def store(self, name: str, v: Value, coords: Coords) -> None: ...

    def count(self, dim, dtype: str) -> str: ...

    def output_place(self, v: Value) -> str: ...

    def element_coords(self, v: Value, full: Coords) -> Coords: ...

    def inner_coords(self, index: str, shape) -> tuple[list[stmt.Declare], list[str]]: ...

    def row_of(self, reduction: Node) -> Coords: ...

    def row_input(self, reduction: Node) -> Callable[[], writer.Expr]: ...

    def set_result(self, value: Value, coords: Coords, e: writer.Expr) -> None: ...

    def walk(self, write) -> list: ...

    def aside(self, write) -> None: ...
