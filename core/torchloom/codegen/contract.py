"""The codegen contract: what the core gives a renderer for a fusion group, and what a
renderer gives back (docs/writing-a-codegen.md walks through it with examples).

A group becomes a kernel in three steps, two of them the core's::

    fusion group ──Schedule.of──▶ Schedule      (frozen data: the kernel's form, its nest,
                                                  the dtypes, devices, ops it needs)
                 ──Capabilities.gap──▶ declined with the reason, or
                 ──lower.lower──▶ Lowered        (statements of torchloom.codegen.stmt,
                                                  parameters, a LaunchSpec)
                 ──Renderer.render──▶ source     ──Renderer.build──▶ callable kernel

- :class:`Schedule`: a group's kernel form (:data:`FORMS`: ``pointwise``,
  ``row_reduction``, ``column_reduction``, ``strided_reduction``, ``several_nests``), its
  :class:`~torchloom.codegen.schedule.ReductionNest` (None for pointwise), the dtypes,
  devices, ops and reduction kinds it holds, its symbolic sizes;
- :class:`Capabilities`: what a renderer renders (forms, dtypes, devices, reduction kinds,
  ops, symbolic sizes); :meth:`Capabilities.gap` is the reason a group is declined;
- :class:`Renderer`: the protocol a target implements (its op table and expression
  spelling, ``render`` and ``build``);
- :class:`~torchloom.codegen.lower.RendererCodegen` (in ``lower``): the
  :class:`~torchloom.codegen.base.Codegen` made of a renderer (``supports``: schedule,
  capabilities, lowering; ``generate``: render; ``load``: build);
- :class:`LaunchSpec`: how the built kernel is called (JSON in the kernel's metadata).

The ``cpu`` and ``triton`` codegens keep their own writers over the shared nest plan
(:mod:`torchloom.codegen.schedule`), report the schedule's form in their kernels' metadata
and decline through their :class:`Capabilities`; ``examples/third_party_codegen``
(``scalar_c``) is a renderer written against this contract alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from torchloom.codegen.base import Kernel, Reason
from torchloom.codegen.empty_rows import empty_error, raise_if_empty, raises_when_empty
from torchloom.codegen.indexing import Language, Unsupported
from torchloom.codegen.reductions import reduction_table
from torchloom.codegen.schedule import ReductionNest, RowsAndColumns, nest_classes
from torchloom.codegen.writer import VIEWS, reduced_dims
from torchloom.ir import Node, TensorType, Value, symbols

#: kernel forms a schedule can have, in the order a renderer usually gains them
FORMS = ("pointwise", "row_reduction", "column_reduction", "strided_reduction",
         "several_nests")
#: every reduction op the core lowers (its kind by op name)
REDUCTION_KINDS = {op: spec.kind for op, spec in reduction_table("{x}").items()}


def _real(shape: Sequence[Any], dims: Sequence[int]) -> list[int]:
    return [d for d in dims if shape[d] != 1]


def _form(nest: ReductionNest) -> str:
    """A reduction nest's form: its rows contiguous (``row_reduction``), its reduced dims
    outermost (``column_reduction``), or interleaved (``strided_reduction``)."""
    shape = nest.shape
    rdims, kept = _real(shape, nest.rdims), _real(shape, nest.kept)
    if not kept or not rdims or min(rdims) > max(kept):
        return "row_reduction"
    return "column_reduction" if min(kept) > max(rdims) else "strided_reduction"


def _tensor_values(region) -> list[Value]:
    values = [*region.inputs, *(v for n in region.nodes for v in n.outputs)]
    return [v for v in values if isinstance(v.type, TensorType)]


@attrs.frozen
class Schedule:
    """A fusion group's kernel, target-independent: ``form`` (one of :data:`FORMS`),
    ``nest`` (the reduction nest; None for pointwise), ``shape`` (the nest's shape P, or
    the first output's for pointwise), and what the group holds: ``dtypes``, ``devices``,
    ``ops`` (pointwise op names; views are index math), ``reductions`` (op -> kind),
    ``symbols`` (symbolic dims). ``detail`` says what makes the form, for reasons;
    ``rows_and_columns``, the row + column plan of a ``several_nests`` group that has one;
    ``parts``, the forms of its reduction nests (a renderer must render each).

    ``sum(a: f32[9, 7], dim=[0])`` is ``Schedule(form="column_reduction",
    nest=ReductionNest((9, 7), (0,)), detail="reduces dims [0] of [9, 7]", ...)``."""

    form: str
    shape: tuple[Any, ...]
    nest: ReductionNest | None
    dtypes: frozenset[str]
    devices: frozenset[str]
    ops: frozenset[str]
    reductions: Mapping[str, str]
    symbols: frozenset[str]
    detail: str
    #: a ``several_nests`` group whose two nests reduce one shape by rows and by columns
    #: (:class:`~torchloom.codegen.schedule.RowsAndColumns`): the native codegens write
    #: them as one kernel
    rows_and_columns: RowsAndColumns | None = None
    #: a ``several_nests`` group's reduction nests' forms (``row_reduction``, ...), in the
    #: order their classes come (:func:`~torchloom.codegen.schedule.nest_classes`)
    parts: tuple[str, ...] = ()

    @classmethod
    def of(cls, group: Node) -> Schedule:
        """The schedule of fusion group ``group``; :class:`Unsupported` for a group no
        kernel form holds (no outputs, a scalar output)."""
        region = group.region
        if not region.outputs:
            raise Unsupported("the group has no outputs")
        for v in region.outputs:
            if not isinstance(v.type, TensorType):
                raise Unsupported(f"output %{v.name} is a scalar")
        values = _tensor_values(region)
        nodes = list(region.nodes)
        reds = [n for n in nodes if n.op in REDUCTION_KINDS]
        for n in reds:
            why = raises_when_empty(n, REDUCTION_KINDS[n.op])
            if why is not None:
                raise Unsupported(why)
        ops = frozenset(n.op for n in nodes if n.op not in VIEWS and n.op not in REDUCTION_KINDS)
        symbols = frozenset(str(d) for v in values for d in (*v.type.shape,
                                                             *(v.type.strides or ()))
                            if not isinstance(d, int))
        common = dict(dtypes=frozenset(v.type.dtype for v in values),
                      devices=frozenset(v.type.device for v in values), ops=ops,
                      reductions={n.op: REDUCTION_KINDS[n.op] for n in reds}, symbols=symbols)
        if not reds:
            shape = tuple(region.outputs[0].type.shape)
            return cls("pointwise", shape, None, detail=f"elementwise over {list(shape)}",
                       **common)
        try:
            nest = ReductionNest.of(reds, lambda v: v.type)
        except Unsupported as exc:
            classes = nest_classes(reds, lambda v: v.type.shape)
            return cls("several_nests", (), None, detail=str(exc),
                       rows_and_columns=RowsAndColumns.of(reds, lambda v: v.type.shape),
                       parts=tuple(_form(ReductionNest.of(c, lambda v: v.type))
                                   for c in classes), **common)
        detail = f"reduces dims {list(nest.rdims)} of {list(nest.shape)}"
        return cls(_form(nest), nest.shape, nest, detail=detail, **common)


def _device_type(device: str) -> str:
    """``cuda`` of ``cuda:1``: the device type capabilities name."""
    return device.split(":")[0]


@attrs.frozen
class Capabilities:
    """What a renderer renders: kernel ``forms`` (of :data:`FORMS`), IR ``dtypes``,
    ``devices`` (device types: ``cuda`` covers ``cuda:1``), reduction ``kinds`` (sum, prod,
    max, min, var, argmax, argmin, any, all), pointwise ``ops`` (its op table's names) and
    whether sizes may be ``symbolic``. The native codegens declare theirs too
    (``torchloom_codegen_cpu.codegen.CAPABILITIES``), and their ``supports`` asks
    :meth:`declines` first."""

    forms: frozenset[str]
    dtypes: frozenset[str]
    ops: frozenset[str]
    kinds: frozenset[str] = frozenset()
    devices: frozenset[str] = frozenset({"cpu"})
    symbolic: bool = False

    def takes_device(self, device: str) -> bool:
        """Whether groups on ``device`` (``cuda:1``: its type, ``cuda``) are on a device
        these capabilities render for."""
        return _device_type(device) in self.devices

    def gap(self, schedule: Schedule) -> str | None:
        """Why a renderer with these capabilities cannot render ``schedule`` (the first
        thing it lacks), or None."""
        if schedule.form not in self.forms:
            return (f"renders {', '.join(f for f in FORMS if f in self.forms)} kernels; this "
                    f"group is a {schedule.form} ({schedule.detail})")
        for part in schedule.parts:  # each nest of several is a form of its own
            if part not in self.forms:
                return (f"renders {', '.join(f for f in FORMS if f in self.forms)} nests; "
                        f"this group's nests include a {part} ({schedule.detail})")
        devices = frozenset(map(_device_type, schedule.devices))
        for what, have, need in (("device", self.devices, devices),
                                 ("dtype", self.dtypes, schedule.dtypes)):
            if need - have:
                return f"renders no {what} {', '.join(sorted(need - have))}"
        if schedule.symbols and not self.symbolic:
            return f"renders static sizes only; the group has {', '.join(sorted(schedule.symbols))}"
        missing = sorted(schedule.ops - self.ops)
        if missing:
            return f"op {missing[0]} is not in its op table"
        for op, kind in sorted(schedule.reductions.items()):
            if kind not in self.kinds:
                return f"reduction {op} ({kind}) is not among its reductions"
        return None


    def declines(self, group: Node) -> str | None:
        """Why fusion group ``group`` is not rendered: :meth:`gap` of its schedule, or
        why it has no schedule; None when these capabilities cover it."""
        try:
            return self.gap(Schedule.of(group))
        except Unsupported as exc:
            return str(exc)

    def reason(self, codegen: str, group: Node) -> Reason | None:
        """:meth:`declines` as codegen ``codegen``'s :class:`Reason` (what ``supports``
        returns), or None."""
        why = self.declines(group)
        return None if why is None else Reason(codegen, why)


@attrs.frozen
class OpTemplate:
    """A pointwise op in a renderer's table: ``template``, the expression over the op's
    arguments by schema name (``"{self} + {other}"``), or a function of (the op's
    attributes, the compute dtype) giving one; ``args``: what the operands are converted
    to first (``"out"``: the result's compute dtype; ``"promote"``: the promoted input
    dtype, for comparisons; ``"where"``: a bool condition, the rest as the result;
    ``"keep"``: as they are; ``"cast"``: an explicit conversion, the template unused);
    ``ints``: whether it also serves integer and bool results."""

    template: str | Callable[[Mapping[str, Any], str], str]
    args: str = "out"
    ints: bool = False

    def text(self, attrs_: Mapping[str, Any], compute: str) -> str | None:
        if compute not in ("f32", "f64") and not self.ints:
            return None
        return self.template(attrs_, compute) if callable(self.template) else self.template


@attrs.frozen
class Param:
    """A kernel parameter: ``name``, ``role`` (``input``: a tensor read, ``scalar``: a
    Python number, ``output``: a tensor written, ``scratch``: an array the kernel writes
    and reads back, one value per row of a nest, that the launcher allocates; ``size``:
    the value of a size symbol, an ``i64`` the launcher reads from an input's shape,
    :meth:`LaunchSpec.bind`) and ``dtype`` (IR dtype; a scalar's compute dtype)."""

    name: str
    role: str
    dtype: str


def size_param(symbol: str) -> str:
    """The name of the ``size`` parameter holding size symbol ``symbol`` (``size_s0``)."""
    return f"size_{symbol}"


@attrs.frozen
class Bound:
    """A :class:`LaunchSpec` at one call's sizes (:meth:`LaunchSpec.bind`): the ``size``
    arguments' values in the order of their params, and every output's, scratch array's
    and input's dims as ints."""

    sizes: tuple[int, ...]
    outputs: tuple[tuple[tuple[int, ...], tuple[int, ...], str], ...]
    scratch: tuple[tuple[int, str], ...]
    inputs: tuple[tuple[tuple[int, ...], tuple[int, ...]] | None, ...]


def _dims(dims: Sequence[Any]) -> tuple[Any, ...]:
    """Dims as stored in JSON: ints as they are, size expressions as their text."""
    return tuple(d if isinstance(d, int) else str(d) for d in dims)


@attrs.frozen
class LaunchSpec:
    """How a kernel is called: ``entry`` (its function's name), ``params`` in order (the
    group's inputs, then its outputs, its scratch arrays, its size arguments), each
    output's ``shape``, ``strides`` and dtype for the launcher to allocate, each scratch
    array's element count and dtype (``scratch``: a kernel of several nests whose later
    nests read row results an earlier one computed; any contents will do, nothing is
    read before it is written), and the ``shape`` and ``strides`` the kernel reads each
    tensor input at (``inputs``, one per input, None for a scalar: the codegen made of
    the renderer hands the kernel a copy laid out so where a tensor comes otherwise).

    Dims are ints, or size expressions (``"s0"``, ``"16*s0"``) for a group with symbolic
    sizes: ``sizes`` then says where each size argument's symbol is read, ``(symbol, i,
    k)``, dim ``k`` of the kernel's argument ``i``, and :meth:`bind` gives a call's
    values; ``nonempty``, the reductions of empty rows :meth:`bind` raises eager's error
    for (:func:`~torchloom.codegen.empty_rows.nonempty_dims`)."""

    entry: str
    params: tuple[Param, ...]
    outputs: tuple[tuple[tuple[Any, ...], tuple[Any, ...], str], ...]
    scratch: tuple[tuple[Any, str], ...] = ()
    inputs: tuple[tuple[tuple[Any, ...], tuple[Any, ...]] | None, ...] = ()
    sizes: tuple[tuple[str, int, int], ...] = ()
    nonempty: tuple[tuple[Any, tuple[Any, ...], str, str], ...] = ()

    def bind(self, args: Sequence[Any]) -> Bound:
        """This spec at the sizes of the call's arguments ``args`` (the group's inputs,
        tensors and scalars, in order): symbols read from the tensors' shapes, every dim
        evaluated. ``SymbolicDimError`` for an expression that is no integer there, and
        eager's error for a ``nonempty`` dim of 0."""
        env = {s: int(args[i].shape[k]) for s, i, k in self.sizes}
        raise_if_empty(self.nonempty, env)

        def ints(dims):
            return tuple(symbols.evaluate(d, env) for d in dims)
        return Bound(tuple(env[s] for s, _, _ in self.sizes),
                     tuple((ints(s), ints(st), d) for s, st, d in self.outputs),
                     tuple((symbols.evaluate(n, env), d) for n, d in self.scratch),
                     tuple(None if i is None else (ints(i[0]), ints(i[1]))
                           for i in self.inputs))

    def to_json(self) -> dict:
        data = {"entry": self.entry, "params": [attrs.astuple(p) for p in self.params],
                "outputs": [[list(_dims(s)), list(_dims(st)), d] for s, st, d in self.outputs],
                "inputs": [None if i is None else [list(_dims(i[0])), list(_dims(i[1]))]
                           for i in self.inputs]}
        if self.scratch:
            data["scratch"] = [[_dims((n,))[0], d] for n, d in self.scratch]
        if self.sizes:
            data["sizes"] = [list(entry) for entry in self.sizes]
        if self.nonempty:
            data["nonempty"] = [[d, list(seen), e, m] for d, seen, e, m in self.nonempty]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchSpec:
        """The spec ``to_json`` wrote (a kernel's metadata, read back from a cache: data,
        checked where it names something: an error of ``EMPTY_ERRORS``)."""
        for check in data.get("nonempty", ()):
            empty_error(check[2])
        return cls(data["entry"], tuple(Param(*p) for p in data["params"]),
                   tuple((tuple(s), tuple(st), d) for s, st, d in data["outputs"]),
                   tuple((n, d) for n, d in data.get("scratch", ())),
                   tuple(None if i is None else (tuple(i[0]), tuple(i[1]))
                         for i in data.get("inputs", ())),
                   tuple((s, int(i), int(k)) for s, i, k in data.get("sizes", ())),
                   tuple((d, tuple(seen), e, m) for d, seen, e, m in data.get("nonempty", ())))


@attrs.frozen
class Lowered:
    """A group lowered for a renderer: its ``schedule``, the kernel's ``launch`` spec and
    ``body``, statements of :mod:`torchloom.codegen.stmt` whose expressions are the
    renderer's text (``Declare.ctype`` and ``Var.ctype`` hold compute dtypes: ``f32``),
    and what the source needs besides (``needs``: the names a renderer's own spelling
    asked for with the emitter's ``use``, a helper of its module say; in order)."""

    schedule: Schedule
    launch: LaunchSpec
    body: tuple[Any, ...]
    needs: tuple[str, ...] = ()


@runtime_checkable
class Renderer(Protocol):
    """A codegen target, as the core lowers for it (see docs/writing-a-codegen.md).

    Data: ``name``, ``version``, ``capabilities``; ``ops`` (op name -> :class:`OpTemplate`),
    ``language`` (index arithmetic: :data:`torchloom.codegen.indexing.C`), ``sqrt`` (a
    square root of ``{x}``, for std: an f64 value where the renderer has f64, the
    accumulator's dtype). Expression spelling: ``literal``, ``convert``,
    ``round``, ``read``, ``store_value``, ``initial``, ``accumulate``. Output: ``render``
    (a :class:`Lowered` to source) and ``build`` (source to a callable kernel). Optional:
    ``available() -> str | None``, what this machine lacks to build kernels (a compiler);
    ``spelling``, a :class:`~torchloom.codegen.spelling.Spelling` the lowering writes
    values with instead of the text methods (``spelling.spelling_of``)."""

    name: str
    version: str
    capabilities: Capabilities
    ops: Mapping[str, OpTemplate]
    language: Language
    sqrt: str

    def literal(self, value: Any, dtype: str) -> str:
        """A Python number as a constant of compute dtype ``dtype``."""

    def convert(self, text: str, source: str, target: str) -> str:
        """Value ``text`` of compute dtype ``source`` converted to compute dtype ``target``
        (``text`` is an operand: a name, a literal or a parenthesised expression)."""

    def round(self, text: str, dtype: str) -> str:
        """An f32 value rounded to low-precision IR dtype ``dtype`` (bf16, f16), as f32."""

    def read(self, pointer: str, offset: str, dtype: str) -> str:
        """Element ``offset`` of tensor ``pointer`` (IR dtype ``dtype``) in its compute dtype."""

    def store_value(self, text: str, dtype: str) -> str:
        """A compute value as stored in a tensor of IR dtype ``dtype``."""

    def initial(self, kind: str, dtype: str) -> str:
        """The starting value of a ``kind`` accumulator of compute dtype ``dtype``."""

    def accumulate(self, kind: str, acc: str, value: str, index: str, extra: str) -> list:
        """Statements folding ``value`` (element ``index`` of the row) into ``acc``:
        ``extra`` is the row's mean for ``var`` and the value accumulator for
        ``argmax``/``argmin`` (whose ``acc`` is the index)."""

    def render(self, kernel: Lowered) -> str:
        """The kernel's source."""

    def build(self, source: str, launch: LaunchSpec) -> Kernel:
        """A callable running ``source``: ``kernel(*inputs) -> tuple(outputs)``."""
