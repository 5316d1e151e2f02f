"""The kernel schedule's 2-D tile form: a pointwise walk read across by an input.

A pointwise kernel walks its outputs in their memory order: the innermost dim ``d0``
fastest. An input laid out along another dim ``d1`` (``x.t() + y``, a permute of the last
dims) is then read with one strided access per element, each on another cache line (and,
for long rows, another page). Walked in 2-D tiles over ``d0`` and ``d1``, the lines a tile
touches are reused by its next rows (a CPU) or turned between the two layouts through
shared memory (a GPU). Both native codegens render the form, each its own way (cpu: the
walk's rows, flattened, against ``d0`` in tiles of 32 x 32; triton: ``[YBLOCK, XBLOCK]``
tiles over ``d0`` and ``d1``, one program per tile); the plan is the core's::

    Tiles.of(region, registry, tensor_type, min_dim=16)   # x.t() + y over [64, 128] f32
        -> Tiles(d0=1, d1=0, step=64)
    Tiles.of(...)                                         # x + y, both row-major
        -> None

Where it is planned: every output of one shape and one memory order, and an input read
across the walk: by default (a GPU's) one read with a unit stride along exactly one dim,
not ``d0``, and of at least a quarter of the walk's elements (smaller, broadcast inputs
stay in cache); with ``unit=False`` one whose smallest stride follows another dim than
``d0`` (a step-2 slice, transposed), with ``cached=None`` of any size (the cpu's choice).
``step`` is the longest step along ``d0`` of such reads, which the cpu asks to be 16
elements or more. :func:`input_reads` finds where each value read from memory is read, as
functions of the outputs' coordinates (``p0, p1, ...``), through the group's views.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import attrs

from torchloom.codegen import expr, stmt
from torchloom.codegen.expr import Code, Name, names
from torchloom.codegen.indexing import (C, Coords, IndexMath, Unsupported, memory_order, prod,
                                        same_shape)
from torchloom.codegen.samples import sample_value
from torchloom.codegen.spelling import Spelling
from torchloom.codegen.walks import Walk
from torchloom.codegen.writer import Expr, ValueWalk
from torchloom.ir import Node, TensorType, Value

TypeOf = Callable[[Value], TensorType]

#: rows and columns of a tile of a walk's rows (:func:`tile_rows`)
TILE = 32
#: an input read across a walk steps over at least this many elements per element of its
#: innermost dim: tiles pay (:func:`tile_rows`)
STRIDED = 16
#: a walk's rows of at most this many elements are turned (:func:`turned`), not tiled
SHORT = 4

#: what the probe "computes": nothing, only where each input is read
_NOTHING = Expr(Name("_"), "f32")


class _Probe(Spelling):
    """The probe's spelling: it spells no value; its name is what reasons give."""

    name = "schedule"


class _Reads(ValueWalk):
    """A value walk that emits nothing: where the outputs at given coordinates read each
    value a kernel reads from memory (a region input, a value in ``stops``, a reduction's
    result), views followed and pointwise ops' inputs broadcast."""

    spelling = _Probe()
    POINTWISE: dict = {}
    REDUCTIONS: dict = {}

    def __init__(self, registry: Any, type_of: TypeOf, stops: Collection[Value] = ()):
        self.registry = registry
        self._type_of = type_of
        self._stops = frozenset(stops)
        self.ix = IndexMath(C)
        self.known: dict = {}
        self.reduced: dict = {}
        self.reads: list[tuple[Value, Coords]] = []
        self._seen: set[tuple[Value, Coords]] = set()

    def tensor_type(self, v: Value) -> TensorType:
        return self._type_of(v)

    def value_at(self, v: Value, coords: Coords) -> Expr:
        if (v, coords) in self._seen:
            return _NOTHING
        self._seen.add((v, coords))
        node = v.producer
        if v in self._stops or (node is not None and self.registry.category(node.op)
                                not in ("pointwise", "view")):
            return self._load(v, self.tensor_type(v), coords)  # read from memory
        self._compute(v, coords)
        return _NOTHING

    def _load(self, v: Value, t: TensorType, coords: Coords) -> Expr:
        self.reads.append((v, coords))
        return _NOTHING

    def _pointwise(self, node: Node, v: Value, t: TensorType, coords: Coords) -> Expr:
        for i in node.inputs:
            if isinstance(i.type, TensorType):
                self.value_at(i, self.ix.broadcast(coords, t.shape, i.type.shape))
        return _NOTHING


def input_reads(outputs: Sequence[Value], registry: Any, type_of: TypeOf, coords: Coords,
                stops: Collection[Value] = ()) -> list[tuple[Value, Coords]]:
    """(value, its coordinates) of every read from memory that computing ``outputs`` (values
    of one region) at ``coords`` (names, say ``p0, p1, ...``) makes, in the order a writer
    would load them: region inputs, values of ``stops`` (an earlier nest's outputs, read
    back) and reductions' results; ``type_of`` reads a value's type (a target's, raising
    its own reason)."""
    probe = _Reads(registry, type_of, stops)
    for v in outputs:
        probe.value_at(v, coords)
    return probe.reads


def _inner(coords: Coords, t: TensorType, dims: dict, unit: bool) -> list[int]:
    """The walk dims (``dims``: coordinate name -> dim) that a read of ``t`` at ``coords``
    steps by 1 element along (``unit``); else the one its smallest static stride follows,
    a coordinate reading that dim alone (``2 * p0``: a slice's step of 2). [] where none."""
    strides = t.actual_strides()
    if strides is None:  # contiguous: the last dim that is not 1
        real = [c for c, d in zip(coords, t.shape) if d != 1]
        return [dims[real[-1]]] if real and real[-1] in dims else []
    if unit:
        return [dims[c] for c, s, d in zip(coords, strides, t.shape)
                if d != 1 and s == 1 and c in dims]
    steps = []
    for c, s, d in zip(coords, strides, t.shape):
        read = [dims[Name(n)] for n in names(c) if Name(n) in dims]
        if d != 1 and isinstance(s, int) and s != 0 and len(read) == 1:
            steps.append((abs(s), read[0]))
    return [min(steps)[1]] if steps else []


def _step(coords: Coords, t: TensorType, d0: Name) -> int:
    """Elements a read of ``t`` at ``coords`` steps over per element of coordinate ``d0``
    (0 where a stride is symbolic)."""
    strides = t.actual_strides()
    if strides is None:
        return 0
    steps = [s for c, s in zip(coords, strides) if c == d0]
    return sum(steps) if all(isinstance(s, int) for s in steps) else 0


def _elements(t: TensorType) -> Any:
    """Elements ``t`` holds in memory (broadcast dims, stride 0, hold one)."""
    strides = t.actual_strides() or [1] * len(t.shape)
    return prod([d for d, s in zip(t.shape, strides) if s != 0])


@attrs.frozen
class Tiles:
    """Tile the walk's innermost dim ``d0`` (the outputs', in memory) against ``d1``, the
    dim an input read across the walk is contiguous along (module docstring)."""

    d0: int
    d1: int
    #: the most elements an input read across the walk steps over per element of ``d0``
    #: (0 where symbolic)
    step: int = 0

    @classmethod
    def of(cls, region, registry: Any, type_of: TypeOf, min_dim: int | None,
           outputs: Sequence[Value] | None = None, cached: int | None = 4,
           unit: bool = True, stops: Collection[Value] = ()) -> Tiles | None:
        """The tile plan of pointwise ``region`` writing ``outputs`` (default: every
        output of the region), or None. ``min_dim``: the shortest static ``d0``/``d1``
        worth a tile (a pair with a shorter one is passed over for the next input's; a
        symbolic one may be long enough); None takes the first pair (a target choosing per
        call). ``cached``: inputs with fewer than 1/``cached`` of the walk's elements stay
        in the target's cache and are passed over (None: none is). ``unit``: ``d1`` is the
        one dim the input is read along with a unit stride (a GPU's coalesced loads), else
        the dim it steps least along. ``step`` is the longest step along ``d0`` of the
        inputs read across the walk. ``stops``: values the kernel reads back from memory
        (:func:`input_reads`)."""
        values = list(region.outputs if outputs is None else outputs)
        types = [type_of(v) for v in values]
        shape = tuple(types[0].shape)
        if len(shape) < 2 or any(not same_shape(t.shape, shape) for t in types):
            return None
        orders = {memory_order(t) for t in types}
        if len(orders) != 1:
            return None
        d0 = orders.pop()[-1]
        dims = {Name(f"p{d}"): d for d in range(len(shape))}
        numel = sample_value(prod(shape))
        found, step = None, 0
        for v, coords in input_reads(values, registry, type_of, tuple(dims), stops):
            t = type_of(v)
            if cached is not None and sample_value(_elements(t)) * cached < numel:
                continue  # small (broadcast) inputs stay in cache
            inner = _inner(coords, t, dims, unit)
            if len(inner) != 1 or inner[0] == d0:
                continue
            d1 = inner[0]
            step = max(step, _step(coords, t, Name(f"p{d0}")))
            if found is None and (min_dim is None or all(
                    not isinstance(shape[d], int) or shape[d] >= min_dim for d in (d0, d1))):
                found = d1
        return None if found is None else cls(d0, found, step)


def across(region, registry: Any, type_of: TypeOf, outputs: Sequence[Value], d0: int,
           stops: Collection[Value] = ()) -> Tiles | None:
    """The tile plan of a walk of ``outputs`` whose innermost dim is ``d0`` against an
    input of any size read across it, along the dim it steps least along (a CPU's cache
    holds no input whole: ``cached=None, unit=False``); None where there is none, or the
    probe cannot follow the group's index math (the row walk is as right, only slower)."""
    try:
        found = Tiles.of(region, registry, type_of, None, outputs, cached=None, unit=False,
                         stops=stops)
    except Unsupported:
        return None
    return found if found is not None and found.d0 == d0 else None


def tile_rows(sizes: Sequence[Any], lines: Sequence[Any], row_loop: stmt.Loop,
              plan: Callable[[], Tiles | None], smaller: Callable[[Code, Code], Code],
              index: str) -> tuple[int, list] | None:
    """A walk's rows (``sizes``: its rows' dims, then a row's) in tiles of :data:`TILE`
    rows by :data:`TILE` elements of a row: (the number of tiles, the statements of tile
    ``xt``): ``lines``, a row ``x``'s statements holding ``row_loop`` (its loop over the
    row), in a loop over the tile's rows ``[xt0, xt1)``, ``row_loop`` over the tile's
    elements ``[jt0, jt1)``; each element computed as before, in another order::

        Loop x in [0, R): body, Loop j in [0, N)      Loop xt in [0, tiles):
                                                 ->     xt0, xt1, jt0, jt1
                                                        Loop x in [xt0, xt1): body,
                                                          Loop j in [jt0, jt1)

    None where tiles do not pay: sizes not static, fewer than ``2 * TILE`` rows or
    elements in a row, or ``plan()`` (:func:`across`, asked last: it probes the group)
    has no input read across the walk by :data:`STRIDED` elements or more per element.
    ``smaller(a, b)``: the target's minimum of two indices; ``index``: the type its
    declarations of indices give (``int64_t``, the lowering's ``i64``)."""
    rows, inner = prod(list(sizes[:-1])), sizes[-1]
    if not (isinstance(rows, int) and isinstance(inner, int)) or min(rows, inner) < 2 * TILE \
            or not any(s is row_loop for s in lines):
        return None
    found = plan()
    if found is None or found.step < STRIDED:
        return None
    across_, down = -(-inner // TILE), -(-rows // TILE)
    head = [stmt.Declare(index, "xt0", expr.times(expr.over("xt", across_), TILE)),
            stmt.Declare(index, "xt1", smaller(expr.plus("xt0", TILE), expr.as_node(rows))),
            stmt.Declare(index, "jt0", expr.times(expr.modulo("xt", across_), TILE)),
            stmt.Declare(index, "jt1", smaller(expr.plus("jt0", TILE), expr.as_node(inner)))]
    body = [attrs.evolve(s, start="jt0", end="jt1") if s is row_loop else s for s in lines]
    return across_ * down, [*head, stmt.Loop("x", "xt0", "xt1", tuple(body))]


def turned(walk: Walk, plan: Callable[[], Tiles | None]) -> Walk:
    """The walk to take: ``walk`` itself (the first output in memory order), or, where its
    innermost dim is static and of :data:`SHORT` elements or fewer and ``plan()``
    (:func:`across`) has an input reading across it by :data:`STRIDED` elements or more
    per step, along a static dim ``d1`` of at least ``2 * TILE``, the walk turned with
    ``d1`` innermost: rows too short for tiles (an NCHW image copied to channels-last,
    rows of 3 channels each read from another plane) read the input's contiguous run
    along a row instead; each element is computed as before, in another order."""
    order, shape = walk.order, walk.shape
    if walk.flat or len(order) < 2 or not isinstance(shape[order[-1]], int) or \
            shape[order[-1]] > SHORT:
        return walk
    found = plan()
    if found is None or found.step < STRIDED or found.d1 not in order or \
            not isinstance(shape[found.d1], int) or shape[found.d1] < 2 * TILE:
        return walk
    return walk.turned(found.d1)
