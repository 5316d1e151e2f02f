"""Fusion group -> one C function.

Two kernel kinds share one writer, both a parallel loop over *rows* whose body holds SIMD
loops (*phases*, see emitter.py):

- *pointwise*: the first output is walked in its memory order; a row is every dim but the
  innermost, and the innermost dim (split into chunks when long, so a single long row
  still spreads over threads) is the SIMD loop ``j``. Every value is computed at the
  coordinates of the walk: inputs broadcast, views are index math, nothing is copied.
- *reduction*: all reductions of the group reduce the same dims of the same shape P. A row
  is one combination of the kept dims; each reduction is a SIMD loop ``r`` over the reduced
  dims with an OpenMP reduction clause, values computed per row (mean, rstd) are row
  statements, and outputs of shape P are stored by a last loop (the epilogue).

Low-precision (f16/bf16) values are computed in f32 and rounded wherever eager rounds (an
op's f16/bf16 result, an explicit cast); reductions accumulate in f32.
"""

from __future__ import annotations

from typing import Any

from torchloom.api import InputRef, Node, TensorType, Value, indexing, schedule, stmt, writer

from torchloom_codegen_cpu import colsums, tables, tiles
from torchloom_codegen_cpu.columns import column_body, column_form
from torchloom_codegen_cpu.emitter import (Emitter, Expr, load_text, narrow_limit, par,
                                          store_statement, whole_vectors)
from torchloom_codegen_cpu.ops import (COMPUTE, CTYPE, EXPENSIVE, FLOATS, POINTWISE, REDUCTIONS,
                                    literal, round_to)
from torchloom_codegen_cpu.overrun import PARALLEL_FOR, chunked, row_offsets
from torchloom_codegen_cpu.reduction import (across_rows, check_row_stride, lower_reduction,
                                             prefetch_next_row)
from torchloom_codegen_cpu.render import Simd, element, render
from torchloom_codegen_cpu.tensors import Unsupported, memory_order, tensor_type

Coords = indexing.Coords
prod, same = indexing.prod, indexing.same

SCALAR_DTYPES = writer.SCALAR_DTYPES
#: below this many elements a kernel runs on one thread (a parallel region costs ~µs)
PARALLEL_MIN = 32768
#: the innermost dim of a pointwise walk is split into chunks of this many elements
CHUNK = 4096
#: rows up to this many elements may keep expensive values in a buffer on the stack
ROW_BUFFER = 16384


#: ops eager's CPU kernels run with a one-element second operand as an f32 scalar
SCALAR_DIVISORS = frozenset({"aten.mul.Tensor", "aten.div.Tensor", "aten.div.Tensor_mode",
                             "aten.true_divide.Tensor"})


#: op -> its Python-number arguments eager converts to a bf16/f16 tensor's type
ROUNDED_SCALARS = {
    **{f"aten.{op}.{overload}": ("other", "alpha") for op in ("add", "sub", "rsub")
       for overload in ("Tensor", "Scalar")},
    "aten.fmod.Scalar": ("other",), "aten.remainder.Scalar": ("other",),
    **{f"aten.{op}.Scalar": ("other",) for op in ("eq", "ne", "lt", "le", "gt", "ge")},
}


def _one_element(v: Value) -> bool:
    return isinstance(v.type, TensorType) and all(d == 1 for d in v.type.shape)


class KernelWriter(writer.ValueWalk):
    """Writes one group's C function. ``generate()`` -> (source, metadata)."""

    TARGET, POINTWISE, REDUCTIONS = "C", POINTWISE, REDUCTIONS
    tensor_type = staticmethod(tensor_type)

    def __init__(self, group: Node, registry: Any, outputs: list[tuple[str, Value]] | None = None,
                 reductions: list[Node] | None = None, names: dict[str, str] | None = None,
                 stored: dict[Value, str] | None = None,
                 columns: list[tuple[str, Node]] | None = None):
        """``outputs`` (C name, value) and ``reductions``: the part of the group this nest
        writes (default: all of it; see function.py for groups written as several nests);
        ``names``: each size symbol's C argument (symbolic sizes are runtime arguments);
        ``stored``: outputs earlier nests of the function wrote (value -> its C name),
        read back from there; ``columns``: column sums this row nest carries (C name of the
        output, sum node: colsums.py)."""
        self.group = group
        self.columns = columns or []
        self.stored = stored or {}
        self.region = group.region
        self.registry = registry
        self.values: dict[tuple[Value, Coords], tuple[Expr, int]] = {}
        self.reduced: dict[Value, tuple[Coords, Expr]] = {}
        self.known: dict = {}  # coordinates -> the linear index they came from
        self.ix = indexing.IndexMath(indexing.C, names)
        self._as_dims = indexing.IndexMath(indexing.SYMBOLS, names)
        self.em = Emitter(narrow_limit(self.region))
        self._check_region()
        if reductions is None:
            reductions = [n for n in self.region.nodes if n.op in REDUCTIONS]
        self.reductions = reductions
        if outputs is None:
            outputs = list(zip(output_names(self.region), self.region.outputs))
        self.out_names = [name for name, _ in outputs]
        self.outputs = [v for _, v in outputs]
        self.kind = "reduction" if self.reductions else "pointwise"
        self.outer = "x"  # the parallel loop's variable (columns.py walks blocks: "xb")
        #: the parallel loop's trip count as C text from the thread count's C text, where
        #: it depends on it (columns.py); None: ``rows`` iterations
        self.outer_count = None
        #: value -> the element of its row buffer at ``r`` (see _plan_buffers)
        self.buffers: dict[Value, stmt.Element] = {}
        self.loaded: set[Value] = set()  # region inputs (and stored outputs) it reads
        self.j_strides: list[int] = []  # each load's step per j (pointwise walks: tiles.py)
        self.tables: dict[str, str] = {}  # result tables its ops read: name -> definition

    # ---- analysis --------------------------------------------------------------------------
    def _check_region(self) -> None:
        devices = self.region_devices(self.region)
        if devices != {"cpu"}:
            raise Unsupported(f"values on {', '.join(sorted(devices))}: the cpu codegen "
                              f"compiles CPU groups only")

    # ---- values ----------------------------------------------------------------------------
    def value_at(self, v: Value, coords: Coords) -> Expr:
        key = (v, coords)
        hit = self.values.get(key)
        if hit is not None and (not hit[0].inner or hit[1] == self.em.phase_id):
            return hit[0]
        buffer = self.buffers.get(v) if coords == getattr(self, "full", None) else None
        if buffer is not None and hit is not None:  # computed by an earlier loop of the row
            e = self.em.emit(element(buffer), hit[0].dtype, v.name, inner=True)
        else:
            e = self._compute(v, coords)
            # a value the row loop does not change (its row holds one element, or it is
            # broadcast along the row) is computed once before the loop: no buffer then,
            # whose write in the loop would land after the stores hoisted out of it (the
            # buffer can be an output's row: out[0] = tanh(x) * 0.5 + ...; then out[0] = tanh(x))
            if buffer is not None and e.inner:
                self.em.statement(stmt.Store(buffer, e.text), True)
        self.values[key] = (e, self.em.phase_id)
        return e

    def _compute(self, v: Value, coords: Coords) -> Expr:
        name = self.stored.get(v)
        if name is None:
            return super()._compute(v, coords)
        self.loaded.add(v)  # (an output an earlier nest wrote: read from memory again)
        t = tensor_type(v)
        offset = self.ix.address(coords, t.actual_strides(), t.shape, self.known)
        return self.em.emit(load_text(name, offset, t.dtype), COMPUTE[t.dtype], v.name)

    def _load(self, v: Value, t: TensorType, coords: Coords) -> Expr:
        self.loaded.add(v)
        self.j_strides.append(tiles.j_stride(coords, t.actual_strides()))
        offset = self.ix.address(coords, t.actual_strides(), t.shape, self.known)
        return self.em.emit(load_text(f"in_{v.name}", offset, t.dtype), COMPUTE[t.dtype],
                            v.name)

    def _check_view(self, node: Node, v: Value, t: TensorType, src: Value) -> None:
        if self.kind == "reduction" and (0 in t.shape or 0 in tensor_type(src).shape):
            # its coordinates would all be 0: reads hoisted out of the empty loop
            raise Unsupported(f"{node.op} of an empty tensor (%{v.name}) in a reduction")

    def _literal(self, node: Node, value, compute: str) -> str:
        try:
            return literal(value, compute)
        except TypeError as exc:
            raise Unsupported(f"{node.op}: {exc}") from None

    def _render(self, node: Node, spec, named: dict[str, str], compute: str,
                ir_dtype: str, given: dict[str, Any]) -> str:
        # a scalar divisor (a one-element tensor or a Python number): eager's kernel
        # divides in f32 (no rounded quotient to trunc)
        scalar = self.keeps_operand(node, 1) or (
            node.op in SCALAR_DIVISORS and len(node.inputs) == 1)
        # softmax's exp(x - max(x)): every argument <= 0 (or NaN), the prelude's cheaper exp
        nonpositive = node.op == EXP and compute == "f32" and minus_max(node.inputs[0])
        template = spec.template(given, compute, "f32" if scalar else ir_dtype,
                                 exp="tl_exp_nonpos" if nonpositive else "tl_exp")
        if template is None:
            raise Unsupported(f"{node.op} on {compute} has no C template")
        try:
            text = template.format(**named)
        except KeyError as exc:  # an argument that is no number: a symbolic size, say
            raise Unsupported(f"{node.op}: argument {exc.args[0]} = "
                              f"{node.attrs.get(exc.args[0])!r} has no C value") from None
        if nonpositive:  # (computing this exp costs about what a table read does: no table)
            return text
        looked_up = self._tabulated(node, template, named, compute, ir_dtype, given)
        return text if looked_up is None else looked_up

    def scalar_operand(self, node: Node, name: str, value):
        """A Python number added to, subtracted from, compared with or taken the remainder
        by a bf16/f16 tensor is converted to the tensor's type first by eager's kernels
        (x + 1.0001 in bf16 adds 1.0); mul, div and the activations' parameters are not."""
        dtype = tensor_type(node.inputs[0]).dtype if node.inputs and isinstance(
            node.inputs[0].type, TensorType) else None
        if (dtype in ("bf16", "f16") and name in ROUNDED_SCALARS.get(node.op, ())
                and not isinstance(value, bool) and isinstance(value, (int, float))):
            return round_to(float(value), dtype)
        return value

    def keeps_operand(self, node: Node, k: int) -> bool:
        """Eager's CPU mul and div of a bf16/f16 tensor by a scalar (an operand broadcast
        everywhere: one element) compute in f32 with the scalar's own value, a 0-d f32 or
        int tensor unrounded (ATen's ``original_scalar_value``, BinaryOpsKernel.cpp)."""
        return (k == 1 and node.op in SCALAR_DIVISORS and len(node.inputs) > 1
                and _one_element(node.inputs[1]))

    def _tabulated(self, node: Node, template: str, named: dict[str, str], compute: str,
                   ir_dtype: str, given: dict[str, Any]) -> str | None:
        """The op read from a table of its results (tables.py) when its one tensor input
        and its result are bf16, else None."""
        tensors = [name for name, value in given.items() if isinstance(value, InputRef)]
        if (compute != "f32" or len(tensors) != 1 or len(node.inputs) != 1
                or not isinstance(node.inputs[0].type, TensorType)
                or tensor_type(node.inputs[0]).dtype != ir_dtype):
            return None
        found = tables.table(node.op, template.format(**{**named, tensors[0]: "x"}),
                             ir_dtype)
        if found is None:
            return None
        definition, function = found
        self.tables[function] = definition
        call = f"{function}({named[tensors[0]]})"
        self.em.exact[call] = ir_dtype  # the table holds results rounded to ir_dtype
        return call

    def _plan_buffers(self) -> None:
        """Expensive values (exp, tanh, ...) of a row that several loops read (softmax's
        exp feeds the sum and the epilogue) are kept in a row buffer by the first loop and
        read back by the later ones, instead of being recomputed. The buffer is the row of
        the output the last loop stores, where there is one such output of the value's C
        type (an f32 softmax: exp is written where its quotient goes, as eager does; the
        output is a fresh buffer, never an input's), else an array on the thread's stack.
        A row longer than ``ROW_BUFFER`` or of symbolic length (it may not fit the stack)
        has only the output's row. ``buffers`` maps each value to its element at ``r``."""
        stack = isinstance(self.rnumel, int) and self.rnumel <= ROW_BUFFER
        host = self._buffer_host()
        if not stack and host is None:
            return
        for node in self.region.nodes:
            if node.op not in EXPENSIVE or len(node.outputs) != 1:
                continue
            (v,) = node.outputs
            t = tensor_type(v)
            if tuple(t.shape) == self.shape and len(v.users()) + (
                    v in self.outputs) >= 2:
                ctype = CTYPE[COMPUTE[t.dtype]]
                if host is not None and host[0] == ctype and v not in self.outputs:
                    self.buffers[v], host = host[1], None
                    continue
                if not stack:
                    continue
                name = f"buf_{v.name}"
                self.em.statement(stmt.Raw(f"{ctype} {name}[{whole_vectors(self.rnumel)}];"),
                                  False)
                self.buffers[v] = stmt.Element(name, "r")

    def _buffer_host(self) -> tuple[str, stmt.Element] | None:
        """(C type, element at ``r``) of the one output the last loop of a row stores,
        if it has the reduced shape, no zero stride and a type C computes in."""
        full = [(name, v) for name, v in zip(self.out_names, self.outputs)
                if tuple(tensor_type(v).shape) == self.shape]
        if len(full) != 1 or sum(self.place_output(v)[0] for v in self.outputs) != 1:
            return None
        ((name, v),) = full
        t = tensor_type(v)
        strides = t.actual_strides()
        if t.dtype not in ("f32", "f64") or strides is not None and any(
                s == 0 and d != 1 for s, d in zip(strides, t.shape)):
            return None
        offset = self.ix.address(self.full, strides, t.shape, self.known)
        return CTYPE[COMPUTE[t.dtype]], stmt.Element(name, offset)

    def store(self, name: str, v: Value, coords: Coords) -> None:
        t = tensor_type(v)
        if 0 in t.shape:
            return  # an empty output: nothing to write
        e = self.value_at(v, coords)
        offset = self.ix.address(coords, t.actual_strides(), t.shape, self.known)
        store = store_statement(name, offset, e, t.dtype, self.em.unrounded.get(e.text),
                                self.em.exact.get(e.text))
        self.em.statement(store, self.em.reads_inner(store))

    def row_coords(self, index: str, shape) -> list[str]:
        """Emit ``const int64_t x0 = x / 8 % 4;``-style row coordinates; their names."""
        names = []
        for k, c in enumerate(self.ix.delinear(index, shape)):
            if c == "0" or c == index:
                names.append(c)
                continue
            name = f"x{k}"
            self.em.statement(stmt.Declare("int64_t", name, c), False)
            names.append(name)
        self.known[(tuple(c for c, d in zip(names, shape) if d != 1),
                    tuple(d for d in shape if d != 1))] = index
        return names

    # ---- writing ---------------------------------------------------------------------------
    def body(self) -> list:
        """The statements of one row (``x``), and the loop header around it."""
        return self._pointwise_body() if self.kind == "pointwise" else self._reduction_body()

    def _pointwise_body(self) -> list:
        outs = [tensor_type(v) for v in self.outputs]
        first = outs[0]
        self.numel = prod(first.shape)
        for v, t in zip(self.outputs, outs):
            if not same(prod(t.shape), self.numel):
                raise Unsupported(f"pointwise outputs with different element counts "
                                  f"{list(first.shape)} and {list(t.shape)}")
        order = memory_order(first) if first.shape else ()
        walk = [first.shape[d] for d in order] or [1]
        inner, size = walk[-1], self.ix.size
        if isinstance(inner, int):
            self.chunk = inner if inner <= 2 * CHUNK else CHUNK
            self.chunks = -(-inner // self.chunk) if inner else 0
            chunked = self.chunks > 1
        else:  # chunks of CHUNK (one for a short row), counted at run time
            self.chunk, self.chunks, chunked = CHUNK, f"CeilDiv({inner}, {CHUNK})", True
        self.rows = prod([prod(walk[:-1]), self.chunks])
        em = self.em
        if chunked:
            chunks, end = par(size(self.chunks)), par(size(inner))
            em.statement(stmt.Declare("int64_t", "row", f"x / {chunks}"), False)
            em.statement(stmt.Declare("int64_t", "j0", f"x % {chunks} * {self.chunk}"), False)
            em.statement(stmt.Declare("int64_t", "j1", f"j0 + {self.chunk} < {end} ? j0 + "
                                      f"{self.chunk} : {end}"), False)
            row, bounds = "row", ("j0", "j1")
        else:
            row, bounds = "x", ("0", str(size(inner)))
        em.inner_names.add("j")
        walk_coords = [*self.row_coords(row, walk[:-1]), "j" if inner != 1 else "0"]
        self.known[(tuple(c for c, d in zip(walk_coords, walk) if d != 1),
                    tuple(d for d in walk if d != 1))] = (
            "j" if prod(walk[:-1]) == 1 else f"{par(row)} * {par(size(inner))} + j")
        logical = [""] * len(order)
        for d, c in zip(order, walk_coords):
            logical[d] = c
        em.begin_phase()
        for name, v, t in zip(self.out_names, self.outputs, outs):
            coords = tuple(logical) if tuple(t.shape) == tuple(first.shape) else \
                self.ix.reshape(tuple(logical), first.shape, t.shape, self.known)
            self.store(name, v, coords)
        em.end_phase(Simd(), "j", *bounds, [])
        return (None if chunked else tiles.tiled(self, walk, em.lines)) or em.lines

    def _reduction_body(self) -> list:
        nest = schedule.ReductionNest.of(self.reductions, tensor_type)
        self.shape, self.rdims = nest.shape, nest.rdims
        self.kept_shape, self.red_shape = nest.kept_shape, nest.red_shape
        self.rows, self.rnumel, self.numel = nest.rows, nest.rnumel, nest.numel
        kept = self.kept = nest.kept
        if column_form(self):
            return column_body(self)
        check_row_stride(self)
        em = self.em
        xs = self.row_coords("x", self.kept_shape)
        em.inner_names.add("r")
        self.r_header, rs = [], []
        for k, c in enumerate(self.ix.delinear("r", self.red_shape)):
            if c == "0" or c == "r":
                rs.append(c)
                continue
            em.inner_names.add(f"r{k}")
            self.r_header.append(stmt.Declare("int64_t", f"r{k}", c))
            rs.append(f"r{k}")
        self.known[(tuple(c for c, d in zip(rs, self.red_shape) if d != 1),
                    tuple(d for d in self.red_shape if d != 1))] = "r"
        #: the row length: an int, or C text (symbolic)
        self.rbound = self.rnumel if isinstance(self.rnumel, int) else self.ix.size(
            self.rnumel)
        full = [""] * len(self.shape)
        for d, c in zip(kept, xs):
            full[d] = c
        for d, c in zip(self.rdims, rs):
            full[d] = c
        self.full = tuple(full)
        self.em.overrun = row_offsets(self)
        self.row_keepdim = tuple("0" if d in self.rdims else self.full[d]
                                 for d in range(len(self.shape)))
        self.row = tuple(xs)
        self._plan_buffers()
        for node in self.reductions:
            lower_reduction(self, node)
        full_outputs = []
        for name, v in zip(self.out_names, self.outputs):
            in_loop, coords = self.place_output(v)
            if in_loop:
                full_outputs.append((name, v, coords))
            else:
                self.store(name, v, coords)
        if full_outputs or self.columns:
            prefetch_next_row(self)
            em.begin_phase()
            for name, v, coords in full_outputs:
                self.store(name, v, coords)
            colsums.accumulate(self)
            em.end_row_phase(Simd(), self.rbound, self.r_header)
        return em.lines if full_outputs or self.columns else across_rows(self, em.lines)

    def nest(self) -> list[str]:
        """This nest's parallel loop over rows, its body inside."""
        lines = render(stmt.drop_unused(self.body()))
        rows, numel = par(self.ix.size(self.rows)), par(self.ix.size(self.numel))
        # threads when there are rows to share and work to pay for them: decided here for
        # static sizes, at run time for symbolic ones
        conditions = [f"{rows} > 1"] if not isinstance(self.rows, int) else []
        if not isinstance(self.numel, int):
            conditions.append(f"{numel} >= {PARALLEL_MIN}")
        self.parallel = (not isinstance(self.rows, int) or self.rows > 1) and (
            not isinstance(self.numel, int) or self.numel >= PARALLEL_MIN)
        pragma = PARALLEL_FOR
        head, bound = [], rows
        if self.outer_count is not None:  # computed once, before the loop
            bound = f"n_{self.outer}"
            threads = "nthreads" if self.parallel else "1"
            head = [f"const int64_t {bound} = {self.outer_count(threads)};"]
        loop = [f"for (int64_t {self.outer} = 0; {self.outer} < {bound}; {self.outer}++) {{",
                *("  " + line for line in lines), "}"]
        threads, one = [pragma, *loop], loop
        if self.columns:  # each thread's partial column sums (colsums.py)
            return colsums.nest(self, head, lines, bound)
        if self.em.overran:  # each thread's last row known (overrun.py)
            threads, one = (chunked(bound, lines, p) for p in (True, False))
        if not conditions:
            return [*head, *(threads if self.parallel else one)]
        # a branch, not an OpenMP if clause: entering a parallel region that the clause
        # then runs on one thread costs ~0.5 us per call, much of a small kernel's time
        return [*head, f"if ({' && '.join(conditions)}) {{", *("  " + line for line in threads),
                "} else {", *("  " + line for line in one), "}"]

    def dims(self, dim):
        """``dim`` written over the size arguments (``S_0*16``), for the launcher."""
        return dim if isinstance(dim, int) else self._as_dims.size(dim)

    def count(self, dim, dtype: str) -> str:
        """A size as a C constant of compute dtype ``dtype`` (row lengths in means)."""
        if isinstance(dim, int):
            return literal(dim, dtype)  # an int: integer sums (prod, sum) also ask for it
        return f"(({CTYPE[dtype]}){par(self.ix.size(dim))})"


EXP = "aten.exp.default"
#: the reductions whose keepdim result is >= every element it reduced (or NaN)
_MAXIMA = {"aten.amax.default": 0, "aten.max.dim": 0}


def minus_max(v: Value) -> bool:
    """Whether ``v`` is ``a - max(a)`` over some dims with keepdim (softmax's shift), so
    every element is <= 0 or NaN: ``sub.Tensor(a, m)`` with alpha 1, ``m`` the values of
    ``amax(a, dims, keepdim=True)`` or ``max.dim(a, dim, keepdim=True)`` of the same
    ``a``, broadcast against it as keepdim leaves it (a transposed or squeezed maximum
    would pair elements with another row's maximum). Floats only: an integer difference
    wraps (int8: -128 - 127 is 1)."""
    node = v.producer
    if node is None or node.op != "aten.sub.Tensor" or node.attrs.get("alpha", 1) != 1 or \
            len(node.inputs) != 2:  # (a scalar other is an attribute)
        return False
    a, m = node.inputs
    top = m.producer
    if top is None or _MAXIMA.get(top.op) != m.index or not top.attrs.get("keepdim", False):
        return False
    return top.inputs[0] is a and tensor_type(v).shape == tensor_type(a).shape and \
        tensor_type(v).dtype in FLOATS


def output_names(region) -> list[str]:
    """The C parameter name of each region output (``out_<value>``, unique)."""
    names: list[str] = []
    for i, v in enumerate(region.outputs):
        name = f"out_{v.name}"
        names.append(name if name not in names else f"{name}_{i}")
    return names
