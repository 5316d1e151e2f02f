"""A fusion group -> one C function, made of one loop nest or several.

Reductions of a group that reduce different dims (layer_norm's backward: row sums for the
input gradient, column sums for the weight and bias gradients) cannot share one loop. They
are written as consecutive nests in the same function, one per (input shape, reduced dims)
class, each storing the outputs that depend on its reductions; outputs depending on no
reduction go with the first nest. A pointwise group whose outputs have different element
counts is a nest per count, and outputs of one count but another shape or layout that
share no computed value are a nest per walk (each in its own order: no division per
element to address them). Pointwise values both nests need are recomputed (cheap next to
a round trip through memory). A reduction whose input depends on another class's
result, or an output depending on two classes, comes in a later nest (classes ordered so
that producers come first; two classes reading each other's results are declined), which
reads what earlier nests computed from memory: an output they store (a cross-entropy
gradient, and the bias gradient summed from it over the batch: rounded to the output's
dtype, as eager reads it), else the reduction results it needs, which their nest stores
in a scratch array of one value per row the function allocates (a layer_norm backward
that recomputes its statistics: the weight gradient's column sums read the mean and
variance per row).
"""

from __future__ import annotations

from typing import Any

import attrs

from torchloom.api import (Graph, InputRef, Node, ScalarType, Schedule, TensorType, Value,
                           clone_graph, indexing, print_graph, schedule, structural_hash,
                           stmt, symbols, writer)

from torchloom_codegen_cpu import rows_and_columns, team
from torchloom_codegen_cpu.inplace import inplace_pairs
from torchloom_codegen_cpu.kernel import SCALAR_DTYPES, KernelWriter, output_names
from torchloom_codegen_cpu.ops import CTYPE, ITEMSIZE, REDUCTIONS, STORAGE, VIEWS
from torchloom_codegen_cpu.reduction import reduced_dims
from torchloom_codegen_cpu.render import indented, render
from torchloom_codegen_cpu.tensors import Unsupported, memory_order, tensor_type


def _classes(reductions: list[Node]) -> list[list[Node]]:
    """Reductions grouped by (input shape, reduced dims), in order of first appearance."""
    return schedule.nest_classes(reductions, lambda v: tensor_type(v).shape)


def _depends(v: Value, memo: dict[Value, frozenset[int]], of: dict[Node, int],
             stored: dict[Value, str] | None = None) -> frozenset[int]:
    """The reduction classes ``v`` depends on (inside the region); a value in ``stored``
    (an output an earlier nest wrote, read back from memory) depends on none."""
    found = memo.get(v)
    if found is not None:
        return found
    node = v.producer
    result: frozenset[int] = frozenset()
    if node is not None and not (stored and v in stored):
        if node in of:
            result = frozenset({of[node]})
        for i in node.inputs:
            result |= _depends(i, memo, of, stored)
    memo[v] = result
    return result


def size_arguments(region: Graph) -> tuple[dict[str, str], dict[str, int]]:
    """The kernel's size arguments ``S_0, S_1, ...``: (symbol or size expression -> its
    argument, argument -> the scalar region input it is read from).

    A symbol is read from the first tensor input dim that is that bare symbol; else from an
    int input a view gives as that dim's size (``aten.view(%x, %n) {size = [$1, 8]} :
    f32[s0, 8]``: ``%n`` is s0; a dim that is an expression, ``(s0//2)``, is then an
    argument of its own, read from that int) or a slice from 0 takes as its end (``x[:,
    :n]`` of an ``i64[2, s0+1]``, typed ``i64[2, s0]``: ``%n`` is s0); else an input dim
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
    position = {v: i for i, v in enumerate(inputs)}

    def read_from_int(d: Any, source: Value) -> None:
        if isinstance(d, str) and d not in names and source in position and \
                isinstance(source.type, ScalarType) and source.type.kind == "int":
            names[d] = f"S_{len(names)}"
            scalars[names[d]] = position[source]

    for node in region.nodes:
        if len(node.outputs) != 1 or not isinstance(node.outputs[0].type, TensorType):
            continue
        shape = node.outputs[0].type.shape
        sizes = node.attrs.get("size") if VIEWS.get(node.op) in ("reshape", "expand") else None
        if isinstance(sizes, (list, tuple)):
            for d, entry in zip(shape, sizes):
                if isinstance(entry, InputRef):
                    read_from_int(d, node.inputs[int(entry)])
        elif (VIEWS.get(node.op) == "slice" and len(node.inputs) == 2 and "end" not in
              node.attrs and node.attrs.get("start") == 0 and node.attrs.get("step", 1) == 1
              and isinstance(node.attrs.get("dim", 0), int)):
            # x[:, :n] with n an int input: the slice's length is n (its type says so: a
            # bare symbol where the input's dim is another size, so n was not clamped)
            dim = node.attrs.get("dim", 0)
            if -len(shape) <= dim < len(shape) and symbols.is_symbol(shape[dim]):
                read_from_int(shape[dim], node.inputs[1])
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


def _by_element_count(named: list[tuple[str, Value]]) -> list[list[tuple[str, Value]]]:
    """Outputs grouped by element count (equal at every size), the largest count first
    where all are static, else in order of appearance: a pointwise walk covers the
    elements of one count (a group that also returns a broadcast operand, say [2, 1]
    beside [2, 8], is written as a nest per count). Largest first: an input is read by
    nests of its count or larger only, so every nest reading it has run before the nest
    that may write its output over it (``inplace.py``: an optimizer step's ``f32[]``
    step counts, read by each parameter's nest, written last)."""
    parts: list[tuple[Any, list[tuple[str, Value]]]] = []
    for name, v in named:
        count = indexing.prod(tensor_type(v).shape)
        for known, part in parts:
            if indexing.same(known, count):
                part.append((name, v))
                break
        else:
            parts.append((count, [(name, v)]))
    if all(isinstance(count, int) for count, _ in parts):
        parts.sort(key=lambda counted: -counted[0])  # (stable: equal counts keep order)
    return [part for _, part in parts]


def _by_walk(part: list[tuple[str, Value]]) -> list[list[tuple[str, Value]]]:
    """Outputs of one element count split by walk (shape and memory order) where they
    share no computed value: a walk follows its first output, and an output of another
    shape or layout is addressed by delinearising the walk's index, a division per element
    when sizes are runtime arguments (q, k transposed and v copied to contiguous by one
    group: k's copy is its own nest, in its own order). Outputs sharing a computed (not
    view) node stay in one walk: splitting them would compute it twice."""
    keys = [(tuple(tensor_type(v).shape), memory_order(tensor_type(v))) for _, v in part]
    if len(set(keys)) == 1:
        return [part]
    walks: list[tuple[list, set[Node], list[tuple[str, Value]]]] = []
    for (name, v), key in zip(part, keys):
        cone = _computed(v)
        joined = [w for w in walks if key in w[0] or w[1] & cone]
        keys_, nodes, members = [key], set(cone), [(name, v)]
        for w in joined:  # (in order: the first output keeps the first walk)
            keys_ += w[0]
            nodes |= w[1]
            members = w[2] + members
            walks.remove(w)
        walks.append((keys_, nodes, members))
    order = {name: i for i, (name, _) in enumerate(part)}
    nests = [sorted(w[2], key=lambda m: order[m[0]]) for w in walks]
    return sorted(nests, key=lambda m: order[m[0][0]])


def _computed(v: Value) -> set[Node]:
    """The region nodes ``v`` is computed from, views (index math, free) left out."""
    return {n for n in writer.upstream_nodes([v]) if n.op not in VIEWS}


def plan_nests(group: Node, registry: Any, names: dict[str, str] | None = None
               ) -> list[KernelWriter]:
    region = group.region
    reductions = [n for n in region.nodes if n.op in REDUCTIONS]
    named = list(zip(output_names(region), region.outputs))
    classes = _classes(reductions)
    if not classes:  # pointwise: a nest per element count of the outputs
        parts = [walk for part in _by_element_count(named) for walk in _by_walk(part)]
        if len(parts) == 1:
            return [KernelWriter(group, registry, names=names)]
        return [KernelWriter(group, registry, part, [], names) for part in parts]
    if len(classes) == 1:
        apart = _beside_the_rows(named, classes[0])
        if not apart:
            return [KernelWriter(group, registry, names=names)]
        rest = [(name, v) for name, v in named if (name, v) not in apart]
        nests = [KernelWriter(group, registry, walk, [], names)
                 for part in _by_element_count(apart) for walk in _by_walk(part)]
        # the reduction's nest reads those outputs back where it needs them
        return nests + [KernelWriter(group, registry, rest, classes[0], names,
                                     {v: name for name, v in apart})]
    classes = _producers_first(classes)
    of = {n: k for k, members in enumerate(classes) for n in members}
    memo: dict[Value, frozenset[int]] = {}
    parts: list[list[tuple[str, Value]]] = [[] for _ in classes]
    for name, v in named:  # an output goes with the last class it depends on
        deps = _depends(v, memo, of)
        parts[max(deps) if deps else 0].append((name, v))
    # outputs of P's shape that depend on no reduction (a product the row sums also read)
    # ride in the row nest where the columns fold into it
    shape = tensor_type(reductions[0].inputs[0]).shape
    free = [(name, v) for name, v in named if not _depends(v, memo, of)
            and tensor_type(v).shape == shape]
    folded = rows_and_columns.foldable(
        classes, [[o for o in part if o not in free] for part in parts],
        lambda v: _depends(v, memo, of))
    if folded is not None:  # column sums carried by the row nest
        row, col = folded
        columns = [(name, v.producer) for name, v in parts[col] if (name, v) not in free]
        rest = [o for o in parts[row] if o not in free] + free
        return [KernelWriter(group, registry, rest, classes[row], names, columns=columns)]
    # A nest reads what earlier nests computed from memory, never recomputing it: an
    # output they store (a cross-entropy gradient the bias gradient sums over the batch),
    # else a scratch array their nest stores the result in (the row statistics a
    # layer_norm backward recomputes, read by the weight gradient's column sums)
    written: dict[Value, str] = {}
    stored: list[dict[Value, str]] = []
    for k, members in enumerate(classes):
        roots = [n.inputs[0] for n in members] + [v for _, v in parts[k]]
        for v in _foreign_results(roots, k, of, written):
            written[v] = f"scratch_{v.name}"
            parts[of[v.producer]].append((written[v], v))
        # (what depends on no other class is computed again, as before: no extra read)
        stored.append({v: name for v, name in written.items()
                       if _depends(v, memo, of) - {k}})
        written.update((v, name) for name, v in parts[k])
    return [KernelWriter(group, registry, part, members, names, stored[k])
            for k, (part, members) in enumerate(zip(parts, classes)) if part]


def _beside_the_rows(named: list[tuple[str, Value]], members: list[Node]
                     ) -> list[tuple[str, Value]]:
    """Outputs that depend on no reduction and hold neither the reduced shape's elements
    nor a row's (ViT's backward: the gradient ``[2, 65, 192]`` of the token sequence and
    the bias gradient of the class token, summed over a ``[2, 1, 192]`` slice of it): a
    pointwise nest of their own writes them, before the reduction's."""
    shape = tuple(tensor_type(members[0].inputs[0]).shape)
    rdims = reduced_dims(members[0], len(shape))
    numel = indexing.prod(shape)
    rows = indexing.prod([d for k, d in enumerate(shape) if k not in rdims])
    reductions = set(members)
    return [(name, v) for name, v in named
            if not writer.upstream_nodes([v]) & reductions
            and not any(indexing.same(indexing.prod(tensor_type(v).shape), n)
                        for n in (numel, rows))]


def _after_the_rows(group: Node, registry: Any, names: dict[str, str] | None
                    ) -> list[KernelWriter] | None:
    """The plan of a group of one reduction class whose outputs its nest cannot hold (an
    output of another element count than the reduced shape's and the rows', a value that
    reads a reduction result at other elements than its row: Llama's backward sums the
    gradient over the repeated key/value heads and slices half of each head for the
    rotary embedding; Whisper's reads a row result through a transposing reshape), or
    None when it has no such form: the reduction's nest stores the reduction results
    (outputs, else scratch arrays of one value per row) and pointwise nests after it write
    every other output, reading those results back at whatever elements they need."""
    region = group.region
    classes = _classes([n for n in region.nodes if n.op in REDUCTIONS])
    if len(classes) != 1:
        return None
    members = set(classes[0])
    named = list(zip(output_names(region), region.outputs))
    own = [(name, v) for name, v in named if v.producer in members]
    rest = [(name, v) for name, v in named if v.producer not in members]
    written = {v: name for name, v in own}
    scratch = []
    for v in _foreign_results([v for _, v in rest], -1, dict.fromkeys(members, 0), written):
        written[v] = f"scratch_{v.name}"
        scratch.append((written[v], v))
    if not rest or not own + scratch:
        return None
    return [KernelWriter(group, registry, own + scratch, classes[0], names),
            *(KernelWriter(group, registry, walk, [], names, dict(written))
              for part in _by_element_count(rest) for walk in _by_walk(part))]


def _producers_first(classes: list[list[Node]]) -> list[list[Node]]:
    """The classes ordered so that each comes after those whose results it reads (else in
    order of appearance); declined when two read each other's."""
    of = {n: k for k, members in enumerate(classes) for n in members}
    memo: dict[Value, frozenset[int]] = {}
    needs = [set().union(*(_depends(n.inputs[0], memo, of) for n in members)) - {k}
             for k, members in enumerate(classes)]
    order: list[int] = []
    while len(order) < len(classes):
        ready = [k for k in range(len(classes)) if k not in order and needs[k] <= set(order)]
        if not ready:
            raise Unsupported("reductions over different dims read each other's results")
        order.append(ready[0])
    return [classes[k] for k in order]


def _foreign_results(roots: list[Value], k: int, of: dict[Node, int],
                     written: dict[Value, str]) -> list[Value]:
    """Results of other classes' reductions that values ``roots`` of class ``k`` are
    computed from, short of what is already in memory (``written``)."""
    found: list[Value] = []
    seen: set[Value] = set()
    stack = list(roots)
    while stack:
        v = stack.pop()
        if v in seen or v in written:
            continue
        seen.add(v)
        node = v.producer
        if node is None:
            continue
        if node in of and of[node] != k:
            found.append(v)
        else:
            stack.extend(node.inputs)
    return found


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
    nests = plan_nests(group, registry, names)
    try:
        nests, body, teamed = _written(nests)
    except Unsupported as declined:  # the reduction's nest cannot hold every output
        after = _after_the_rows(group, registry, names)
        if after is None:
            raise
        try:
            nests, body, teamed = _written(after)
        except Unsupported:
            raise declined from None  # (the first plan's reason is the one to read)
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
    definitions = {name: text for w in nests for name, text in w.tables.items()}
    source = [*definitions.values(), *header, f"void {kernel}({', '.join(params)}) {{"]
    if not parallel:
        source.append("  (void)nthreads;")
    scratch = {name: v for w in nests for name, v in zip(w.out_names, w.outputs)
               if name.startswith("scratch_")}
    allocated = []
    for name, v in scratch.items():  # (no larger than a row result: one value per row)
        ctype, n = STORAGE[tensor_type(v).dtype], _numel_text(v, nests[0])
        allocated.append(stmt.Var(f"{ctype}* restrict", name,
                                  f"({ctype}*)malloc(({n}) * sizeof({ctype}) + 1)"))
    freed = [stmt.Raw(f"free({name});") for name in scratch]
    source += [*indented(render([*allocated, *body, *freed])), "}"]
    # the kernel's form as the core's schedule names it (the same for every target)
    metadata = {"kernel": kernel, "kind": nests[0].kind, "nests": len(nests),
                "schedule": Schedule.of(group).form,
                "rows": [nests[0].dims(w.loop.trips) for w in nests],
                "parallel": parallel, "sizes": list(names.values()),
                "inputs": [_describe(v, nests[0]) for v in region.inputs],
                "outputs": [_describe(v, nests[0]) for v in region.outputs],
                "inplace": [list(pair) for pair in inplace]}
    for i, name in ((i, n) for n, i in scalars.items()):
        metadata["inputs"][i]["size"] = name  # this int input is that size's value
    for i, order in orders.items():  # a stride is a size argument: copies are dense so
        metadata["inputs"][i]["order"] = order
    if not names:
        # the plan explain reports: each nest reads its inputs once from memory (a row's
        # later loops hit the cache), every output is written once; symbolic sizes have no
        # byte count before the call
        metadata.update({"grid": [sum(w.loop.trips for w in nests)],
                         "bytes_read": sum(_nbytes(v) for w in nests for v in w.loaded),
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
    if not order:
        return print_graph(region)
    renamed, _ = clone_graph(region)  # (a copy of its own: its types are renamed)
    for v in [*renamed.inputs, *(o for n in renamed.nodes for o in n.outputs)]:
        t = v.type
        if isinstance(t, TensorType):
            renamed.set_type(v, attrs.evolve(
                t, shape=tuple(symbols.rename_dim(d, order) for d in t.shape),
                strides=None if t.strides is None else tuple(
                    symbols.rename_dim(d, order) for d in t.strides)))
    return print_graph(renamed)


def _numel_text(v: Value, writer: KernelWriter) -> str:
    """C text of ``v``'s element count."""
    return " * ".join(f"({writer.ix.size(d)})" for d in tensor_type(v).shape) or "1"


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
