"""What the kernel forms (looped.py, reduction.py, rows_and_columns.py, split.py, tiles.py,
metadata.py) see of the kernel writer (kernel.py), so that they need not import it: the
writer imports them, and an import back would close a circle."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from torchloom.api import Node, Value, stmt

from torchloom_codegen_triton.emitter import Emitter, Expr
from torchloom_codegen_triton.indexing import Coords


class Writer(Protocol):
    """A group's kernel writer (``kernel.KernelWriter``): its plan, coordinates, emitter
    and the methods a kernel form calls. A form reads these and calls the methods; it
    assigns none of them."""

    group: Node
    registry: Any
    region: Any
    device: str
    kind: str
    form: str | None
    max_persistent: int
    # the plan
    symbols: dict
    symbolic: bool
    reductions: list[Node]
    shape: tuple
    rdims: tuple[int, ...]
    kept_shape: tuple
    numel: Any
    rows: Any
    rnumel: Any
    looped: bool
    configs: list[dict[str, int]]
    col: Any
    split: Any
    tiles: tuple[int, int] | None
    finish_outputs: list[int]
    # written while the kernel is
    em: Emitter
    ix: Any
    known: dict
    loads: dict[Value, set[int]]
    full: Coords
    row: Coords
    row_keepdim: Coords
    r_header: tuple[stmt.Statement, ...]

    def value_at(self, v: Value, coords: Coords) -> Expr: ...

    def row_of(self, reduction: Node) -> Coords: ...

    def row_input(self, reduction: Node) -> Callable[[], Expr]: ...

    def record(self, outputs: dict[Value, tuple[Coords, Expr]]) -> None: ...

    def store(self, i: int, v: Value, coords: Coords) -> None: ...

    def finish_rows(self) -> None: ...

    def load_coordinates(self, coords: Coords) -> list[tuple[Value, Coords]]: ...
