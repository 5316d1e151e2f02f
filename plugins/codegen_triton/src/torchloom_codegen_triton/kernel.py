"""Fusion group -> Triton kernel source.

Two kernel kinds share one writer:

- *pointwise*: a 1-D grid over the elements of the outputs (all of one element count);
  each output is walked in its own memory order (coalesced stores, and loads of inputs
  laid out alike), every value computed at coordinates delinearised from ``xindex``. An
  input laid out across that walk (transposed) makes it a grid of 2-D tiles (tiles.py).
- *reduction*: all reductions of the group reduce the same dims of the same shape P; a
  program handles ``XBLOCK`` rows (the kept dims) x the reduced dims (``rindex``). Rows up
  to ``max_persistent`` elements are held whole in registers (persistent form); longer
  rows loop over ``RBLOCK`` chunks, one pass per level of dependent reductions plus one
  for the epilogue (looped.py: Welford, online softmax). Column reductions (kept dims
  innermost) loop over tiles of many rows x a short chunk. Every output has the shape P
  (stored per element) or a row shape (stored per row). Reductions with a small output
  are split into chunks (split.py), and row reductions may share the kernel with column
  reductions of the same P (rows_and_columns.py); both finish in a second, small kernel.

Sizes may be symbolic (``f32[s0, 64]``): the kernel then takes the symbols as scalar
arguments ``ks0, ks1...`` (sizes.py) and every size in its text is computed from them
(core ``indexing.IndexMath``); variants.py writes one function per launch variant.

Low-precision (f16/bf16) values are computed in f32 and rounded wherever eager rounds (an
op's f16/bf16 result, an explicit cast); reductions accumulate in f32.

Values are computed lazily at coordinates (``value_at``): a view maps coordinates to its
input's coordinates, a pointwise op computes its inputs at broadcast coordinates, a region
input is a load at ``sum(coord * stride)``. Statements (``torchloom.api.stmt``) are
value-numbered by their expression's text and printed by render.py.
"""

from __future__ import annotations

from typing import Any

from torchloom.api import (Node, TensorType, Value, expr, indexing, print_graph, row_form,
                           row_forms, schedule, stmt, writer)

from torchloom_codegen_triton import lanes
from torchloom_codegen_triton.emitter import Emitter, Expr
from torchloom_codegen_triton.indexing import Coords, Unsupported
from torchloom_codegen_triton.ops import (COMPUTE, POINTWISE, REDUCTIONS, SPELLING, STORAGE,
                                          VIEWS, module_prelude)
from torchloom_codegen_triton.looped import lower_looped
from torchloom_codegen_triton.metadata import kernel_metadata
from torchloom_codegen_triton.plan import reduction_configs, representative
from torchloom_codegen_triton.reduction import lower_reduction
from torchloom_codegen_triton.render import function as jit_function
from torchloom_codegen_triton.rows_and_columns import ColumnPartials
from torchloom_codegen_triton.sizes import atomize, bind_symbols
from torchloom_codegen_triton.split import SplitReduction, plan_split
from torchloom_codegen_triton.tensors import memory_order, tensor_type
from torchloom_codegen_triton.tiles import plan_tiles, tile_coords

ZERO, is_zero = indexing.ZERO, indexing.is_zero
_XINDEX = expr.Name("xindex")


def _every_lane(offset: expr.Code, index: expr.Name) -> expr.Code:
    """``offset + 0 * index``: the offset as a block of the lanes' shape along ``index``."""
    return expr.Op("{0} + 0 * {1}", expr.SUM, (offset, index))


def _below(index: expr.Code, size: expr.Code) -> expr.Code:
    """``index < size``: the lanes inside a dim (a mask)."""
    return expr.Op("{0} < {1}", expr.LOWEST, (index, size))


def _mask(rdep: bool) -> expr.Code:
    """The lanes a load or store touches: the row's, and the reduction's when ``rdep``."""
    xmask = expr.Name("xmask")
    return expr.Op("{0} & {1}", expr.LOWEST, (xmask, expr.Name("rmask"))) if rdep else xmask

class KernelWriter(writer.ValueWalk, schedule.PlannedNest, row_form.RowForm):
    """Writes one group's kernel. ``generate()`` -> (source, metadata)."""

    POINTWISE, REDUCTIONS, spelling = POINTWISE, REDUCTIONS, SPELLING
    #: a float argument is an f32 in Triton
    SCALAR_DTYPES = {"float": "f32", "int": "i64", "bool": "b8"}
    tensor_type = staticmethod(tensor_type)

    def __init__(self, group: Node, registry: Any, max_persistent: int = 4096,
                 probe: bool = False, form: str | None = None, wide: bool | None = None,
                 finish: bool = False, out_names: list[str] | None = None):
        """``probe``: only to compute values at symbolic coordinates (tiles.py); ``finish``:
        the finishing kernel of a split reduction (split.py), a probe whose statements are
        not looped, storing to ``out_names`` (default: ``out_<name>`` per output). Groups
        with symbolic sizes are written once per launch variant (variants.py): ``form``
        (``"persistent"`` or ``"looped"``) fixes a reduction's form whatever its row length,
        ``wide`` its index width (else both follow from the concrete sizes)."""
        self.group = group
        self.form, self.wide = form, wide
        self.probe = probe or finish
        #: the group's region; a copy naming size atoms when sizes are expressions
        #: of symbols no input carries alone (sizes.atomize)
        self.region = atomize(group.region)
        self.registry = registry
        #: the values phases closed since computed (writer.ValueWalk.known_value)
        self.earlier: dict[tuple[Value, Coords], Expr] = {}
        self.reduced: dict[Value, tuple[Coords, Expr]] = {}
        self._coord_count: dict[str, int] = {}
        self.known: dict = {}  # coordinates -> the linear index they came from
        #: region input -> the passes that load it (0: once per program, outside loops)
        self.loads: dict[Value, set[int]] = {}
        #: the column reductions of a row + column kernel (rows_and_columns.py), if any
        self.col: ColumnPartials | None = None
        #: the plan of a split reduction (split.py), if any
        self.split: SplitReduction | None = None
        #: (input, its coordinates) of every load emitted; the tiled form's (d0, d1)
        self.load_coords: list[tuple[Value, Coords]] = []
        self.tiles: tuple[int, int] | None = None
        #: the plan (_plan_pointwise, _plan_reduction): the iteration space, the nest
        #: (schedule.ReductionNest, read through schedule.PlannedNest: a reduction's shape
        #: P, reduced and kept dims, row length), its rows and the block candidates
        self.reduction_nest = schedule.ReductionNest((), ())
        self.numel: Any = 0
        self.looped = False
        self.rows: Any = 0
        self.max_persistent = self.persistent_limit = max_persistent
        self.configs: list[dict[str, int]] = []
        #: a reduction's coordinates, written by body(): of P's elements (``full``), of a
        #: row (``row``; ``row_keepdim`` with the reduced dims 0) and the statements that
        #: start each loop over a row (``r_header``)
        self.full: Coords = ()
        self.row: Coords = ()
        self.row_keepdim: Coords = ()
        self.r_header: tuple[stmt.Statement, ...] = ()
        #: this program's first block of rows (``tl.program_id(0)``, in a row + column
        #: kernel offset by its walk ``it``), set by body()
        self.block: expr.Code | None = None
        #: the pointer argument of each output
        self.out_names = out_names if out_names is not None else writer.output_names(self.region)
        #: written by function(): the outputs the finishing kernel stores, the module
        #: helpers this function and its finishing kernel call
        self.finish_outputs: list[int] = []
        self.helpers: set[str] = set()
        #: the one device of the group's values
        self.device = self._device()
        #: symbol -> (input, dim) it is read from; the kernel takes it as argument ``ks<k>``
        self.symbols = bind_symbols(self.region)
        self.symbolic = bool(self.symbols)
        self.ix = indexing.IndexMath(indexing.TRITON, {
            s: f"ks{k}" for k, s in enumerate(self.symbols)})
        reductions = [n for n in self.region.nodes if n.op in REDUCTIONS]
        self.kind = "reduction" if reductions else "pointwise"
        self.reductions = reductions
        if reductions:
            self._plan_reduction(reductions, max_persistent)
        else:
            self._plan_pointwise()
        bounds = None if self.split is None else (
            expr.Name("rstart"), lanes.plus("rstart", self.split.chunk))
        self.em = Emitter(looped=self.looped and not finish,
                          hardware_bf16=self.device.startswith("cuda"), loop_bounds=bounds)
        if self.kind == "pointwise" and not self.probe:
            self.tiles = plan_tiles(self)

    # ---- analysis --------------------------------------------------------------------------
    def _device(self) -> str:
        devices = self.region_devices(self.region)
        if len(devices) > 1:
            raise Unsupported(f"values on several devices {sorted(devices)}")
        return devices.pop() if devices else "cpu"

    @property
    def columns(self) -> bool:
        """Whether the nest's rows are strided in memory (a column reduction)."""
        return self.reduction_nest.columns

    def _plan_pointwise(self) -> None:
        shape = tuple(tensor_type(self.region.outputs[0]).shape)
        self.reduction_nest = schedule.ReductionNest(shape, ())
        # (the reason names the shapes as written, not atomized)
        self.numel = schedule.elementwise_numel(
            [tensor_type(v).shape for v in self.region.outputs],
            [v.type.shape for v in self.group.region.outputs])

    def _plan_reduction(self, reductions: list[Node], max_persistent: int) -> None:
        plan = schedule.RowsAndColumns.of(reductions, lambda v: tensor_type(v).shape)
        columns = [] if plan is None else list(plan.columns)
        reductions = reductions if plan is None else list(plan.rows)
        self.reductions = reductions
        nest = self.reduction_nest = schedule.ReductionNest.of(reductions, tensor_type)
        self.rows, self.numel = nest.rows, nest.numel
        # rows that are strided in memory (the kept dims are innermost: a column sum) are
        # read as [many rows x a short chunk] tiles, which needs the looped form
        limit = min(max_persistent, 64) if self.columns else max_persistent
        #: the longest row (a power of two) the persistent form holds
        self.persistent_limit = limit
        rnumel = representative(self.rnumel, limit)
        self.looped = self.form in ("looped", "split") if self.form else \
            row_forms.looped(rnumel, limit)
        if columns and not isinstance(self.rnumel, int):
            raise Unsupported(f"row and column reductions of the same data in one kernel "
                              f"need a static row length (it is {self.rnumel})")
        self.col = ColumnPartials(self, columns) if columns else None
        if self.col is not None and (self.looped or self.columns):
            raise Unsupported(f"row and column reductions of rows of {self.rnumel} elements "
                              f"(one kernel holds at most {max_persistent})")
        self.configs = reduction_configs(representative(self.rows, 2 ** 16), rnumel,
                                         self.looped, max_persistent, self.columns)
        self.split = None if self.probe else plan_split(self, self.configs)

    # ---- values ----------------------------------------------------------------------------
    # (value_at: ValueWalk's; the persistent form opens no phase: every value stays known)
    def record(self, outputs: dict[Value, tuple[Coords, Expr]]) -> None:
        """Reduction results: output -> (the coordinates of its row, its value)."""
        self.reduced.update(outputs)

    def load_coordinates(self, coords: Coords) -> list[tuple[Value, Coords]]:
        """(input, its coordinates) of every load of the outputs computed at ``coords``
        (names the probe gives the dims, see tiles.py)."""
        self.em.mark_x(*map(str, coords))
        for v in self.region.outputs:
            self.value_at(v, coords)
        return list(self.load_coords)

    def _load(self, v: Value, t: TensorType, coords: Coords) -> Expr:
        offset = self.ix.address(coords, t.actual_strides(), t.shape, self.known)
        self.load_coords.append((v, coords))
        rdep = self.em.depends_on_r(offset)
        pointer = expr.Name(f"in_{v.name}")
        if self.tiles is not None and self.em.depends_on_x(offset):
            offset = _every_lane(offset, _XINDEX)  # every pointer block of the tile's shape
        if 0 in t.shape:  # an empty tensor: no element to read (its pointer may be null)
            text = expr.Op("tl.load({0} + {1} + 0 * {2}, 0 * {2} != 0, other=0)",
                           expr.POSTFIX, (pointer, offset, _XINDEX))
        elif not rdep and not self.em.depends_on_x(offset):  # one element for every lane
            text = expr.Op("tl.load({0} + {1} + 0 * {2})", expr.POSTFIX,
                           (pointer, offset, _XINDEX))
        else:
            text = expr.Op("tl.load({0} + ({1}), {2}, other=0)", expr.POSTFIX,
                           (pointer, offset, _mask(rdep)))
        loaded = self.em.emit(text, t.dtype, v.name, rdep)
        self.loads.setdefault(v, set()).add(self.em.phase_id if rdep and self.looped else 0)
        return self.em.convert(loaded, COMPUTE[t.dtype])

    def store(self, i: int, v: Value, coords: Coords) -> None:
        """Store output ``i`` (``v``) at ``coords``."""
        t = tensor_type(v)
        e = self.value_at(v, coords)
        offset = self.ix.address(coords, t.actual_strides(), t.shape, self.known)
        if not self.em.depends_on_x(offset) or self.tiles is not None:
            offset = _every_lane(offset, _XINDEX)  # a block of pointers, even for one element
        if e.inner and not self.em.depends_on_r(offset):
            offset = _every_lane(offset, expr.Name("rindex"))
        rdep = self.em.depends_on_r(offset)
        mask = _mask(rdep)
        source = self.em.bf16_exact.get(e.text)
        if t.dtype == "bf16" and self.em.hardware_bf16 and source is not None:
            e = Expr(source, "f32", e.inner)  # the store's conversion is the one rounding
        elif t.dtype == "bf16" and source is None and not self.em.hardware_bf16:
            e = self.em.cast(e, "bf16")  # round exactly (the interpreter's cast truncates)
        value = e.code if e.dtype == t.dtype else \
            expr.Op(f"{{0}}.to({STORAGE[t.dtype]})", expr.POSTFIX, (expr.paren(e.code),))
        target = stmt.Element(self.out_names[i], expr.Op("({0})", expr.ATOM, (offset,)))
        self.em.statement(stmt.Store(target, value, mask), rdep and self.looped)

    # ---- writing ---------------------------------------------------------------------------
    def coords(self, prefix: str, index: str, shape, rdep: bool) -> list[expr.Code]:
        """Emit ``x0 = xindex // 8 % 4``-style coordinates; returns them (names, 0)."""
        names: list[expr.Code] = []
        for c in self.ix.delinear(index, shape):
            if is_zero(c) or c == expr.Name(index):
                names.append(c)
                continue
            count = self._coord_count.get(prefix, 0)
            self._coord_count[prefix] = count + 1
            name = f"{prefix}{count}"
            self.em.statement(stmt.Assign(name, c), rdep and self.looped)
            if rdep:
                self.em.mark_r(name)
            else:
                self.em.mark_x(name)
            names.append(expr.Name(name))
        self.ix.remember(self.known, names, shape, index)
        return names

    def body(self) -> list[stmt.Statement]:
        em = self.em
        wide = self.wide if self.symbolic else self.numel >= 2 ** 31 or any(
            _max_offset(tensor_type(v)) >= 2 ** 31 for v in [*self.region.inputs,
                                                              *self.region.outputs]
            if isinstance(v.type, TensorType))
        pid = lanes.program(0, wide)
        for k in range(len(self.symbols) if wide else 0):  # size math in 64 bits too
            em.statement(stmt.Assign(f"ks{k}", lanes.to_int64(f"ks{k}")), False)
        if self.tiles is not None:
            coords = tile_coords(self, *self.tiles)
            for i, v in enumerate(self.region.outputs):
                self.store(i, v, coords)
            return em.lines
        if self.kind == "pointwise":
            em.statement(stmt.Assign("xindex", lanes.block_lanes(pid, "XBLOCK")), False)
            em.statement(stmt.Assign("xmask", _below(_XINDEX, self.ix.size_code(self.numel))),
                         False)
            walks: dict[tuple, Coords] = {}
            for i, v in enumerate(self.region.outputs):
                # each output is walked in its own memory order, so that its stores (and
                # the loads of inputs laid out alike) are coalesced
                t = tensor_type(v)
                order = memory_order(t)
                key = (tuple(t.shape), order)
                if key not in walks:
                    physical = self.coords("x", "xindex", [t.shape[d] for d in order], False)
                    logical: list[expr.Code] = [ZERO] * len(order)
                    for d, c in zip(order, physical):
                        logical[d] = c
                    walks[key] = tuple(logical)
                self.store(i, v, walks[key])
            return em.lines
        self.block = pid if self.col is None else \
            lanes.plus(pid, lanes.times("it", self.col.programs))
        if self.split is not None:  # this program's chunk; _finish combines the chunks
            self.begin_reductions(*self.row_coordinates(self.reduction_nest))
            em.statement(stmt.Assign("rstart", lanes.times(lanes.program(1), self.split.chunk)),
                         False)
            self.split.body()
            return em.lines
        # (a row + column kernel's column outputs: stored by the finishing kernel)
        self.row_form(self.reduction_nest, [
            (i, v) for i, v in enumerate(self.region.outputs)
            if self.col is None or not self.col.is_column_output(v)])
        if self.col is not None:  # every program walks its row blocks, summing columns
            init, update, store = self.col.accumulate()
            n = self.col.programs
            blocks = lanes.blocks(self.ix.size_code(self.rows), lanes.times("XBLOCK", n))
            return [*init, stmt.Loop("it", "0", blocks, tuple(em.lines + update)), *store]
        return em.lines

    # what RowForm asks of a writer (row_form.py): blocks of rows, the row in lanes
    def row_coords(self, index: str, shape) -> list[expr.Code]:
        """This program's block of rows (``xindex``, ``xmask``) and their coordinates."""
        em = self.em
        em.statement(stmt.Assign("xindex", lanes.column(lanes.block_lanes(self.block,
                                                                          "XBLOCK"))), False)
        em.statement(stmt.Assign("xmask", _below(_XINDEX, self.ix.size_code(self.rows))), False)
        return self.coords(index, "xindex", shape, False)

    def inner_coords(self, index: str, shape) -> tuple[list, list[expr.Code]]:
        """A row's lanes (``rindex``, ``rmask``) and their coordinates: (the statements
        that start each loop over the row, looped; else none, written once), names."""
        em = self.em
        lane = lanes.row(lanes.arange("RBLOCK"))
        rheader = [stmt.Assign("rindex", lanes.plus("roff", lane) if self.looped else lane),
                   stmt.Assign("rmask", _below(expr.Name("rindex"),
                                               self.ix.size_code(self.rnumel)))]
        em.mark_r("rindex", "rmask", "roff")
        rs: list[expr.Code] = []
        if self.looped:
            inner = em.capture(lambda: rs.extend(self.coords(index, "rindex", shape, True)))
            return [*rheader, *inner], rs
        for s in rheader:
            em.statement(s, False)
        return [], self.coords(index, "rindex", shape, True)

    def begin_reductions(self, xs: list, header: list, rs: list) -> None:
        if header:
            self.r_header = tuple(header)

    def reduce_row(self) -> None:
        if self.looped:  # one pass per level of reductions (looped.py)
            lower_looped(self, self.reductions)
            return
        for node in self.reductions:
            lower_reduction(self, node)

    def carries_columns(self) -> bool:
        return False  # (a row + column kernel's partials: ColumnPartials, around the rows)

    def begin_row_loop(self) -> None:
        self.em.begin_phase(self.ix.size(self.rnumel), self.r_header)

    def carry(self) -> None:
        pass

    def end_row_loop(self) -> None:
        self.em.end_phase()

    def finish_rows(self) -> None:
        """The rows of a split reduction's finishing kernel (``FBLOCK`` per program):
        ``row`` and ``row_keepdim``."""
        em = self.em
        em.statement(stmt.Assign("xindex", lanes.column(lanes.block_lanes(lanes.program(0),
                                                                          "FBLOCK"))), False)
        em.statement(stmt.Assign("xmask", _below(_XINDEX, self.ix.size_code(self.rows))), False)
        self.row = tuple(self.coords("x", "xindex", self.kept_shape, False))
        keep = iter(self.row)
        self.row_keepdim = tuple(ZERO if d in self.rdims else next(keep)
                                 for d in range(len(self.shape)))

    def generate(self) -> tuple[str, dict[str, Any]]:
        kernel, form, function, finish = self.function()
        source = "\n".join([*self.header(form), *module_prelude(self.helpers), function]) + \
            "\n" + finish
        return source, self.metadata(kernel, form)

    def header(self, form: str) -> list[str]:
        lines = ["# torchloom triton kernel for this group:"]
        lines += ["#   " + line for line in print_graph(self.group.region).splitlines()]
        lines.append(f"# kind: {form}")
        return lines

    def function(self, suffix: str = "") -> tuple[str, str, str, str]:
        """(kernel name, form, the ``@triton.jit`` function, its finishing kernel or "")."""
        names = self.out_names
        statements = self.body()
        ops = [n.op.split(".")[1] for n in self.region.nodes
               if n.op not in VIEWS]
        kernel = "_".join(["fused", *dict.fromkeys(ops)])[:60].rstrip("_") or "fused_copy"
        kernel += suffix
        params = [f"in_{v.name}" for v in self.region.inputs] + names
        params += [f"ks{k}" for k in range(len(self.symbols))]  # symbolic sizes
        params += ["kprog"] if self.col is not None and self.symbolic else []
        params += ["kchunk", "ksplits"] if self.split is not None and self.symbolic else []
        finish, finish_helpers = "", ()
        two_stage = self.col if self.col is not None else self.split
        if two_stage is not None:
            params += [f"scratch{k}" for k in range(len(two_stage.scratch))]
            finish, self.finish_outputs, finish_helpers = two_stage.finish_source(names)
        params += ["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"]
                                              if self.kind == "reduction" else [])
        params += ["YBLOCK: tl.constexpr"] if self.tiles is not None else []
        form = "pointwise" if self.kind == "pointwise" else (
            "looped reduction" if self.looped else "persistent reduction")
        function = jit_function(kernel, params, statements)
        #: the module helpers this function and its finishing kernel call
        self.helpers = self.em.helpers | set(finish_helpers)
        return kernel, form, function, finish

    def metadata(self, kernel: str, form: str) -> dict[str, Any]:
        return kernel_metadata(self, kernel, form)


def _max_offset(t: TensorType) -> int:
    return sum((d - 1) * abs(s) for d, s in zip(t.shape, t.actual_strides()) if d > 0) + 1
