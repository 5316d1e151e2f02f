"""A fusion group -> one C function, made of one loop nest or several: the core's nest
plan (``torchloom.codegen.nests``: which nests, the outputs each stores, the reductions it
computes, what it reads back from memory) written by a :class:`KernelWriter` per nest, one
after the other (or in one parallel region: team.py); the plan's scratch arrays (one value
per row, ``scratch_<value>``) allocated and freed by the function.
"""

from __future__ import annotations

from typing import Any

from torchloom.api import (REDUCTION_KINDS, Graph, Node, ScalarType, Schedule, TensorType,
                           Value, clone_graph, input_read_bytes, int_sizes, nonempty_dims,
                           print_graph, stmt, structural_hash, symbols, unread_inputs)
from torchloom.api import nests as nest_plan

from torchloom_codegen_cpu import rows_and_columns, team
from torchloom_codegen_cpu.inplace import inplace_pairs
from torchloom_codegen_cpu.gathers import index_checks
from torchloom_codegen_cpu.kernel import SCALAR_DTYPES, KernelWriter, output_names
from torchloom_codegen_cpu.ops import CTYPE, ITEMSIZE, REDUCTIONS, STORAGE, VIEWS
from torchloom_codegen_cpu.render import indented, render
from torchloom_codegen_cpu.tensors import memory_order, tensor_type


def size_arguments(region: Graph) -> tuple[dict[str, str], dict[str, int]]:
    """The kernel's size arguments ``S_0, S_1, ...``: (symbol or size expression -> its
    argument, argument -> the scalar region input it is read from).

    A symbol is read from the first tensor input dim that is that bare symbol; else from an
    int input that is a size (``int_sizes``: an ``int[s4]``, or an int a view gives as
    that dim's size, ``aten.view(%x, %n) {size = [$1, 8]} : f32[s0, 8]``: ``%n`` is s0; a
    dim that is an expression, ``(s0//2)``, is then an argument of its own, read from that
    int); else an input dim
    that is an expression of symbols read nowhere (``f32[s0*s1, 48]``, a flattened batch)
    is an argument of its own, which dims containing that whole expression use (and
    :func:`stride_arguments` names strides).
    Numbered in that order, walking the region as the canonical form does, so groups equal
    up to their symbols' names get one function."""
    inputs = region.inputs
    names: dict[str, str] = {}
    for v in inputs:
        if isinstance(v.type, TensorType):
            for d in v.type.shape:
                if symbols.is_symbol(d):
                    names.setdefault(d, f"S_{len(names)}")
    scalars: dict[str, int] = {}
    for i, d in int_sizes(region):  # int[s4] carriers, view sizes
        if d not in names:
            names[d] = f"S_{len(names)}"
            scalars[names[d]] = i
    for v in inputs:
        if isinstance(v.type, TensorType):
            for d in v.type.shape:
                if isinstance(d, str) and any(s not in names for s in symbols.symbols_of(d)):
                    names.setdefault(d, f"S_{len(names)}")
    return names, scalars


def stride_arguments(region: Graph, names: dict[str, str]) -> dict[int, list[int]]:
    """Name each input stride of symbols read nowhere (``x[:, 0]`` of an f32[b, s, 16]:
    stride 16*s) as a size argument the launcher reads from the tensor's strides, where
    that is safe: the expression is that one stride (no other stride, no dim of any value
    in the region), and a dense copy in the input's memory order has the input's other
    strides (what the launcher makes of a tensor in another layout, reading the argument
    again). Returns input index -> its memory order, for each input given one."""
    exprs: dict[str, list[tuple[int, int]]] = {}
    dims: set[str] = set()
    for v in [*region.inputs, *(o for n in region.nodes for o in n.outputs)]:
        if isinstance(v.type, TensorType):
            dims.update(d for d in v.type.shape if isinstance(d, str))
    for i, v in enumerate(region.inputs):
        if isinstance(v.type, TensorType):
            for k, d in enumerate(v.type.actual_strides() or ()):
                if isinstance(d, str):
                    exprs.setdefault(d, []).append((i, k))
    orders: dict[int, list[int]] = {}
    for d, places in exprs.items():
        if all(s in names for s in symbols.symbols_of(d)) or len(places) > 1 or d in dims:
            continue
        ((i, k),) = places
        t = region.inputs[i].type
        order = list(memory_order(t))
        dense, acc = {}, 1
        for j in reversed(order):
            dense[j] = acc
            size = t.shape[j]
            acc = acc * max(size, 1) if isinstance(size, int) and isinstance(acc, int) else None
        if all(j == k or dense[j] == e for j, e in enumerate(t.actual_strides())):
            names[d] = f"S_{len(names)}"
            orders[i] = order
    return orders


def _writers(group: Node, registry: Any, planned, names: dict[str, str] | None
             ) -> list[KernelWriter]:
    """A writer per nest of a plan (``torchloom.codegen.nests.Nest``)."""
    region = group.region
    return [KernelWriter(group, registry, n.stored(region), n.computed(region, _is_reduction),
                         names, dict(n.read_back), list(n.columns) or None) for n in planned]


def _is_reduction(node: Node) -> bool:
    return node.op in REDUCTIONS


#: how the header comment names a nest's parallel loop other than rows
_FORMS = {"xb": " (columns)", "xs": " (staged)"}


def _written(nests: list[KernelWriter]) -> tuple[list[KernelWriter], list, bool]:
    """The nests' statements, and whether they share one parallel region (team.py); a nest
    that found tensors lying across its rows is written again over staged blocks of rows
    (``KernelWriter.restaged``)."""
    done, body = [], []
    for w in nests:
        statements = w.nest()
        again = w.restaged()
        if again is not None:
            w, statements = again, again.nest()
        done.append(w)
        body += statements
    if team.teamable(done):
        return done, team.team_body(done), True
    return done, body, False


def write_function(group: Node, registry: Any) -> tuple[str, dict[str, Any]]:
    """The C function (without the prelude) and its metadata."""
    region = group.region
    names, scalars = size_arguments(region)
    orders = stride_arguments(region, names)
    nests, body, teamed = nest_plan.write_plan(  # (the plan after the rows where declined)
        region, _is_reduction, tensor_type, rows_and_columns.foldable,
        lambda planned: _written(_writers(group, registry, planned, names)))
    digest = structural_hash(region)
    ops = [n.op.split(".")[1] for n in region.nodes if n.op not in VIEWS]
    kernel = "_".join(["fused", *dict.fromkeys(ops)])[:48].rstrip("_") + f"_{digest[:10]}"
    inplace = inplace_pairs(region, nests, body)
    shared = {("in", i) for i, _ in inplace} | {("out", j) for _, j in inplace}
    params = []
    for i, v in enumerate(region.inputs):
        if isinstance(v.type, ScalarType):
            params.append(f"{CTYPE[SCALAR_DTYPES[v.type.kind]]} in_{v.name}")
        else:
            params.append(f"const {STORAGE[v.type.dtype]}* {_restrict('in', i, shared)}"
                          f"in_{v.name}")
    params += [f"{STORAGE[tensor_type(v).dtype]}* {_restrict('out', j, shared)}{name}"
               for j, (name, v) in enumerate(zip(output_names(region), region.outputs))]
    params += [f"int64_t {name}" for name in names.values()]  # symbolic sizes, at run time
    params.append("int nthreads")
    parallel = teamed or any(w.parallel for w in nests)
    forms = ", ".join(f"{w.kind}{_FORMS.get(w.loop.var, '')} over "
                      f"{nests[0].dims(w.loop.trips)} {'blocks of ' * (w.loop.var == 'xs')}"
                      f"rows" for w in nests)
    header = ["/* torchloom cpu kernel for this group:"]
    header += [" *   " + line for line in _printed(region).splitlines()]
    header += [f" * {forms} */"]
    definitions = {name: text for w in nests for name, text in w.em.tables.items()}
    # a kernel reading tables at indices returns whether one was out of range (gathers.py)
    checks = index_checks(region, nests[0].ix)
    source = [*definitions.values(), *header,
              f"{'int' if checks else 'void'} {kernel}({', '.join(params)}) {{"]
    if not parallel:
        source.append("  (void)nthreads;")
    scratch = {name: v for w in nests for name, v in zip(w.out_names, w.outputs)
               if nest_plan.is_scratch(name)}
    allocated = []
    for name, v in scratch.items():  # (no larger than a row result: one value per row)
        ctype, n = STORAGE[tensor_type(v).dtype], _numel_text(v, nests[0])
        allocated.append(stmt.Var(f"{ctype}* restrict", name,
                                  f"({ctype}*)malloc(({n}) * sizeof({ctype}) + 1)"))
    freed = [stmt.Raw(f"free({name});") for name in scratch]
    returned = [stmt.Raw("return 0;")] if checks else []
    source += [*indented(render([*checks, *allocated, *body, *freed, *returned])), "}"]
    # the kernel's form as the core's schedule names it (the same for every target)
    metadata = {"kernel": kernel, "kind": nests[0].kind, "nests": len(nests),
                "schedule": Schedule.of(group).form,
                "rows": [nests[0].dims(w.loop.trips) for w in nests],
                "parallel": parallel, "sizes": list(names.values()),
                "inputs": [_describe(v, nests[0]) for v in region.inputs],
                "outputs": [_describe(v, nests[0]) for v in region.outputs],
                "inplace": [list(pair) for pair in inplace]}
    if checks:  # the launcher raises eager's IndexError where the function returns 1
        metadata["checks"] = "index"
    nonempty = [[nests[0].dims(d), [nests[0].dims(n) for n in counts], error, message]
                for d, counts, error, message in nonempty_dims(region, REDUCTION_KINDS)]
    if nonempty:  # a max over rows of symbolic length: the launcher raises on 0, as eager
        metadata["nonempty"] = nonempty
    for i in unread_inputs(region):  # a size carrier: read for its shape only
        metadata["inputs"][i]["unread"] = True
    for name, i in scalars.items():  # this int input is those sizes' value
        metadata["inputs"][i].setdefault("sizes", []).append(name)
    for i, order in orders.items():  # a stride is a size argument: copies are dense so
        metadata["inputs"][i]["order"] = order
    if not names:
        # the plan explain reports: each nest reads its inputs once from memory (a row's
        # later loops hit the cache), every output is written once; symbolic sizes have no
        # byte count before the call
        metadata.update({"grid": [sum(w.loop.trips for w in nests)],
                         "bytes_read": sum(_read_bytes(v) for w in nests for v in w.loaded),
                         "bytes_written": sum(_nbytes(v) for v in region.outputs),
                         "numel": max(w.numel for w in nests)})
    return "\n".join(source) + "\n", metadata


def _restrict(kind: str, index: int, shared: set[tuple[str, int]]) -> str:
    return "" if (kind, index) in shared else "restrict "


def _printed(region: Graph) -> str:
    """The region's text with its size symbols numbered by first appearance (``s0``,
    ``s1``: as the canonical form numbers them), so that groups equal up to their symbols'
    names give the same source, and so one library, whatever names torch chose."""
    order: dict[str, str] = {}
    for v in [*region.inputs, *(o for n in region.nodes for o in n.outputs)]:
        if isinstance(v.type, TensorType):
            for d in (*v.type.shape, *(v.type.strides or ())):
                for s in symbols.symbols_of(d):
                    order.setdefault(s, f"s{len(order)}")
        elif isinstance(v.type, ScalarType) and v.type.size is not None:  # int[s4]
            order.setdefault(v.type.size, f"s{len(order)}")
    if not order:
        return print_graph(region)
    # (a copy of its own: its types are renamed, int[s4] sizes too)
    return print_graph(clone_graph(region, dim=lambda d: symbols.rename_dim(d, order))[0])


def _numel_text(v: Value, writer: KernelWriter) -> str:
    """C text of ``v``'s element count."""
    return " * ".join(f"({writer.ix.size(d)})" for d in tensor_type(v).shape) or "1"


def _read_bytes(v: Value) -> int:
    """The bytes a nest reads of input ``v`` (a table only gathers read: their rows)."""
    return input_read_bytes(v, {v}, v.users(), _nbytes)


def _nbytes(v: Value) -> int:
    t = tensor_type(v)
    n = 1
    for d in t.shape:
        n *= d
    return n * ITEMSIZE[t.dtype]


def _describe(v: Value, writer: KernelWriter) -> dict[str, Any]:
    """A kernel argument; symbolic dims are written over the size arguments (``S_0``);
    strides None: contiguous (symbolic sizes)."""
    if isinstance(v.type, ScalarType):
        return {"scalar": v.type.kind}
    t = tensor_type(v)
    strides = t.actual_strides()
    return {"shape": [writer.dims(d) for d in t.shape],
            "strides": None if strides is None else [writer.dims(d) for d in strides],
            "dtype": t.dtype}
