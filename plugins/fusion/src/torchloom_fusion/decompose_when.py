"""Where ``fusion.decompose`` decomposes a composite only where it pays: the tests of a
node's attributes and readers that :data:`ONLY_WHEN` maps each such op to."""

from __future__ import annotations

from collections.abc import Callable

from torchloom.api import Node, PassContext, TensorType, pad_fill

#: composites decomposed only where their attributes pass a test: a vector norm of order 0
#: (a count of nonzero values) or over every dim ran slower compiled than eager's own kernel
#: (2048 x 1024: order 0 2.0 against 1.7 ms, f64 2.5 against 1.4; every dim 0.40 against
#: 0.31, bf16 0.29 against 0.16), other orders over given dims 1.7-36x faster in f32/bf16/f64
ONLY_WHEN: dict[str, Callable[[Node, PassContext], bool]] = {
    "aten.linalg_vector_norm.default":
        lambda node, ctx: node.attrs.get("ord", 2) != 0 and bool(node.attrs.get("dim")),
    # where a pointwise op reads it (rotary embeddings); and where the cpu codegen compiles
    # the groups and nothing but the concatenation reads its pieces (a fused q/k/v
    # projection's gradients, which its GEMMs and its bias gradient's sum read): the kernel
    # making the pieces writes the concatenation, no cat call after it (the dynamic
    # transformer stack's pass 4-6 % faster). Triton (CPU groups in its interpreter) keeps
    # that cat, as on CUDA: as tiles beside the bias gradient's sum a group may carry outputs
    # of the pieces' shape (an LSTM's cell gradient), a form only cpu renders
    "aten.cat.default": lambda node, ctx: _cat_on_cpu_of_int_sizes(node) and (
        _read_pointwise(node.output, ctx.registry) or
        (ctx.codegen == "cpu" and _pieces_read_only_here(node) and
         not _reduced_along_rows(node, ctx.registry))),
    "aten.max_pool2d_with_indices.default": lambda node, ctx: _pooled_channels_last(node),
    "aten.roll.default": lambda node, ctx: _rolled_on_cpu(node),
    "aten.constant_pad_nd.default": lambda node, ctx: _padded_on_cpu(node),
}


def _cpu_tensor(value) -> TensorType | None:
    t = value.type
    return t if isinstance(t, TensorType) and t.device == "cpu" and t.rank > 0 else None


def _rolled_on_cpu(node: Node) -> bool:
    """A ``roll`` of a CPU tensor along given dims (not flattened) of int sizes by int
    shifts: what its CPU decomposition takes (otherwise torch's would gather)."""
    t, shifts, dims = _cpu_tensor(node.inputs[0]), node.attrs.get("shifts"), node.attrs.get("dims")
    if t is None or not isinstance(shifts, (list, tuple)) or \
            not isinstance(dims, (list, tuple)) or not dims or len(shifts) != len(dims):
        return False
    return all(isinstance(s, int) for s in shifts) and all(
        isinstance(d, int) and -t.rank <= d < t.rank and isinstance(t.shape[d], int) and
        t.shape[d] > 0 for d in dims)


def _padded_on_cpu(node: Node) -> bool:
    """A ``constant_pad_nd`` of a CPU tensor by int pads along dims of int sizes, none left
    empty, its value one the dtype holds: what its CPU decomposition takes (otherwise
    torch's fills a new tensor, or eager's op raises)."""
    t, pad = _cpu_tensor(node.inputs[0]), node.attrs.get("pad")
    if t is None or not isinstance(pad, (list, tuple)) or len(pad) % 2 or \
            len(pad) // 2 > t.rank or not all(isinstance(p, int) for p in pad):
        return False
    if any(p > 0 for p in pad) and \
            pad_fill(node.attrs.get("value", 0), t.torch_dtype) is None:
        return False  # (eager's op raises: a value the dtype cannot hold)
    sizes = [t.shape[t.rank - 1 - i] for i in range(len(pad) // 2)]
    return all(isinstance(n, int) and n + min(pad[2 * i], 0) + min(pad[2 * i + 1], 0) > 0
               for i, n in enumerate(sizes))


#: the most window elements a decomposed max pool reads (each one a load, a comparison and
#: two selects per output element, unrolled)
POOL_WINDOW = 25


def _pooled_channels_last(node: Node) -> bool:
    """A max pool of a static channels-last CPU tensor (more than one channel) of at most
    :data:`POOL_WINDOW` elements a window, its indices unread (inference). Its kernel then
    runs along the channels, a SIMD loop reading each window element at a shifted offset,
    and computes the input's own op there: ResNet's stem, batch norm + ReLU + 3 x 3 pool
    over ``[2, 32, 112, 112]``, 0.31 ms a call against 0.14 (the norm's kernel) + 0.37
    (eager's pool); Inductor's kernel 0.24. A contiguous NCHW input would step two elements
    a lane along W (a 4.4 ms kernel: eager's, or the cpu codegen's channels-last pool, is
    faster), and with the indices read (a training step) the kernels of that model's step
    took 5.1 ms against 4.8 with eager's pool."""
    x, indices = node.inputs[0].type, node.outputs[1]
    if indices.uses or indices in node.graph.outputs or not isinstance(x, TensorType) or \
            x.device != "cpu" or x.rank != 4 or not x.is_static or x.shape[1] < 2:
        return False
    kernel = node.attrs.get("kernel_size", [])
    kernel = list(kernel) * 2 if len(kernel) == 1 else list(kernel)
    dilation = node.attrs.get("dilation", [1])
    n, c, h, w = x.shape
    channels_last = (h * w * c, 1, w * c, c)
    return len(kernel) == 2 and kernel[0] * kernel[1] <= POOL_WINDOW and \
        all(d == 1 for d in dilation) and x.torch_dtype.is_floating_point and \
        tuple(x.actual_strides()) == channels_last


def _read_pointwise(value, registry) -> bool:
    """Every reader of ``value`` is a pointwise op; no graph output."""
    graph = value.graph
    return value not in graph.outputs and bool(value.uses) and all(
        (opdef := registry.lookup(user.op)) is not None and opdef.category == "pointwise"
        for user in value.users())


#: composites that reduce rows along their input's innermost dim (decomposed: reductions,
#: each pass over a row reading it again); None: always, else the attribute naming the dims
_ROW_COMPOSITES = {
    "aten.native_layer_norm.default": None, "aten.layer_norm.default": None,
    "aten._softmax.default": "dim", "aten.softmax.int": "dim",
    "aten._log_softmax.default": "dim", "aten.log_softmax.int": "dim",
    "aten.logsumexp.default": "dim", "aten.linalg_vector_norm.default": "dim"}


def _reduced_along_rows(node: Node, registry) -> bool:
    """Whether the concatenation ``node`` is along its innermost dim and a reduction over
    that dim (or a composite of such: a layer norm, a softmax) reads it, directly or
    through views that keep that dim. Decomposed there, the concatenation is a chain of
    selects, every piece computed for each element in each of the reduction's passes over
    a row: Swin's patch merging (four strided pieces, then a layer norm) ran 1.1 ms against
    0.2 for Inductor's kernel, which writes the pieces once. (A sum over other dims, a
    bias gradient's, makes one pass: there the decomposition pays.)"""
    t = node.output.type
    if not isinstance(t, TensorType) or t.rank == 0 or \
            node.attrs.get("dim", 0) % t.rank != t.rank - 1:
        return False
    seen, todo = set(), [node.output]
    while todo:
        v = todo.pop()
        for user in v.users():
            if id(user) in seen:
                continue
            seen.add(id(user))
            rank = len(v.type.shape)
            opdef = registry.lookup(user.op)
            category = opdef.category if opdef is not None else None
            if user.op in _ROW_COMPOSITES or category == "reduction":
                attr = _ROW_COMPOSITES.get(user.op, "dim")
                dims = _node_dims(user.attrs.get("dims", user.attrs.get(attr))) \
                    if attr is not None else None
                if attr is None or dims is None or (rank - 1) in {d % rank for d in dims}:
                    return True
            elif category == "view" and all(isinstance(o.type, TensorType) and
                                            o.type.rank and o.type.shape[-1] == v.type.shape[-1]
                                            for o in user.outputs):
                todo.extend(user.outputs)
    return False


def _node_dims(dims) -> list[int] | None:
    """A reduction's ``dim`` attribute as a list (None or empty: every dim)."""
    if dims is None or dims == [] or dims == ():
        return None
    return [dims] if isinstance(dims, int) else [d for d in dims if isinstance(d, int)]


def _pieces_read_only_here(node: Node) -> bool:
    """Every piece of the concatenation ``node`` is read by it alone (once), made by a
    node of the graph (no graph input) and is no graph output."""
    graph = node.graph
    return all(v.producer is not None and v not in graph.outputs and v.uses == [node]
               for v in node.inputs)


def _cat_on_cpu_of_int_sizes(node: Node) -> bool:
    """A ``cat`` of CPU tensors of one rank, of static sizes along the dim and none empty
    there (what its CPU decomposition takes; others are not traced, and get no note: their
    views would need size expressions). Other dims may be symbols (a model's sequence
    length: rotary embeddings' ``rotate_half`` concatenates two halves of the head dim)."""
    types = [v.type for v in node.inputs]
    if len(types) < 2 or not all(isinstance(t, TensorType) and t.device == "cpu" and
                                 None not in t.shape for t in types):
        return False  # (one piece: a copy, which the decomposition leaves to cat)
    rank = len(types[0].shape)
    if rank == 0 or any(len(t.shape) != rank for t in types):
        return False
    dim = node.attrs.get("dim", 0)
    return isinstance(dim, int) and all(
        isinstance(t.shape[dim % rank], int) and t.shape[dim % rank] > 0 for t in types)
