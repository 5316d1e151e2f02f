"""What may join a fusion group, as tables rather than branches on op names.

A plain node is *fusible* when its registry category is ``pointwise`` (``_to_copy`` only
when device and layout stay), ``reduction`` (with dims we can read), or it is one of the
views whose index mapping a codegen can express, or a gather (``GATHER_OPS``: an
embedding) where the groups' codegen reads tables at indices (``cpu``). Random, mutating,
layout and opaque ops
never join a group, nor does a node reading or making complex numbers (``COMPLEX``: no
native codegen renders them, so a group holding one would run on eager whole; left out,
its neighbours fuse: FNet's bias add before the cast to ``c64`` that feeds its FFT).
Two reductions may share a group only when they reduce the same
input shape over the same dims ("the same rows"), or when they reduce one shape both ways,
rows (the trailing dims, at most ``ROW_AND_COLUMN_LIMIT`` elements) and columns (the
leading dims): the layer-norm backward pattern, which one kernel computes from one read.
"""

from __future__ import annotations

from collections.abc import Iterable

from torchloom.api import FUSION_GROUP, GATHER_OPS, Node, TensorType

POINTWISE, REDUCTION, VIEW = "pointwise", "reduction", "view"

#: views whose index mapping is expressible inside a kernel; the flag says whether the
#: input must be contiguous (a reshape of strided data is not an index remap)
FUSIBLE_VIEWS: dict[str, bool] = {
    "aten.view.default": True, "aten.reshape.default": True, "aten._unsafe_view.default": True,
    "aten.permute.default": False, "aten.transpose.int": False, "aten.t.default": False,
    "aten.expand.default": False, "aten.squeeze.default": False, "aten.squeeze.dim": False,
    "aten.squeeze.dims": False, "aten.unsqueeze.default": False, "aten.slice.Tensor": False,
    "aten.select.int": False, "aten.alias.default": False, "aten.detach.default": False,
    # cheap splits of a group value (nvFuser moves chunk into the group)
    "aten.split.Tensor": False, "aten.split_with_sizes.default": False,
    "aten.chunk.default": False, "aten.unbind.int": False,
}

#: complex dtypes: a node with such an input or output never joins a group
COMPLEX = frozenset({"c32", "c64", "c128"})

#: the attribute holding a reduction's dims (absent or None: all dims)
_DIM_ATTRS = ("dim", "dims")


def node_kind(node: Node, registry, gathers: bool = False) -> str | None:
    """``pointwise``, ``reduction`` or ``view`` when ``node`` may join a group, else None;
    ``gathers``: the groups' codegen reads rows of a table at indices (``GATHER_OPS``),
    so an ``embedding`` joins as a pointwise op does."""
    if node.region is not None or not node.outputs:
        return None
    if not all(isinstance(v.type, TensorType) for v in node.outputs):
        return None
    tensors = [v.type for v in node.inputs if isinstance(v.type, TensorType)]
    if not tensors:
        return None  # factories (full, arange): nothing to fuse them with
    devices = {t.device for t in tensors} | {v.type.device for v in node.outputs}
    if len(devices) != 1:
        return None
    if any(t.dtype in COMPLEX for t in (*tensors, *(v.type for v in node.outputs))):
        return None
    if node.op in GATHER_OPS:  # (BERT's three lookups and their sum: one kernel)
        return POINTWISE if gathers and gather_fusible(node) else None
    category = registry.get(node.op).category
    if category == POINTWISE:
        if node.op == "aten._to_copy.default" and not _same_place_copy(node):
            return None
        if node.op == "aten.full_like.default" and not _plain_fill(node):
            return None
        return POINTWISE
    if category == REDUCTION:
        return REDUCTION if reduction_signature(node) is not None else None
    if category == VIEW and node.op in FUSIBLE_VIEWS:
        src = node.inputs[0].type if node.inputs else None
        if not isinstance(src, TensorType):
            return None
        if FUSIBLE_VIEWS[node.op] and src.strides is not None:
            return None
        return VIEW
    return None


def gather_fusible(node: Node) -> bool:
    """An ``embedding`` of a 2-D table of static nonzero sizes at int64/int32 indices, its
    output the indices' shape and the table's row (what a kernel reads as a gather; eager
    raises its own errors for an empty table)."""
    if len(node.inputs) < 2 or len(node.outputs) != 1:
        return False
    table, ids, out = node.inputs[0].type, node.inputs[1].type, node.outputs[0].type
    return (isinstance(table, TensorType) and isinstance(ids, TensorType)
            and len(table.shape) == 2 and all(isinstance(d, int) and d > 0 for d in table.shape)
            and ids.dtype in ("i64", "i32") and tuple(out.shape) == (*ids.shape, table.shape[1]))


def _same_place_copy(node: Node) -> bool:
    """A ``_to_copy`` that only changes dtype (no device, layout or pinning change)."""
    src, dst = node.inputs[0].type, node.outputs[0].type
    if src.device != dst.device:
        return False
    layout = node.attrs.get("layout")
    return layout is None or str(layout) == "torch.strided"


def _plain_fill(node: Node) -> bool:
    """A ``full_like`` of a number in its input's place and layout: a constant of the
    output's type, as a kernel writes it (a float fill of an integer tensor is left out)."""
    value, out = node.attrs.get("fill_value"), node.outputs[0].type
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and not out.dtype.startswith(("f", "bf")):
        return False
    layout = node.attrs.get("layout")
    return (node.attrs.get("device") is None and not node.attrs.get("pin_memory")
            and (layout is None or str(layout) == "torch.strided")
            and node.inputs[0].type.device == out.device)


def reduction_signature(node: Node) -> tuple | None:
    """``(input shape, reduced dims)`` of a reduction node, or None when unreadable."""
    if not node.inputs or not isinstance(node.inputs[0].type, TensorType):
        return None
    shape = node.inputs[0].type.shape
    rank = len(shape)
    dims = None
    for key in _DIM_ATTRS:
        if key in node.attrs:
            dims = node.attrs[key]
            break
    if dims is None or dims == ():
        reduced = tuple(range(rank))
    else:
        if isinstance(dims, int):
            dims = (dims,)
        try:
            reduced = tuple(sorted({(int(d) % rank) if rank else 0 for d in dims}))
        except (TypeError, ValueError):
            return None
    return (tuple(shape), reduced)


#: the longest row a row + column group may have (what one program holds in registers)
ROW_AND_COLUMN_LIMIT = 4096


def compatible(signatures: Iterable[tuple]) -> bool:
    """Reductions can share one kernel when they all reduce the same rows, or the rows
    and the columns of one shape (see the module docstring)."""
    found = set(signatures)
    if len(found) <= 1:
        return True
    if len(found) != 2:
        return False
    (shape, a), (other, b) = sorted(found, key=lambda sig: sig[1])
    if shape != other or not a or not b or sorted(a + b) != list(range(len(shape))):
        return False
    rows = b if b[-1] == len(shape) - 1 else a  # the trailing dims
    columns = a if rows is b else b
    row_length = 1
    for d in rows:
        row_length *= shape[d] if isinstance(shape[d], int) else ROW_AND_COLUMN_LIMIT + 1
    return columns[0] == 0 and row_length <= ROW_AND_COLUMN_LIMIT


def reads_column_result(parts: Iterable[Node], is_reduction) -> bool:
    """Whether merging ``parts`` (groups or plain nodes, in order) into a row + column
    group would have an op of it read a column reduction's result: the kernel finishes
    the columns only after every row, so nothing in it may read them."""
    columns: set = set()
    for part in parts:
        nodes = list(part.region.nodes) if is_group(part) else [part]
        for n in nodes:
            if any(v in columns for v in n.inputs):
                return True
            if is_reduction(n):
                sig = reduction_signature(n)
                if sig is not None and sig[1] and sig[1][0] == 0 and \
                        sig[1][-1] != len(sig[0]) - 1:
                    columns.update(n.outputs)
        if is_group(part):  # the group's outer results of column values
            columns.update(o for o, inner in zip(part.outputs, part.region.outputs)
                           if inner in columns)
    return False


def is_group(node: Node) -> bool:
    return node.op == FUSION_GROUP and node.region is not None


def numel(t) -> tuple[int, tuple[str, ...], int]:
    """The element count of ``t`` as a comparable key: (number of symbolic factors, the
    factors sorted, the static product). Static shapes compare by their count; f32[s0, s1]
    and f32[1, s1] differ (counting symbols as 1 made them equal, so horizontal fusion
    merged groups that no codegen can run as one loop)."""
    if not isinstance(t, TensorType):
        return (0, (), 1)
    n, symbols = 1, []
    for d in t.shape:
        if isinstance(d, int):
            n *= d
        else:
            symbols.extend(f.strip() for f in str(d).split("*"))
    return (len(symbols), tuple(sorted(symbols)), n)
