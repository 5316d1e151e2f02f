"""Lowering for renderers: a fusion group and its :class:`~torchloom.codegen.contract.Schedule`
become statements (:mod:`torchloom.codegen.stmt`) whose expressions the
:class:`~torchloom.codegen.contract.Renderer` spells; :class:`RendererCodegen` is the codegen
a renderer makes (see docs/writing-a-codegen.md).

The statements are scalar loops a target may render as they are (``scalar_c``) or
transform first, a loop nest per nest of the core's nest plan
(:mod:`torchloom.codegen.nests`, the plan the cpu codegen writes too), one after the
other: a later nest reads what an earlier one stored (an output, or a reduction's results
in a scratch array of one value per row, which the launch spec names and the launcher
allocates). A pointwise nest is the schedule's walk
(:class:`~torchloom.codegen.walks.Walk`) in the loops every target writes
(:mod:`torchloom.codegen.walk_nest`, lowered by :mod:`.lower_walks`): a loop ``x`` over the
rows of its first output in memory order and in it a loop ``j`` over a row (values not
read at ``j`` computed once per row, before it; rows an input reads across in tiles,
``tiles.tile_rows``; a flat walk one row of every element). A reduction nest in the column form
(:mod:`torchloom.codegen.columns`) walks its columns (:mod:`.lower_columns`); any other
is a loop ``x`` over the rows of its nest (each the row every target writes,
:mod:`torchloom.codegen.row_form`) holding, per level of reductions (none reading
another's result: ``schedule.levels``), their accumulators (``Var``, of
``reductions.accumulator``'s dtype: double for a variance, a long sum) and one loop ``r``
over the row folding each reduction's input into its own (``var``: its mean in that
loop, its squares in a second), the reductions' results (``Declare``), its outputs of a
row's shape stored after them and those of the nest's shape stored by a last loop
``r``; a value of the row read inside a loop over it is computed once, before that loop.
For ``softmax`` over ``f32[8, 20]``::

    Loop x in [0, 8):
      Var f32 max_1 = <initial max>;  Loop r in [0, 20): <a[x, r]>, <accumulate max>
      Var f32 sum_3 = 0;              Loop r in [0, 20): exp(a[x, r] - max_1), <accumulate sum>
      Loop r in [0, 20): Store out0[x * 20 + r] = exp(a[x, r] - max_1) / sum_3

Values are computed where they are read (:class:`~torchloom.codegen.writer.ValueWalk`):
views are index math, broadcasts read one element, bf16/f16 results round as eager does.
"""

from __future__ import annotations

from typing import Any

from torchloom.codegen import columns, expr, nests, stmt
from torchloom.codegen.base import (Kernel, KernelSource, Reason, Written, laid_out_as,
                                    rejected_by_eager)
from torchloom.codegen.contract import (REDUCTION_KINDS, LaunchSpec, Lowered, Param, Renderer,
                                        Schedule, size_param)
from torchloom.codegen.empty_rows import nonempty_dims
from torchloom.codegen.expr import Code, Literal, Name
from torchloom.codegen.indexing import IndexMath, Unsupported, prod
from torchloom.codegen.lower_columns import ColumnLowering, carried_output
from torchloom.codegen.lower_walks import WalkLowering
from torchloom.codegen.nest_writer import NestWriter
from torchloom.codegen.reductions import F32_SUM_COUNT, accumulator, reduction_table
from torchloom.codegen.restride import strides_of
from torchloom.codegen.schedule import ReductionNest, levels
from torchloom.codegen.row_form import RowForm
from torchloom.codegen.scopes import LOW, Scopes
from torchloom.codegen.spelling import spelling_of
from torchloom.codegen.writer import COMPUTE, SCALAR_DTYPES, Expr, output_names, var_correction
from torchloom.ir import Node, ScalarType, TensorType, Value, symbols


class _Lowering(ColumnLowering, WalkLowering, RowForm, NestWriter):
    """One nest of a group lowered for one renderer (see the module docstring): it stores
    ``outputs`` (pointer, value), computes ``reductions`` over ``nest`` (None: a pointwise
    walk over its first output) and reads the values of ``read_back`` from the pointer an
    earlier nest stored them to."""

    tensor_type = staticmethod(lambda v: v.type)

    def __init__(self, group: Node, registry: Any, renderer: Renderer, em: Scopes,
                 nest: ReductionNest | None, outputs: list[tuple[str, Value]],
                 reductions: list[Node], read_back: dict[Value, str],
                 carried: tuple[tuple[str, Node], ...] = ()):
        super().__init__(group, registry, em, IndexMath(
            renderer.language, {s: size_param(s) for s in _region_symbols(group.region)}),
            reductions, read_back, nest)
        self.renderer = renderer
        self.spelling = spelling_of(renderer)
        self.POINTWISE = renderer.ops
        self.REDUCTIONS = reduction_table(renderer.sqrt)
        em.forget_inner()  # (an earlier nest's inner names are this one's row names)
        self.outputs = outputs
        #: the declarations of a row element's coordinates, at the top of each loop over
        #: the row
        self.r_header: tuple[stmt.Declare, ...] = ()
        #: the scratch arrays the nest asks for besides its nests' row results: (name,
        #: element count, dtype); a column walk's accumulators, the sums carried
        self.arrays: list[tuple[str, Any, str]] = []
        #: the column sums a row nest carries: (pointer, sum node, the array of its sums,
        #: their dtype: a sum of the nest's rows)
        self.carried: list[tuple[str, Node, str, str]] = []
        for pointer, node in carried:
            name = em.fresh("acc_colsum")
            dtype = self.accumulator("sum", COMPUTE[node.outputs[0].type.dtype], nest.rows)
            self.arrays.append((name, nest.rnumel, dtype))
            self.carried.append((pointer, node, name, dtype))

    # ---- the loops ---------------------------------------------------------------------
    def reduction(self) -> list:
        self.em.open()
        self.row_form(self.reduction_nest, self.outputs)
        rows = stmt.Loop("x", "0", self.ix.size(self.reduction_nest.rows), tuple(self.em.close()))
        if not self.carried:
            return [rows]
        before, after = self.around_the_rows()
        return [*before, rows, *after]

    # what RowForm asks of a writer (row_form.py): one loop per level of reductions
    def begin_reductions(self, xs: list, header: list, rs: list) -> None:
        self.r_header = tuple(header)  # (no row buffers)

    def reduce_row(self) -> None:
        for level in levels(self.reductions):
            self._reduce(level)

    def carries_columns(self) -> bool:
        return bool(self.carried)

    def begin_row_loop(self) -> None:
        self.em.open_phase()

    def end_row_loop(self) -> None:
        self._loop_r(self.em.close_phase())

    def _loop_r(self, body: list) -> None:
        self.em.add(stmt.Loop("r", "0", self.ix.size(self.rnumel), tuple(body),
                              self.r_header))

    def _fold(self, folds: list[tuple[str, str, Value, str, str]]) -> None:
        """One loop over the row folding each (kind, accumulator, source, dtype, extra) of
        ``folds``: ``src`` as ``dtype`` into the accumulator (``extra``: see
        ``Renderer.accumulate``); none without folds."""
        if not folds:
            return
        self.em.open_phase()
        for kind, acc, src, dtype, extra in folds:
            x = self.em.convert(self.value_at(src, self.full), dtype)
            for s in self.renderer.accumulate(kind, acc, x.text, "r", extra):
                self.em.add(s)
        self._loop_r(self.em.close_phase())

    def _var(self, kind: str, dtype: str, init: str | None = None) -> str:
        name = self.em.fresh(kind)
        self.em.add(stmt.Var(dtype, name, init or self.renderer.initial(kind, dtype)))
        return name

    def accumulator(self, kind: str, dtype: str, count: Any) -> str:
        """The dtype a reduction of ``kind`` computed in ``dtype`` accumulates ``count``
        values in (:func:`~torchloom.codegen.reductions.accumulator`: the one accumulator
        a row adds its values to one by one, on any device, needs double for a long f32
        sum and for a variance). A renderer without f64 keeps a variance of at most
        ``F32_SUM_COUNT`` values in ``dtype`` (two passes, its mean a short sum) and
        declines the others: :class:`Unsupported` (their values would not be eager's)."""
        acc = accumulator(kind, dtype, count)
        if acc != "f64" or "f64" in self.renderer.capabilities.dtypes:
            return acc
        if kind == "var" and isinstance(count, int) and count <= F32_SUM_COUNT:
            return dtype
        what = f"{count}" if isinstance(count, int) else f"a symbolic count ({count}) of"
        raise Unsupported(f"{'a variance' if kind == 'var' else 'a sum'} of {what} f32 "
                          f"values accumulates in f64 for eager's values; the renderer "
                          f"renders no f64")

    def _reduce(self, level: list[Node]) -> None:
        """The reductions of one level (none reads another's result: ``schedule.levels``):
        their accumulators (:meth:`accumulator`'s dtype), one loop over the row folding
        them all (a variance's squared deviations in a second loop, after its mean), then
        their results."""
        n = self.ix.size_code(self.rnumel)
        first, means, accs = [], {}, {}
        for node in level:
            kind, src = self.REDUCTIONS[node.op].kind, node.inputs[0]
            src_dtype = COMPUTE[src.type.dtype]
            dtype = "b8" if kind in ("any", "all") else self.accumulator(
                kind, COMPUTE[node.outputs[0].type.dtype], self.rnumel)
            if kind == "var":
                total = self._var("sum", dtype)
                first.append(("sum", total, src, dtype, ""))
                means[node] = (total, dtype)
            elif kind in ("argmax", "argmin"):
                value = self._var("best", src_dtype, self.renderer.initial(kind, src_dtype))
                acc = self._var(kind, "i64", "0")
                first.append((kind, acc, src, src_dtype, value))
                accs[node] = (acc, "", value, None)  # (results in their dtypes)
            else:
                acc = self._var(kind, dtype)
                first.append((kind, acc, src, dtype, ""))
                accs[node] = (acc, "", "", dtype)
        self._fold(first)
        second = []
        for node, (total, dtype) in means.items():
            mean = self.em.emit(f"{total} / {n}", dtype, "mean").text
            acc = self._var("var", dtype, self.renderer.initial("sum", dtype))
            second.append(("var", acc, node.inputs[0], dtype, mean))
            accs[node] = (acc, mean, "", dtype)
        self._fold(second)
        for node in level:
            acc, mean, value, dtype = accs[node]
            self.results(node, Name(acc), Name(mean), Name(value), dtype)

    def results(self, node: Node, acc: Code, mean: Code = Name(""),
                value: Code = Name(""), dtype: str | None = None) -> None:
        """``node``'s outputs from its accumulator ``acc`` (and ``var``'s ``mean``, an arg
        reduction's extreme ``value``), computed in ``dtype`` (the accumulator's; None: each
        output's own), recorded for what reads them at their row."""
        rank = len(self.shape)
        for out in node.outputs:
            code = self.result_code(node, out, acc, mean, value)
            self.reduced[out] = (self.row_keepdim if len(out.type.shape) == rank and rank
                                 else self.row, self.result_value(out, code, dtype))

    def result_code(self, node: Node, out: Value, acc: Code, mean: Code = Name(""),
                    value: Code = Name("")) -> Code:
        """Reduction ``node``'s output ``out``: its template filled with the accumulator
        ``acc`` (and ``mean``, ``value``: see :meth:`results`), the row length and
        ``var``'s degrees of freedom."""
        n = self.ix.size_code(self.rnumel)
        template = self.REDUCTIONS[node.op].outputs[node.outputs.index(out)]
        dof = self.degrees_of_freedom(node) if "{dof}" in template else Name("")
        return expr.fill(template, dict(acc=acc, n=n, mean=mean, value=value, dof=dof))

    def degrees_of_freedom(self, node: Node) -> Code:
        """A var/std reduction's ``max(0, n - correction)``, as eager's (a correction past
        the row's length divides by 0: inf, or NaN for a row of one equal value): a
        literal at a static row length, else the size expression ``Max(n - c, 0)`` in the
        renderer's language; :class:`Unsupported` for a fractional correction of a row of
        symbolic length (no size expression)."""
        correction = var_correction(node)
        if isinstance(self.rnumel, int):
            dof = max(0, self.rnumel - correction)
            return Literal(str(dof), dof)
        if correction != int(correction):
            raise Unsupported(f"{node.op} with the fractional correction {correction} over "
                              f"rows of symbolic length {self.rnumel}")
        return self.ix.size_code(f"Max({self.rnumel} - {int(correction)}, 0)")

    def result_value(self, out: Value, code: Code, dtype: str | None = None) -> Expr:
        """Reduction output ``out``'s value ``code`` (its template filled, computed in
        ``dtype``: by default the output's compute dtype) bound in its compute dtype,
        rounded as eager rounds a bf16/f16 result."""
        computed = COMPUTE[out.type.dtype]
        if dtype not in (None, computed):  # (computed in the accumulator's dtype first)
            code = self.em.convert(self.em.emit(code, dtype, out.name), computed).code
        e = self.em.emit(code, computed, out.name)
        return self.em.cast(e, out.type.dtype) if out.type.dtype in LOW else e


def _region_symbols(region) -> list[str]:
    """The size symbols in the region's tensor types (in shapes, strides), sorted."""
    values = [*region.inputs, *(v for n in region.nodes for v in n.outputs)]
    return sorted({s for v in values if isinstance(v.type, TensorType)
                   for d in (*v.type.shape, *strides_of(v.type))
                   for s in symbols.symbols_of(d)})


def _launch(region, scratch: list[tuple[str, Any, str]]) -> LaunchSpec:
    params, inputs = [], []
    for v in region.inputs:
        if isinstance(v.type, ScalarType):
            if v.type.kind not in SCALAR_DTYPES:
                raise Unsupported(f"input %{v.name} is a {v.type.kind} scalar")
            params.append(Param(f"in_{v.name}", "scalar", SCALAR_DTYPES[v.type.kind]))
            inputs.append(None)
        else:
            t = v.type
            params.append(Param(f"in_{v.name}", "input", t.dtype))
            inputs.append((tuple(t.shape), strides_of(t)))
    outputs = []
    for k, v in enumerate(region.outputs):
        t = v.type
        params.append(Param(f"out{k}", "output", t.dtype))
        outputs.append((tuple(t.shape), strides_of(t), t.dtype))
    params += [Param(name, "scratch", dtype) for name, _, dtype in scratch]
    bound = symbols.bind_symbols([None if i is None else i[0] for i in inputs])
    sizes = []
    for s in _region_symbols(region):
        if s not in bound:
            raise Unsupported(f"size {s} is no input's dim (it is only part of size "
                              f"expressions or strides): the launcher cannot read it")
        params.append(Param(size_param(s), "size", "i64"))
        sizes.append((s, *bound[s]))
    return LaunchSpec("kernel", tuple(params), tuple(outputs),
                      tuple((numel, dtype) for _, numel, dtype in scratch),
                      tuple(inputs), tuple(sizes),
                      nonempty_dims(region, REDUCTION_KINDS))


def _is_reduction(node: Node) -> bool:
    return node.op in REDUCTION_KINDS


def _fold(classes: list, parts: list, depends: Any) -> tuple[int, int] | None:
    """Column sums ride in the row nest (:func:`nests.carried_columns`) where their outputs
    are of their nest's kept shape (:func:`carried_output`)."""
    return nests.carried_columns(classes, parts, depends, lambda v: v.type.shape,
                                 lambda plan: True, carried_output)


def _lower_nests(group: Node, registry: Any, renderer: Renderer,
                 planned: tuple[nests.Nest, ...]
                 ) -> tuple[list, list[tuple[str, Any, str]], tuple[str, ...]]:
    """The statements of the planned nests, one after the other, the scratch arrays they
    store row results to and accumulate columns in (pointer, element count, dtype), and
    what the source needs besides (``Scopes.use``). Outputs are the kernel's ``out<k>``."""
    region = group.region
    pointer = {name: f"out{k}" for k, name in enumerate(output_names(region))}
    em, body, scratch = Scopes(renderer), [], []
    for nest in planned:
        outputs = [(pointer.get(name, name), v) for name, v in nest.stored(region)]
        reductions = nest.computed(region, _is_reduction)
        scratch += [(name, prod(v.type.shape), v.type.dtype) for name, v in outputs
                    if nests.is_scratch(name)]
        shape = ReductionNest.of(reductions, lambda v: v.type) if reductions else None
        walk = _Lowering(group, registry, renderer, em, shape, outputs, reductions,
                         {v: pointer.get(name, name) for v, name in nest.read_back},
                         tuple((pointer.get(name, name), n) for name, n in nest.columns))
        if not reductions:
            body += walk.pointwise()
            continue
        plan = columns.plan(shape, reductions, region.inputs, [v for _, v in outputs],
                            lambda v: v.type, walk.output_place)
        body += walk.reduction() if plan is None else walk.columns(plan)
        scratch += walk.arrays
    return body, scratch, tuple(em.needs)


def lower(group: Node, registry: Any, schedule: Schedule, renderer: Renderer) -> Lowered:
    """``group`` (whose schedule is ``schedule``) as statements for ``renderer``: the
    loop nests the core's nest plan gives it (:mod:`torchloom.codegen.nests`, written by
    ``nests.write_plan``), one after the other; :class:`Unsupported` with the reason when the
    lowering cannot express it."""
    region = group.region
    body, scratch, needs = nests.write_plan(
        region, _is_reduction, lambda v: v.type, _fold,
        lambda planned: _lower_nests(group, registry, renderer, planned))
    return Lowered(schedule, _launch(region, scratch), tuple(stmt.drop_unused(body)), needs)


class RendererCodegen:
    """The :class:`~torchloom.codegen.base.Codegen` of a :class:`Renderer`: a group whose
    schedule the renderer's capabilities do not cover is declined with
    :meth:`~torchloom.codegen.contract.Capabilities.gap`'s reason (one the lowering cannot
    express, with the lowering's); the others are lowered once (kept for ``generate``),
    rendered, and built by ``load``."""

    def __init__(self, renderer: Renderer):
        spelling_of(renderer)  # (a renderer's spelling that is none: a plugin load error)
        self.renderer = renderer
        self.name = renderer.name
        self.version = renderer.version
        self._written = Written()

    def available(self, group: Node) -> Reason | None:
        """What this machine lacks for the renderer's kernels (its optional
        ``available() -> str | None``: a compiler, say), writing nothing; with nothing
        missing, the kernel cache loads a stored kernel without judging its group."""
        check = getattr(self.renderer, "available", None)
        missing = check() if callable(check) else None
        return None if missing is None else Reason(self.name, missing)

    def takes_device(self, device: str) -> bool:
        """Whether groups on ``device`` come here: its type is among the renderer's
        ``capabilities.devices``."""
        return self.renderer.capabilities.takes_device(device)

    def supports(self, group: Node, registry: Any) -> Reason | None:
        missing = self.available(group) or rejected_by_eager(self.name, group, registry)
        if missing is not None:  # (eager raises there: so must the compiled graph)
            return missing
        try:
            self.generate(group, registry)
        except Unsupported as exc:
            return Reason(self.name, str(exc))
        return None

    def generate(self, group: Node, registry: Any) -> KernelSource:
        return self._written.get(group, registry, lambda: self._write(group, registry))

    def _write(self, group: Node, registry: Any) -> KernelSource:
        schedule = Schedule.of(group)
        gap = self.renderer.capabilities.gap(schedule)
        if gap is not None:
            raise Unsupported(gap)
        lowered = lower(group, registry, schedule, self.renderer)
        return KernelSource(self.name, self.renderer.render(lowered),
                            {"form": schedule.form, "launch": lowered.launch.to_json()})

    def load(self, kernel: KernelSource, registry: Any) -> Kernel:
        launch = LaunchSpec.from_json(kernel.metadata["launch"])
        return laid_out(self.renderer.build(kernel.source, launch), launch)


def laid_out(run: Kernel, launch: LaunchSpec) -> Kernel:
    """``run``, handed each tensor input at the strides its kernel reads it with
    (``launch.inputs``, at the call's sizes where they are symbolic; a dense copy so laid
    out where a tensor comes with others, as a graph's intermediate may: eager's ops choose
    their outputs' strides), strides of dims of size 1 aside."""
    tensors = [i for i, layout in enumerate(launch.inputs) if layout is not None]
    if len(tensors) != sum(p.role == "input" for p in launch.params):
        raise ValueError(f"kernel {launch.entry}: its launch spec has no layout for every "
                         f"tensor input (made by an older torchloom): compile it again")

    def kernel(*args):  # (bind raises eager's error for empty rows, before any copy)
        layouts = launch.bind(args).inputs if launch.sizes else launch.inputs
        args = list(args)
        for i in tensors:
            args[i] = laid_out_as(args[i], layouts[i][1])
        return run(*args)
    return kernel
