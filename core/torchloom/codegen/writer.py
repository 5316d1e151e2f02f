"""What every native codegen's kernel writer shares, whatever language it writes.

A writer computes a group's values lazily at coordinates (``value_at``): a region input is
a load, a view maps coordinates to its input's, a reduction result is read where its row
was reduced, and a pointwise op is its template over its inputs at broadcast coordinates.
The dispatch, the argument conversions of a pointwise op, the value numbering of
statements and the tables that do not depend on the target are here; a codegen gives its
templates (rows of :mod:`torchloom.codegen.op_rows`) and its spelling of values
(:mod:`torchloom.codegen.spelling`).

- :class:`Expr`: a value in the kernel (its expression, a node of
  :mod:`torchloom.codegen.expr`; its compute dtype; whether it depends on the inner
  (reduced or SIMD) index);
- :class:`Statements` (:mod:`torchloom.codegen.statements`, re-exported): statements in
  scopes numbered by their text, with *phases* (loops over the inner index) whose
  loop-invariant statements go before the loop;
- :class:`ValueWalk`: the value walk, a mixin of the target's writer (with the output
  placement of a reduction kernel, :class:`~torchloom.codegen.placement.OutputPlacement`);
- tables: ``COMPUTE`` (IR dtype -> compute dtype), ``FLOATS``, ``VIEWS`` (view op ->
  its index rule in :mod:`torchloom.codegen.indexing`), ``SCALAR_DTYPES``;
- helpers: :func:`named_args`, :func:`output_names`, :func:`promote_dtype`,
  :func:`reduced_dims`, :func:`var_correction`, :func:`same_shape` (indexing's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import attrs
import torch

from torchloom.codegen.expr import Code, Literal, Load, Name, Op, substitute, wrapped
from torchloom.codegen.gathers import GATHER_OPS
from torchloom.codegen.indexing import Coords, Unsupported
from torchloom.codegen.indexing import same_shape  # noqa: F401 (re-exported: writers' helper)
from torchloom.codegen.placement import OutputPlacement
from torchloom.codegen.stmt import Element, Store
from torchloom.codegen.statements import Statements  # noqa: F401 (re-exported: writers' base)
from torchloom.ir import DTYPES, InputRef, Node, ScalarType, TensorType, Value

#: IR dtype -> dtype the kernel computes in (fp16/bf16 are computed in fp32, as eager does)
COMPUTE = {"f64": "f64", "f32": "f32", "f16": "f32", "bf16": "f32", "i64": "i64",
           "i32": "i32", "i16": "i16", "i8": "i8", "u8": "u8", "b8": "b8"}
FLOATS = ("f64", "f32", "f16", "bf16")
#: scalar group inputs a kernel takes as arguments -> their compute dtype
SCALAR_DTYPES = {"float": "f64", "int": "i64", "bool": "b8"}
#: view ops: how output coordinates map to input coordinates (see ``indexing.view_coords``)
VIEWS = {
    "aten.view.default": "reshape", "aten._unsafe_view.default": "reshape",
    "aten.reshape.default": "reshape", "aten.squeeze.dim": "reshape",
    "aten.squeeze.dims": "reshape", "aten.squeeze.default": "reshape",
    "aten.unsqueeze.default": "reshape", "aten.flatten.using_ints": "reshape",
    "aten.permute.default": "permute", "aten.transpose.int": "transpose",
    "aten.t.default": "transpose", "aten.expand.default": "expand",
    "aten.slice.Tensor": "slice", "aten.select.int": "select",
    "aten.split.Tensor": "split", "aten.split_with_sizes.default": "split_with_sizes",
    "aten.unbind.int": "unbind",
}


#: view kinds whose coordinates depend on argument values (an offset), not only on shapes
_OFFSET_VIEWS = frozenset({"slice", "select", "split", "split_with_sizes"})


#: (view rule, argument) a kernel reads at run time when a graph value (a slice's: with its end)
_RUN_TIME_ARGS = frozenset({("slice", "start"), ("select", "index"), ("split", "split_size")})


@attrs.frozen
class Expr:
    """A value in the kernel: its expression ``code`` (a name or literal once bound), its
    compute dtype, and whether it depends on the inner index (varies along a row's loop)."""

    code: Code = attrs.field(validator=attrs.validators.instance_of((Name, Literal, Op, Load)))
    dtype: str
    inner: bool = False

    @property
    def text(self) -> str:
        return self.code.text


class ValueWalk(OutputPlacement):
    """The value walk of a kernel writer (mixed into the target's ``KernelWriter``).

    The writer has ``em`` (its emitter: ``emit``, ``convert``, ``cast``), ``ix`` (its
    ``IndexMath``), ``known``, ``registry``, ``reduced`` (reduction output -> (coordinates
    of its row, its Expr)), ``earlier`` (the values phases closed since computed, each
    at its key: :meth:`known_value`) and ``spelling`` (how its target writes values: a
    :class:`~torchloom.codegen.spelling.Spelling`, whose ``name`` reasons give); it gives
    the class attributes ``POINTWISE``, ``REDUCTIONS`` and the methods ``tensor_type``
    and ``_load``."""

    #: scalar group inputs the kernel takes as arguments -> their compute dtype
    SCALAR_DTYPES: ClassVar[Mapping[str, str]] = SCALAR_DTYPES
    POINTWISE: ClassVar[Mapping[str, Any]]
    REDUCTIONS: ClassVar[Mapping[str, Any]]
    #: whether the target reads tables at indices (:data:`GATHER_OPS`) with
    #: :meth:`checked_index`
    GATHERS: ClassVar[bool] = False

    def known_value(self, key: tuple[Value, Coords]) -> tuple[Expr | None, Expr | None]:
        """The value computed at ``key`` (a value, coordinates) that is in scope here (in
        the emitter's scope or one around it), or else the one an earlier phase computed
        there (out of scope: it depended on that phase's inner index; ``earlier``);
        (None, None) where none was."""
        hit = self.em.lookup(("value", key))
        if hit is not None:
            return hit, None
        return None, self.earlier.get(key)

    def value_at(self, v: Value, coords: Coords) -> Expr:
        """Value ``v`` at ``coords``: the one in scope, else computed (:meth:`_compute`)
        and kept where its statement went (:meth:`keep_value`). Where the target keeps
        ``v`` in a row buffer (:meth:`row_buffer`), a value an earlier loop over the row
        computed is read from there, and one computed in the loop is stored there."""
        key = (v, coords)
        hit, earlier = self.known_value(key)
        if hit is not None:
            return hit
        buffer = self.row_buffer(v, coords)
        if buffer is not None and earlier is not None:
            hit = self.em.emit(Load(buffer.pointer, buffer.offset), earlier.dtype, v.name,
                               inner=True)
        else:
            hit = self._compute(v, coords)
            # a value the loop does not change (its row holds one element, or it is
            # broadcast along the row) is computed once before the loop: not stored, as
            # a store in the loop would land after the stores hoisted out of it (the
            # buffer can be an output's row: out[0] = tanh(x) * 0.5 + ...; out[0] = tanh(x))
            if buffer is not None and hit.inner:
                self.em.statement(Store(buffer, hit.code), True)
        self.keep_value(key, hit)
        return hit

    def row_buffer(self, v: Value, coords: Coords) -> Element | None:
        """The element of the row buffer the target keeps ``v`` in at ``coords`` (none by
        default: a target keeping expensive values of a row for the loops after the first
        says where)."""
        return None

    def set_result(self, value: Value, coords: Coords, e: Expr) -> None:
        """Reduction output ``value`` is ``e``, read at ``coords`` (its row)."""
        self.reduced[value] = (coords, e)

    def keep_value(self, key: tuple[Value, Coords], e: Expr) -> None:
        """``e`` is the value at ``key``, in scope where it was computed: in the open
        phase when it depends on the inner index (then also ``earlier``), else before
        the phase's loop."""
        inner = self.em.in_phase and (bool(e.inner) or self.em.is_inner(e.code))
        self.em.remember(("value", key), e, inner)
        if inner:
            self.earlier[key] = e

    def region_devices(self, region) -> set[str]:
        """The devices of the region's tensors; Unsupported for an op without template, a
        group without outputs or a value the target cannot hold."""
        devices = set()
        for v in region.inputs:
            if isinstance(v.type, ScalarType) and v.type.kind in self.SCALAR_DTYPES:
                continue  # a kernel argument
            devices.add(self.tensor_type(v).device)
        for n in region.nodes:
            known = n.op in self.POINTWISE or n.op in VIEWS or n.op in self.REDUCTIONS
            if not known and not (self.GATHERS and n.op in GATHER_OPS):
                category = self.registry.category(n.op)
                raise Unsupported(f"op {n.op} ({category}) has no {self.spelling.name} "
                                  f"template")
            for v in n.outputs:
                devices.add(self.tensor_type(v).device)
        if not region.outputs:
            raise Unsupported("the group has no outputs")
        for v in region.outputs:
            devices.add(self.tensor_type(v).device)
        return devices

    def _compute(self, v: Value, coords: Coords):
        node = v.producer
        if node is None and isinstance(v.type, ScalarType):
            return Expr(Name(f"in_{v.name}"), self.SCALAR_DTYPES[v.type.kind])
        t = self.tensor_type(v)
        if node is None:
            return self._load(v, t, coords)
        if node.op in VIEWS:
            src, attrs = node.inputs[0], node.attrs
            if len(node.inputs) > 1 and VIEWS[node.op] in _OFFSET_VIEWS:
                # a start, index or split size known only at run time (a reshape's sizes
                # may be: its coordinates follow from the types' symbolic shapes)
                args = named_args(self.registry.get(node.op), node)
                computed = [name for name, value in args.items()
                            if name not in ("self", "end") and (
                                isinstance(value, InputRef) or (
                                    isinstance(value, (list, tuple)) and
                                    any(isinstance(e, InputRef) for e in value)))]
                rule = VIEWS[node.op]
                if computed == ["start"] and rule == "slice" and \
                        not isinstance(args.get("end"), InputRef):
                    # the start is read from the types
                    attrs = {**attrs, "start": f"%{v.name}'s start"}
                elif len(computed) == 1 and (rule, computed[0]) in _RUN_TIME_ARGS:
                    # read at run time (Dynamo's guards hold it in range)
                    attrs = {**attrs, computed[0]: self._run_time_int(node, args, computed[0])}
                elif computed:  # (a slice's end only shapes its type, known from the sizes)
                    raise Unsupported(f"{node.op} of %{v.name} takes {', '.join(computed)} "
                                      f"from a graph value, not an attribute")
            self._check_view(node, v, t, src)
            in_coords = self.ix.view_coords(VIEWS[node.op], coords, attrs, t.shape,
                                            self.tensor_type(src).shape, self.known, v.index)
            return self.value_at(src, in_coords)
        if node.op in GATHER_OPS:
            return self._gather(node, t, coords)
        if node.op in self.REDUCTIONS:
            expected, e = self.reduced[v]
            if coords != expected and not self.same_elements(coords, expected):
                raise Unsupported(f"reduction result %{v.name} is read at other elements than "
                                  f"its row ({', '.join(map(str, coords))})")
            return e
        return self._pointwise(node, v, t, coords)

    def _gather(self, node: Node, t: TensorType, coords: Coords):
        """An embedding's element at ``coords``: the table's row the index at the leading
        coordinates names, at the last coordinate (the index checked by the target)."""
        table, ids = node.inputs[0], node.inputs[1]
        shape = _shape(table)
        if len(shape) != 2 or not isinstance(shape[0], int) or len(coords) != len(t.shape):
            raise Unsupported(f"{node.op} of a table of shape {list(shape)}")
        index = self.em.convert(self.value_at(ids, coords[:-1]), "i64")
        return self.value_at(table, (self.checked_index(ids, index, shape[0]), coords[-1]))

    def checked_index(self, ids: Value, index: Expr, rows: int) -> Code:
        """``index`` (an i64 value of ``ids``) as a row of a table of ``rows`` rows: a
        target that takes gathers (``GATHERS``) makes the kernel report an index outside
        ``[0, rows)`` as eager raises, and never reads past the table."""
        raise Unsupported(f"gathers have no {self.spelling.name} template")

    def _run_time_int(self, node: Node, args: Mapping[str, Any], name: str) -> Code:
        """The node reading the int argument ``name`` of ``node`` (``args``: its named
        arguments, that one an input) at run time: a kernel argument, so a group input;
        Unsupported for an int computed inside the group."""
        value = node.inputs[int(args[name])]
        if value.producer is not None or not isinstance(value.type, ScalarType) or \
                value.type.kind != "int" or "int" not in self.SCALAR_DTYPES:
            raise Unsupported(f"{node.op} of %{node.outputs[0].name} takes its {name} from "
                              f"%{value.name}, which is no int input of the group")
        return self.value_at(value, ()).code

    def same_elements(self, a: Coords, b: Coords) -> bool:
        """Whether coordinates ``a`` and ``b`` name the same element: equal once the
        coordinate names the writer declared stand for their values
        (:meth:`coordinate_values`: ``x0`` for ``x / 8``). A reduction result read
        through views that take the row apart and put it together again (OPT's dropout
        gradient reads layer_norm's row sums of ``[2, 8, 32]`` through a ``[16, 32]``
        view: ``(x / 8, x % 8, 0)``) is read at its row."""
        values = self.coordinate_values()
        if not values:
            return False
        return all(substitute(c, values) == substitute(d, values)
                   for c, d in zip(a, b)) and len(a) == len(b)

    def coordinate_values(self) -> Mapping[str, Code]:
        """The coordinate names the writer declared -> the index math they stand for
        (none by default: a target that names coordinates says so)."""
        return {}

    def row_input(self, reduction: Node) -> Callable[[], Any]:
        """``reduction``'s input at element (x, r) of the row (the writer's ``full``)."""
        return lambda: self.value_at(reduction.inputs[0], self.full)

    def row_of(self, reduction: Node) -> Coords:
        """Where ``reduction``'s results are read: ``row``, or ``row_keepdim`` (keepdim)."""
        return self.row_keepdim if reduction.attrs.get("keepdim", False) else self.row

    def _check_view(self, node: Node, v: Value, t: TensorType, src: Value) -> None:
        """A target's veto of a view in this kernel (none by default)."""

    def _operand(self, node: Node, k: int, e, result: str):
        """Input ``k`` of ``node`` (its value ``e``) as an op with result dtype ``result``
        computes on it: in the result's compute dtype, rounded to a bf16/f16 result's type
        first where eager converts it (:func:`_low_precision_operand`) and the target's
        eager does not keep it (the spelling's ``keeps_operand``)."""
        v = node.inputs[k]
        if _low_precision_operand(v, result) and not self.spelling.keeps_operand(node, k):
            return self.em.cast(e, result)
        return self.em.convert(e, COMPUTE[result])

    def _pointwise(self, node: Node, v: Value, t: TensorType, coords: Coords):
        spec = self.POINTWISE[node.op]
        if len(node.outputs) != 1:
            raise Unsupported(f"{node.op} has {len(node.outputs)} outputs")
        out = COMPUTE[t.dtype]
        em = self.em
        tensors = [self.value_at(i, self.ix.broadcast(coords, t.shape, _shape(i)))
                   for i in node.inputs]
        if spec.args == "cast":
            return em.cast(tensors[0], t.dtype)
        compute = out
        if spec.args == "promote":
            compute = promote_dtype([value_dtype(i, self.SCALAR_DTYPES) for i in node.inputs],
                                    node.attrs)
            tensors = [em.convert(e, compute) for e in tensors]
        elif spec.args == "out":
            tensors = [self._operand(node, k, e, t.dtype) for k, e in enumerate(tensors)]
        elif spec.args == "where":
            tensors = [em.convert(e, "b8") if k == 0 else self._operand(node, k, e, t.dtype)
                       for k, e in enumerate(tensors)]
        elif tensors:  # keep: the template sees the inputs as they are
            compute = tensors[0].dtype
        named = {}
        # what the template builders see: the attributes, and the arguments given as
        # inputs (a symbolic clamp bound, say) as their InputRef: present, not a number
        given = dict(node.attrs)
        for name, value in named_args(self.registry.get(node.op), node).items():
            if isinstance(value, InputRef):
                named[name] = wrapped(tensors[int(value)].code)
                given[name] = value
            elif isinstance(value, (bool, int, float)):
                named[name] = self._literal(node, self.spelling.scalar_operand(
                    node, name, value), compute)
        code = self.spelling.op(node, spec, named, compute, t.dtype, given, em)
        e = em.emit(code, "b8" if spec.args == "promote" else out, node.op.split(".")[1])
        if t.dtype in ("f16", "bf16") and spec.args != "keep":
            e = em.cast(e, t.dtype)  # eager rounds every low-precision result
        return e

    def _literal(self, node: Node, value: Any, compute: str) -> Code:
        """A number argument of ``node`` as the spelling's constant of dtype ``compute``."""
        try:
            return self.spelling.literal(value, compute)
        except TypeError as exc:
            raise Unsupported(f"{node.op}: {exc}") from None


def _low_precision_operand(v: Value, result: str) -> bool:
    """Whether tensor ``v`` read by an op whose result is bf16/f16 ``result`` is of
    another type: eager converts such an operand (a 0-d f32 tensor, an int tensor) to the
    op's common type first, rounding it."""
    return result in ("bf16", "f16") and isinstance(v.type, TensorType) \
        and v.type.dtype != result


def output_names(region) -> list[str]:
    """The kernel parameter of each region output: ``out_<value>``, with ``_<i>`` after a
    name already given (the cpu and Triton writers name their outputs so)."""
    names: list[str] = []
    for i, v in enumerate(region.outputs):
        name = f"out_{v.name}"
        names.append(name if name not in names else f"{name}_{i}")
    return names


def upstream_nodes(values: Sequence[Value]) -> set[Node]:
    """The nodes ``values`` are computed from inside their graph (a region: its inputs
    have no producer), their producers included."""
    found: set[Node] = set()
    stack = list(values)
    while stack:
        node = stack.pop().producer
        if node is not None and node not in found:
            found.add(node)
            stack.extend(node.inputs)
    return found


def _shape(v: Value) -> tuple:
    return () if isinstance(v.type, ScalarType) else v.type.shape


def value_dtype(v: Value, scalars: Mapping[str, str] = SCALAR_DTYPES) -> str:
    """``v``'s IR dtype; a scalar's is that of its kind in ``scalars`` (by default float:
    f64, int: i64, bool: b8)."""
    if isinstance(v.type, ScalarType):
        return scalars[v.type.kind]
    return v.type.dtype


def named_args(opdef, node: Node) -> dict[str, Any]:
    """``node``'s arguments by schema name: attributes as they are, tensor inputs as
    ``InputRef``s in order."""
    if opdef.schema is None:
        return {"self": InputRef(0)} if node.inputs else {}
    named, next_input = {}, 0
    for arg in opdef.schema.arguments:
        if arg.name in node.attrs:
            named[arg.name] = node.attrs[arg.name]
        elif next_input < len(node.inputs):
            named[arg.name] = InputRef(next_input)
            next_input += 1
    return named


def promote_dtype(dtypes: list[str], attrs_: Mapping[str, Any]) -> str:
    """The compute dtype torch promotes IR ``dtypes`` (and a float ``other``) to."""
    result = DTYPES[dtypes[0]]
    for d in dtypes[1:]:
        result = torch.promote_types(result, DTYPES[d])
    other = attrs_.get("other")
    if isinstance(other, float) and not result.is_floating_point:
        result = torch.float32
    name = next(k for k, v in DTYPES.items() if v == result)
    return COMPUTE[name]


def reduced_dims(node: Node, rank: int) -> tuple[int, ...]:
    """The dims ``node`` reduces, normalised and sorted (no ``dim``: all of them).

    A 0-d tensor has no dims to reduce: torch accepts ``dim`` 0 or -1 for it (as if it had
    one dim of size 1) and reduces its one element, so the answer is ``()``."""
    dim = node.attrs.get("dim")
    if rank == 0:
        return ()
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(rank))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return tuple(sorted({d + rank if d < 0 else d for d in dims}))


def var_correction(node: Node) -> int | float:
    """The correction (``n - correction`` degrees of freedom) of a var/std reduction."""
    correction = node.attrs.get("correction")
    if correction is None:
        correction = 1 if node.attrs.get("unbiased", True) else 0
    return correction
