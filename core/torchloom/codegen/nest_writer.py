"""The writer of one loop nest of a group, as every target that writes a nest element by
element builds it: :class:`NestWriter`, the base of the cpu codegen's ``KernelWriter`` and
of the core's lowering (``lower._Lowering``).

It is the pointwise nest's loops (:class:`~torchloom.codegen.walk_nest.WalkNest`), the
value walk (:class:`~torchloom.codegen.writer.ValueWalk`) and the reduction nest's fields
(:class:`~torchloom.codegen.schedule.PlannedNest`) over one state, born here: the
group's region, the values computed (the emitter's scopes, ``earlier``, ``reduced``), the
coordinates declared (``known``, ``row_values``, ``row_walks``), the row form's
coordinates (``full``, ``row``, ``row_keepdim``), the tensors read (``loaded``). A value
is read from memory the one way, the target spelling the element
(:meth:`~torchloom.codegen.spelling.Spelling.read`): a region input from its pointer
``in_<name>``, a value an earlier nest of the group stored (``read_back``) from there;
a target reading some tensors elsewhere (the cpu's staged blocks of rows) says where with
:meth:`NestWriter.element`.

What a subclass gives: ``spelling``, ``POINTWISE``, ``REDUCTIONS`` and
``tensor_type`` (the value walk's) and the data of the walk
(:mod:`~torchloom.codegen.walk_nest`); this class gives the reads (``read``, ``element``)
and the stores (``store``) every nest's skeleton asks for."""

from __future__ import annotations

from typing import Any

from torchloom.codegen.expr import Code
from torchloom.codegen.indexing import Coords, IndexMath
from torchloom.codegen.schedule import PlannedNest, ReductionNest
from torchloom.codegen.walk_nest import WalkNest
from torchloom.codegen.writer import COMPUTE, Expr, Statements, ValueWalk
from torchloom.ir import Node, TensorType, Value


class NestWriter(WalkNest, ValueWalk, PlannedNest):
    """One nest of ``group`` (see the module docstring): ``em`` its statements, ``ix`` its
    index math, ``reductions`` the reductions it computes over ``nest`` (P's shape, its
    reduced dims: read through :class:`~torchloom.codegen.schedule.PlannedNest`; none for
    a pointwise nest, or one the writer plans later), ``read_back`` the values an earlier
    nest stored (value -> the pointer it stored them to)."""

    def __init__(self, group: Node, registry: Any, em: Statements, ix: IndexMath,
                 reductions: list[Node], read_back: dict[Value, str],
                 nest: ReductionNest | None = None):
        self.region, self.registry = group.region, registry
        self.reduction_nest = nest if nest is not None else ReductionNest((), ())
        self.em, self.ix = em, ix
        self.reductions = reductions
        self.read_back = read_back
        #: coordinates -> the linear index they came from
        self.known: dict = {}
        #: the row coordinates' names -> their index math (``x0`` -> ``x / 8``)
        self.row_values: dict[str, Code] = {}
        #: (index, shape) of each walk whose row coordinates were declared
        self.row_walks: list[tuple[str, tuple]] = []
        #: reduction output -> (the coordinates of its row, its value)
        self.reduced: dict[Value, tuple[Coords, Expr]] = {}
        #: the values phases closed since computed (ValueWalk.known_value)
        self.earlier: dict[tuple[Value, Coords], Expr] = {}
        #: the tensors the nest reads from memory: region inputs, values read back
        self.loaded: set[Value] = set()
        #: the row form's coordinates of element (x, r), of row x, and of row x with the
        #: reduced dims kept as 0 (keepdim results); None outside a reduction's row
        self.full: Coords | None = None
        self.row: Coords | None = None
        self.row_keepdim: Coords | None = None

    # ---- reads -------------------------------------------------------------------------
    def _compute(self, v: Value, coords: Coords) -> Expr:
        pointer = self.read_back.get(v)
        if pointer is None:
            return super()._compute(v, coords)
        t = self.tensor_type(v)  # stored by an earlier nest: read from memory again
        return self.read(v, pointer, self.ix.address(coords, t.actual_strides(), t.shape,
                                                     self.known))

    def _load(self, v: Value, t: TensorType, coords: Coords) -> Expr:
        return self.read(v, *self.element(f"in_{v.name}", coords, t, False))

    def read(self, v: Value, pointer: str, offset: Code) -> Expr:
        """Element ``offset`` of tensor ``v`` at ``pointer``, bound to a name."""
        self.loaded.add(v)
        dtype = self.tensor_type(v).dtype
        return self.em.emit(self.spelling.read(pointer, offset, dtype), COMPUTE[dtype],
                            v.name)

    def element(self, pointer: str, coords: Coords, t: TensorType, output: bool
                ) -> tuple[str, Code]:
        """(pointer, offset) of the element at ``coords`` of the tensor of type ``t`` at
        ``pointer`` (an ``output`` the nest stores, or a tensor it reads): at its strided
        offset there (a target's override may read a tensor from elsewhere)."""
        return pointer, self.ix.address(coords, t.actual_strides(), t.shape, self.known)

    # ---- stores ------------------------------------------------------------------------
    def store(self, pointer: str, v: Value, coords: Coords, e: Expr | None = None) -> None:
        """Output ``v``'s element at ``coords`` stored to the tensor at ``pointer``: its
        value there (``e``, else :meth:`value_at`), in the open phase where the store reads
        an inner name, else before its loop; nothing for an empty output."""
        t = self.tensor_type(v)
        if 0 in t.shape:
            return  # an empty output: nothing to write
        e = self.value_at(v, coords) if e is None else e
        pointer, offset = self.element(pointer, coords, t, True)
        line = self.spelling.store(pointer, offset, e, t.dtype, self.em)
        self.em.statement(line, self.em.reads_inner(line))
