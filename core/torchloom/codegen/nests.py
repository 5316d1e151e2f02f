"""The loop nests of a group's kernel, planned once as frozen data (the kernel schedule's
nest plan; see DESIGN.md, "Codegen and runtime"): which nests a kernel runs one after
the other, which outputs each stores, which reductions it computes and which values it
reads back from memory that an earlier nest stored.

Reductions of a group that reduce different dims (layer_norm's backward: row sums for the
input gradient, column sums for the weight and bias gradients) cannot share one loop. They
are consecutive nests of one kernel, one per (input shape, reduced dims) class, each
storing the outputs that depend on its reductions; outputs depending on no reduction go
with the first nest. A pointwise group whose outputs have different element counts is a
nest per count, and outputs of one count but another shape or layout that share no
computed value are a nest per walk (each in its own order: no division per element to
address them). Pointwise values both nests need are recomputed (cheap next to a round
trip through memory). A reduction whose input depends on another class's result, or an
output depending on two classes, comes in a later nest (classes ordered so that producers
come first; two classes reading each other's results are declined), which reads what
earlier nests computed from memory: an output they store (a cross-entropy gradient, and
the bias gradient summed from it over the batch: rounded to the output's dtype, as eager
reads it), else the reduction results it needs, which their nest stores in a scratch
array (``scratch_<value>``) of one value per row (a layer_norm backward that recomputes
its statistics: the weight gradient's column sums read the mean and variance per row).

A target says what it reduces (``is_reduction``), how it reads a value's type (its own
``tensor_type``, raising its own reason for a tensor it cannot hold) and whether a column
class rides in the row nest (``fold``: cpu's ``rows_and_columns.foldable``)::

    plan(region, is_reduction, tensor_type)      -> (Nest(outputs=None, reductions=None),)
        a group of one nest: every output, every reduction
    plan(...) of a layer_norm backward           -> (Nest(row outputs, row sums),
                                                     Nest(column outputs, column sums,
                                                          read_back=...))

and a writer writes the plan with :func:`write_plan`, which tries :func:`after_the_rows`'
plan where the writer declines the first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional

import attrs

from torchloom.codegen import indexing
from torchloom.codegen.schedule import RowsAndColumns, nest_classes
from torchloom.codegen.writer import VIEWS, output_names, reduced_dims, upstream_nodes
from torchloom.ir import Graph, Node, TensorType, Value

Named = tuple[tuple[str, Value], ...]
#: (row class, column class) of a row nest carrying column sums, or None
Fold = Callable[[list, list, Callable[[Value], frozenset]], Optional[tuple[int, int]]]


@attrs.frozen
class Nest:
    """One nest: the ``outputs`` it stores (pointer name, value; None: every output of the
    region), the ``reductions`` it computes (empty: a pointwise walk; None: every reduction
    of the region), the values earlier nests stored that it reads back (``read_back``:
    value, pointer name) and the column sums it carries (``columns``: pointer name, sum).
    """

    outputs: Optional[Named] = None
    reductions: Optional[tuple[Node, ...]] = None
    read_back: tuple[tuple[Value, str], ...] = ()
    columns: tuple[tuple[str, Node], ...] = ()

    def stored(self, region: Graph) -> list[tuple[str, Value]]:
        """(pointer name, value) of each value the nest stores: ``outputs``, or every
        output of the region under its kernel parameter (``output_names``)."""
        if self.outputs is not None:
            return list(self.outputs)
        return list(zip(output_names(region), region.outputs))

    def computed(self, region: Graph, is_reduction: Callable[[Node], bool]) -> list[Node]:
        """The reductions the nest computes, in the region's order (``reductions``, or
        every reduction of the region)."""
        members = set(region.nodes if self.reductions is None else self.reductions)
        return [n for n in region.nodes if n in members and is_reduction(n)]


#: the column reduction a row nest carries
_SUM = "aten.sum.dim_IntList"


def carried_columns(classes: list, parts: list, depends: Callable[[Value], frozenset],
                    shape_of: Callable[[Value], Any], accept: Callable[[RowsAndColumns], bool],
                    fits: Callable[[Node], bool]) -> Optional[tuple[int, int]]:
    """A :data:`Fold`: (row class, column class) where the column class's sums ride in the
    row nest (the row + column form, :class:`~torchloom.codegen.schedule.RowsAndColumns`),
    else None. They ride where the target accepts the plan (``accept``), every column
    reduction is a plain sum (no dtype argument) of one result nothing in the group reads
    and that the target ``fits``, the column class's outputs are its sums, and nothing the
    rows compute or store reads them. ``parts``: each class's outputs; ``depends(v)``: the
    classes value ``v`` depends on."""
    plan = RowsAndColumns.of([n for members in classes for n in members], shape_of)
    if plan is None or not accept(plan):
        return None
    row = next(k for k, members in enumerate(classes) if members[0] in plan.rows)
    col = 1 - row
    for node in plan.columns:  # (a sum has one output; another reduction may have two)
        if node.op != _SUM or "dtype" in node.attrs or node.outputs[0].users() or \
                not fits(node):
            return None
    if sorted(v.name for _, v in parts[col]) != sorted(n.outputs[0].name for n in plan.columns):
        return None
    if any(col in depends(v) for _, v in parts[row]) or \
            any(col in depends(n.inputs[0]) for n in plan.rows):
        return None  # (the rows read the columns' results)
    return row, col


def scratch_name(v: Value) -> str:
    """The pointer name of the scratch array a nest stores ``v`` (a row result) in."""
    return f"scratch_{v.name}"


def is_scratch(name: str) -> bool:
    """Whether a nest's output pointer ``name`` is a scratch array (:func:`scratch_name`):
    the kernel allocates it, one value per row, and frees it."""
    return name.startswith("scratch_")


def _nest(outputs, reductions, read_back: dict | None = None, columns=()) -> Nest:
    return Nest(tuple(outputs), tuple(reductions), tuple((read_back or {}).items()),
                tuple(columns))


def plan(region: Graph, is_reduction: Callable[[Node], bool],
         tensor_type: Callable[[Value], TensorType], fold: Fold | None = None,
         named: Sequence[tuple[str, Value]] | None = None) -> tuple[Nest, ...]:
    """The nests of ``region``'s kernel (see the module docstring); ``named``: the
    (pointer name, value) pairs to store, when not every output (:func:`after_the_rows`)."""
    reductions = [n for n in region.nodes if is_reduction(n)]
    named = list(zip(output_names(region), region.outputs)) if named is None else list(named)
    classes = nest_classes(reductions, lambda v: tensor_type(v).shape)
    if not classes:  # pointwise: a nest per element count of the outputs
        parts = [walk for part in _by_element_count(named, tensor_type)
                 for walk in _by_walk(part, tensor_type)]
        if len(parts) == 1:
            return (Nest(),)
        return tuple(_nest(part, ()) for part in parts)
    if len(classes) == 1:
        apart = _beside_the_rows(named, classes[0], tensor_type)
        if not apart:
            return (Nest(),)
        rest = [(name, v) for name, v in named if (name, v) not in apart]
        nests = [_nest(walk, ()) for part in _by_element_count(apart, tensor_type)
                 for walk in _by_walk(part, tensor_type)]
        # the reduction's nest reads those outputs back where it needs them
        return (*nests, _nest(rest, classes[0], {v: name for name, v in apart}))
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
    folded = None if fold is None else fold(
        classes, [[o for o in part if o not in free] for part in parts],
        lambda v: _depends(v, memo, of))
    if folded is not None:  # column sums carried by the row nest
        row, col = folded
        columns = [(name, v.producer) for name, v in parts[col] if (name, v) not in free]
        rest = [o for o in parts[row] if o not in free] + free
        return (_nest(rest, classes[row], columns=columns),)
    # A nest reads what earlier nests computed from memory, never recomputing it: an
    # output they store, else a scratch array their nest stores the result in
    written: dict[Value, str] = {}
    stored: list[dict[Value, str]] = []
    for k, members in enumerate(classes):
        roots = [n.inputs[0] for n in members] + [v for _, v in parts[k]]
        for v in _foreign_results(roots, k, of, written):
            written[v] = scratch_name(v)
            parts[of[v.producer]].append((written[v], v))
        # (what depends on no other class is computed again, as before: no extra read)
        stored.append({v: name for v, name in written.items()
                       if _depends(v, memo, of) - {k}})
        written.update((v, name) for name, v in parts[k])
    return tuple(_nest(part, members, stored[k])
                 for k, (part, members) in enumerate(zip(parts, classes)) if part)


def after_the_rows(region: Graph, is_reduction: Callable[[Node], bool],
                   tensor_type: Callable[[Value], TensorType], fold: Fold | None = None
                   ) -> tuple[Nest, ...] | None:
    """The plan of a group of one reduction class whose outputs its nest cannot hold (an
    output of another element count than the reduced shape's and the rows', a value that
    reads a reduction result at other elements than its row: Llama's backward sums the
    gradient over the repeated key/value heads and slices half of each head for the
    rotary embedding; Whisper's reads a row result through a transposing reshape), or
    None when it has no such form: the reduction's nest stores the reduction results
    (outputs, else scratch arrays of one value per row) and pointwise nests after it write
    every other output, reading those results back at whatever elements they need.
    Several classes: :func:`_after_the_nests`."""
    classes = nest_classes([n for n in region.nodes if is_reduction(n)],
                           lambda v: tensor_type(v).shape)
    if len(classes) > 1:
        return _after_the_nests(region, classes, is_reduction, tensor_type, fold)
    if len(classes) != 1:
        return None
    members = set(classes[0])
    named = list(zip(output_names(region), region.outputs))
    own = [(name, v) for name, v in named if v.producer in members]
    rest = [(name, v) for name, v in named if v.producer not in members]
    written = {v: name for name, v in own}
    scratch = []
    for v in _foreign_results([v for _, v in rest], -1, dict.fromkeys(members, 0), written):
        written[v] = scratch_name(v)
        scratch.append((written[v], v))
    if not rest or not own + scratch:
        return None
    return (_nest(own + scratch, classes[0]), *_pointwise_after(rest, written, tensor_type))


def write_plan(region: Graph, is_reduction: Callable[[Node], bool],
               tensor_type: Callable[[Value], TensorType], fold: Fold | None,
               write: Callable[[tuple[Nest, ...]], Any]) -> Any:
    """``write(nests)`` of the group's plan (:func:`plan`); where the writer declines it
    (:class:`~torchloom.codegen.indexing.Unsupported`: the reduction's nest cannot hold
    every output), of :func:`after_the_rows`' plan, when there is one. Where both are
    declined, the first plan's reason is the one raised (the one to read)."""
    first = plan(region, is_reduction, tensor_type, fold)
    try:
        return write(first)
    except indexing.Unsupported as declined:
        after = after_the_rows(region, is_reduction, tensor_type, fold)
        if after is None:
            raise
        try:
            return write(after)
        except indexing.Unsupported:
            raise declined from None


def _after_the_nests(region: Graph, classes: list, is_reduction, tensor_type,
                     fold: Fold | None) -> tuple[Nest, ...] | None:
    """:func:`after_the_rows` for several reduction classes: the outputs of an element
    count no class's nest holds (neither its reduced shape's nor a row's: Mixtral's
    RMSNorm gradient ``[16, 32]`` repeated for two experts, ``[16, 2, 32]``, beside the
    weight gradient's column sums), else every output no reduction computes (one reads a
    row result at other rows), are written by pointwise nests after :func:`plan`'s,
    reading back the outputs those store, and the reduction results they need from
    scratch arrays their class's nest stores; None where that leaves no nest to a side."""
    named = list(zip(output_names(region), region.outputs))
    counts = []
    for members in classes:
        shape = tensor_type(members[0].inputs[0]).shape
        rdims = reduced_dims(members[0], len(shape))
        kept = [d for k, d in enumerate(shape) if k not in rdims]
        counts += [indexing.prod(shape), indexing.prod(kept)]
    odd = [(name, v) for name, v in named
           if not any(indexing.same(indexing.prod(tensor_type(v).shape), c) for c in counts)]
    if not odd:  # a row result read at other rows (Swin's window partition of the input
        # gradient, Gemma3's heads transposed): what no reduction computes goes after
        odd = [(name, v) for name, v in named
               if v.producer is None or not is_reduction(v.producer)]
    if not odd or len(odd) == len(named):
        return None
    rest = [(name, v) for name, v in named if (name, v) not in odd]
    written = {v: name for name, v in rest}
    of = {n: k for k, members in enumerate(classes) for n in members}
    for v in _foreign_results([v for _, v in odd], -1, of, written):
        written[v] = scratch_name(v)
        rest.append((written[v], v))
    planned = plan(region, is_reduction, tensor_type, fold, named=rest)
    return (*planned, *_pointwise_after(odd, written, tensor_type))


def _pointwise_after(named: list[tuple[str, Value]], written: dict[Value, str], tensor_type
                     ) -> tuple[Nest, ...]:
    """Pointwise nests writing ``named`` (a nest per element count and walk), reading
    back what earlier nests stored (``written``)."""
    return tuple(_nest(walk, (), dict(written)) for part in _by_element_count(named, tensor_type)
                 for walk in _by_walk(part, tensor_type))


def _depends(v: Value, memo: dict[Value, frozenset[int]], of: dict[Node, int]
             ) -> frozenset[int]:
    """The reduction classes ``v`` depends on (inside the region)."""
    found = memo.get(v)
    if found is not None:
        return found
    node = v.producer
    result: frozenset[int] = frozenset()
    if node is not None:
        if node in of:
            result = frozenset({of[node]})
        for i in node.inputs:
            result |= _depends(i, memo, of)
    memo[v] = result
    return result


def _by_element_count(named: Sequence[tuple[str, Value]], tensor_type
                      ) -> list[list[tuple[str, Value]]]:
    """Outputs grouped by element count (equal at every size), the largest count first
    where all are static, else in order of appearance: a pointwise walk covers the
    elements of one count (a group that also returns a broadcast operand, say [2, 1]
    beside [2, 8], is written as a nest per count). Largest first: an input is read by
    nests of its count or larger only, so every nest reading it has run before the nest
    that may write its output over it (cpu's ``inplace.py``: an optimizer step's ``f32[]``
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


def _computed(v: Value) -> set[Node]:
    """The region nodes ``v`` is computed from, views (index math, free) left out."""
    return {n for n in upstream_nodes([v]) if n.op not in VIEWS}


def _by_walk(part: list[tuple[str, Value]], tensor_type) -> list[list[tuple[str, Value]]]:
    """Outputs of one element count split by walk (shape and memory order) where they
    share no computed value: a walk follows its first output, and an output of another
    shape or layout is addressed by delinearising the walk's index, a division per element
    when sizes are runtime arguments (q, k transposed and v copied to contiguous by one
    group: k's copy is its own nest, in its own order). Outputs sharing a computed (not
    view) node stay in one walk: splitting them would compute it twice."""
    keys = [(tuple(tensor_type(v).shape), indexing.memory_order(tensor_type(v)))
            for _, v in part]
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


def _beside_the_rows(named: list[tuple[str, Value]], members: list[Node], tensor_type
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
            if not upstream_nodes([v]) & reductions
            and not any(indexing.same(indexing.prod(tensor_type(v).shape), n)
                        for n in (numel, rows))]


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
            raise indexing.Unsupported("reductions over different dims read each other's "
                                       "results")
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


__all__ = ["Nest", "after_the_rows", "plan"]
