"""``fusion.decompose``: rewrite composite ops into primitives a codegen can fuse."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import attrs
import torch

from torchloom.api import (Graph, Node, PassContext, PassResult, Pass, ScalarType,
                           TensorType, attrs_key, decomposition_table, eager_rejects, import_fx,
                           mark_decomposition, symbols, unmarked_attrs)

#: composites traced through torch's own decomposition table. Not ``gelu_backward``: it is
#: pointwise, so it fuses as one op exactly as its primitives would, and the native codegens
#: compile it with GELU's own erf and exp (eager's kernel is of that kind too); as
#: primitives its erf was the exact one, 0.6 ms of 2M elements more on the CPU.
DECOMPOSED_OPS: tuple[str, ...] = (
    "aten.native_layer_norm.default", "aten.native_layer_norm_backward.default",
    "aten._softmax.default", "aten._log_softmax.default",
    "aten._softmax_backward_data.default", "aten._log_softmax_backward_data.default",
    "aten.native_batch_norm.default", "aten._native_batch_norm_legit_no_training.default",
    "aten.native_batch_norm_backward.default",
    "aten.silu_backward.default", "aten.layer_norm.default", "aten.softmax.int",
    "aten.log_softmax.int", "aten.linear.default", "aten.logsumexp.default",
    "aten.linalg_vector_norm.default",
    # SDPA's math path (training on the CPU): softmax, rows of -inf made 0 (eager runs
    # softmax, eq, all, isneginf and where as five kernels)
    "aten._safe_softmax.default",
    # gradients eager writes into a tensor of zeros (a factory outside every kernel): a
    # slice's (rotary embeddings) and cross entropy's (on the CPU:
    # torchloom.frontend.decompositions)
    "aten.slice_backward.default", "aten.nll_loss_backward.default",
    # rotary embeddings' rotate_half: the concatenation computed by the kernel reading it
    # (on the CPU: torchloom.frontend.decompositions)
    "aten.cat.default",
    # max pooling on the CPU: each window element read through a padded, strided view, so
    # the kernel making the input (a batch norm's, a ReLU's) computes the maximum
    # (torchloom.frontend.decompositions; where _pooled_channels_last says)
    "aten.max_pool2d_with_indices.default",
)

#: composites decomposed only where their attributes pass a test: a vector norm of order 0
#: (a count of nonzero values) or over every dim ran slower compiled than eager's own kernel
#: (2048 x 1024: order 0 2.0 against 1.7 ms, f64 2.5 against 1.4; every dim 0.40 against
#: 0.31, bf16 0.29 against 0.16), other orders over given dims 1.7-36x faster in f32/bf16/f64
_ONLY_WHEN: dict[str, Callable[[Node, PassContext], bool]] = {
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
        (ctx.codegen == "cpu" and _pieces_read_only_here(node))),
    "aten.max_pool2d_with_indices.default": lambda node, ctx: _pooled_channels_last(node),
}

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


def _always(node: Node, ctx: PassContext) -> bool:
    return True


#: composites that the decompositions above call in turn; traced through as well
_NESTED: tuple[str, ...] = (
    "aten._native_batch_norm_legit.default", "aten._native_batch_norm_legit_functional.default",
    "aten._native_batch_norm_legit.no_stats",
    "aten._softmax.default",  # (_safe_softmax's)
)

_ADDMM = "aten.addmm.default"


@attrs.frozen
class Decompose(Pass):
    """Replace composites (layer_norm, softmax, log_softmax, eval batch_norm and their
    backward ops, logsumexp, vector norms over given dims, the gradients of a slice and of
    nll_loss, ``cat`` on the CPU with int sizes along its dim) by the primitives of torch's
    decomposition table (with eager's CPU arithmetic
    and no tensor of zeros on the CPU: ``torchloom.frontend.decompositions``), traced with
    ``make_fx`` on fake tensors (a factory's device set to the graph's); split ``addmm`` into
    ``mm`` + ``add`` so the bias add joins the following pointwise group (nvFuser's
    decomposeLinear) -- only when a pointwise op or a reduction reads the result, directly
    or through views.

    before::

        %y = aten._softmax.default(%x) {dim = -1, half_to_float = false} : f32[4, 8]

    after::

        %amax = aten.amax.default(%x) {dim = [-1], keepdim = true} : f32[4, 1]
        %sub = aten.sub.Tensor(%x, %amax) : f32[4, 8]
        %exp = aten.exp.default(%sub) : f32[4, 8]
        %sum = aten.sum.dim_IntList(%exp) {dim = [-1], keepdim = true} : f32[4, 1]
        %rcp = aten.reciprocal.default(%sum) : f32[4, 1]
        %y = aten.mul.Tensor(%exp, %rcp) : f32[4, 8]

    On the CPU, softmax over the last dim multiplies by the sum's reciprocal, as eager's
    kernel does (torch's decomposition divides, as CUDA's kernel does; kept elsewhere).

    ``ops`` lists what to decompose (default: :data:`DECOMPOSED_OPS`); ``linear`` turns
    the addmm split on or off. An op whose decomposition cannot be traced is left as is.

    At symbolic sizes (dims that are bare symbols; strides as the types give them, their
    expressions over those symbols) the decomposition is traced
    on fake tensors whose sizes are symbols of a fresh shape environment, one per IR symbol
    (no duck sizing), and its types renamed back to the IR's symbols. It is used only when
    the trace recorded no guard and specialized no symbol (so it is valid at every size
    the graph runs at) and calls no Python function on sizes; else the composite stays,
    with the reason in ``explain``'s notes. As Dynamo's, the symbols are assumed >= 2
    (torch compiles sizes 0 and 1 as graphs of their own); the decompositions used here
    are also checked at sizes 0 and 1 in the tests.

    The primitives of each composite are marked as one instance (``decomposed = [...]``,
    and ``composite = [...]`` on the first; :mod:`torchloom.ir.provenance`): where they all
    end up running op by op (the ``eager`` codegen), the runtime runs the composite again,
    so a graph that is not compiled natively never runs slower than eager.
    """

    name: ClassVar[str] = "fusion.decompose"
    ops: tuple[str, ...] = attrs.field(default=DECOMPOSED_OPS, converter=tuple)
    linear: bool = True

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        wanted = set(self.ops)
        # per compilation: (op, types, attrs) -> primitives; shared by the main graph and
        # each shared subgraph, so repeated layers trace each composite once
        traced: dict[Any, Graph | None] = ctx.memo.setdefault("fusion.decompose.traced", {})
        done = addmm = 0
        graph_outputs = set(graph.outputs)
        for node in list(graph.nodes):
            if node.op in wanted and _ONLY_WHEN.get(node.op, _always)(node, ctx):
                sub = self._trace(node, ctx, traced)
                if sub is not None and _fits(sub, node, graph_outputs):
                    _splice(graph, node, sub)
                    done += 1
            elif node.op == _ADDMM and self.linear and _plain_addmm(node) and \
                    _feeds_fusible(node.output, ctx.registry):
                _split_addmm(graph, node)
                addmm += 1
        return PassResult(done + addmm > 0, {"decomposed": done, "addmm_split": addmm})

    def _trace(self, node: Node, ctx: PassContext, traced: dict) -> Graph | None:
        try:
            key = (node.op, tuple(v.type for v in node.inputs), attrs_key(node.attrs))
        except TypeError:
            key = None
        if key is not None and key in traced:
            return traced[key]
        rejected = eager_rejects(ctx.registry.get(node.op), node)
        sub = None if rejected else _trace_decomposition(node, ctx.registry)
        if rejected:  # its primitives might take these dtypes: eager must run it and raise
            ctx.note(f"fusion.decompose: eager rejects {node.op} here ({rejected}); left as is")
        elif sub is None and not all(isinstance(v.type, TensorType) and v.type.is_static
                                     for v in node.inputs):
            ctx.note(f"fusion.decompose: {node.op} at symbolic sizes: its decomposition needs "
                     f"size expressions, symbolic strides, or a guard on a size (not valid at "
                     f"every size); left as is")
        elif sub is None:
            ctx.note(f"fusion.decompose: could not trace {node.op}; left as is")
        if key is not None:
            traced[key] = sub
        return sub


def _trace_decomposition(node: Node, registry) -> Graph | None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    opdef = registry.get(node.op)
    if opdef.fn is None or opdef.schema is None:
        return None
    if not all(isinstance(v.type, TensorType) for v in node.inputs):
        return None
    target = _overload(node.op)
    if target is None:
        return None
    device = next((v.type.device for v in node.inputs if isinstance(v.type, TensorType)), None)
    table = decomposition_table([o for o in map(_overload, (node.op, *_NESTED)) if o is not None],
                                device)
    if target not in table:
        return None
    if all(v.type.is_static for v in node.inputs):
        # a fresh fake mode: static shapes even when called while torch traces a backward
        fake_mode, names = FakeTensorMode(), None
        with fake_mode:
            examples = [torch.empty_strided(v.type.shape, v.type.actual_strides(),
                                            dtype=v.type.torch_dtype, device="meta")
                        for v in node.inputs]
    else:
        made = _symbolic_examples(node)
        if made is None:
            return None
        fake_mode, examples, names = made

    def call(*tensors):
        args, kwargs = opdef.bind(list(tensors), node.attrs)
        return target(*args, **kwargs)

    try:
        with fake_mode:
            gm = make_fx(call, decomposition_table=table, tracing_mode="real")(*examples)
        imported = import_fx(gm, examples, name="decomposed")
    except Exception as exc:  # an op torch cannot decompose here: keep the composite
        return None
    if imported.constants or imported.callables or (imported.symbolic and names is None):
        return None
    if names is not None:
        shape_env = fake_mode.shape_env
        if shape_env.guards or shape_env.replacements or not _renamed(imported.graph, names):
            return None  # valid only for some sizes, or sizes beyond the IR's symbols
    sub = imported.graph
    if any(n.op == node.op for n in sub.nodes) or len(sub.outputs) != len(node.outputs):
        return None
    if node.op in _SOFTMAX and _over_last_dim_on_cpu(node):
        _normalize_by_reciprocal(sub)
    return sub


#: softmax over the last dim on the CPU: eager's kernel (``_vec_softmax_lastdim``, every
#: dtype, in f32 for bf16 and f16) multiplies by ``1 / sum`` where torch's decomposition
#: divides by ``sum``
_SOFTMAX = ("aten._softmax.default", "aten.softmax.int")


def _over_last_dim_on_cpu(node: Node) -> bool:
    """(CUDA's softmax divides, as the decomposition does.)"""
    t = node.inputs[0].type
    dim = node.attrs.get("dim")
    return isinstance(t, TensorType) and t.device == "cpu" and isinstance(dim, int) and \
        len(t.shape) > 0 and dim % len(t.shape) == len(t.shape) - 1


def _normalize_by_reciprocal(sub: Graph) -> None:
    """``div(exp, sum(exp))`` -> ``mul(exp, reciprocal(sum(exp)))``, as eager computes
    softmax on the CPU (one division per row instead of one per element; the codegens
    compute the reciprocal once per row)."""
    for n in list(sub.nodes):
        if n.op != "aten.div.Tensor" or n.attrs:
            continue
        num, den = n.inputs
        if den.producer is None or den.producer.op != "aten.sum.dim_IntList" or \
                den.producer.inputs[0] is not num:
            continue
        rcp = sub.create("aten.reciprocal.default", [den], [den.type], names=["rcp"],
                         before=n)
        mul = sub.create("aten.mul.Tensor", [num, rcp.output], [n.output.type],
                         names=[n.output.name], before=n)
        sub.replace_all_uses(n.output, mul.output)
        sub.erase(n)


def _symbolic_examples(node: Node):
    """(fake mode, fake meta tensors of ``node``'s inputs with symbolic sizes and their
    strides, torch's symbol name -> the IR's); None when a dim is a size expression or a
    stride names a symbol no size is."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    dims = [d for v in node.inputs for d in v.type.shape]
    if any(isinstance(d, str) and not symbols.is_symbol(d) for d in dims) or None in dims:
        return None
    named = {d for d in dims if isinstance(d, str)}
    if any(st is None or not set(symbols.symbols_of(st)) <= named
           for v in node.inputs for st in v.type.strides or ()):
        return None
    shape_env = ShapeEnv(duck_shape=False)
    fake_mode = FakeTensorMode(shape_env=shape_env)
    sizes: dict[str, Any] = {}
    for k, d in enumerate(dict.fromkeys(d for d in dims if isinstance(d, str))):
        hint = 1009 + 16 * k  # > every static dim here, distinct: no size coincides
        sizes[d] = shape_env.create_symintnode(
            shape_env.create_symbol(hint, ConstantSource(f"torchloom_{k}")), hint=hint)
    try:
        strides = [None if v.type.strides is None else
                   [symbols.evaluate(st, sizes) for st in v.type.strides] for v in node.inputs]
    except (symbols.SymbolicDimError, ArithmeticError, TypeError):
        return None  # (a stride that is no integer expression of the sizes)
    with fake_mode:
        examples = [torch.empty([sizes.get(d, d) for d in v.type.shape],
                                dtype=v.type.torch_dtype, device="meta")
                    if st is None else
                    torch.empty_strided([sizes.get(d, d) for d in v.type.shape], st,
                                        dtype=v.type.torch_dtype, device="meta")
                    for v, st in zip(node.inputs, strides)]
    return fake_mode, examples, {str(s.node.expr): d for d, s in sizes.items()}


def _renamed(sub: Graph, names: dict[str, str]) -> bool:
    """Rename the size symbols of ``sub``'s types from torch's to the IR's; False when
    some type names a symbol that is not an input's size."""
    for v in [*sub.inputs, *(o for n in sub.nodes for o in n.outputs)]:
        t = v.type
        if isinstance(t, ScalarType) and t.size is not None:  # a size read (sym_size)
            if t.size not in names:
                return False
            v.type = ScalarType(t.kind, size=names[t.size])
            continue
        if not isinstance(t, TensorType) or t.is_static:
            continue
        dims = (*t.shape, *(t.strides or ()))
        if any(s not in names for d in dims for s in symbols.symbols_of(d)):
            return False
        strides = None if t.strides is None else [symbols.rename_dim(d, names)
                                                  for d in t.strides]
        v.type = TensorType(tuple(symbols.rename_dim(d, names) for d in t.shape), t.dtype,
                            t.device, strides)
    return True


def _fits(sub: Graph, node: Node, graph_outputs: set) -> bool:
    """The decomposition yields the declared types for every output someone reads
    (eval batch norm's unused saved statistics may differ)."""
    for inner, outer in zip(sub.outputs, node.outputs):
        if not outer.uses and outer not in graph_outputs:
            continue
        if not isinstance(inner.type, TensorType) or \
                inner.type.with_(device=outer.type.device) != outer.type:
            return False
    return True


def _overload(name: str):
    parts = name.split(".")
    try:
        return getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, IndexError):
        return None


def _splice(graph: Graph, node: Node, sub: Graph) -> None:
    """Copy ``sub``'s nodes before ``node`` (its inputs bound to node's inputs), then
    replace node's outputs by sub's outputs and erase ``node``. A size read
    (``sym_size``) of a symbol an input of the graph carries is that input: a read of a
    tensor by an op no group takes would keep the tensor's producer out of its reader's
    group (rotary embeddings' ``neg`` at a symbolic length)."""
    device = next((v.type.device for v in node.outputs if isinstance(v.type, TensorType)), "cpu")
    composite = (node.op, unmarked_attrs(node), list(node.inputs))
    env = dict(zip(sub.inputs, node.inputs))
    carriers = {v.type.size: v for v in graph.inputs
                if isinstance(v.type, ScalarType) and v.type.size is not None}
    created: list[Node] = []
    for n in sub.nodes:
        size = n.outputs[0].type.size if n.op == "aten.sym_size.int" and \
            isinstance(n.outputs[0].type, ScalarType) else None
        if size in carriers:
            env[n.outputs[0]] = carriers[size]
            continue
        types = [t.with_(device=device) if isinstance(t, TensorType) else t
                 for t in (v.type for v in n.outputs)]
        attributes = n.attrs
        if isinstance(attributes.get("device"), torch.device):  # a factory traced on meta
            attributes = {**attributes, "device": torch.device(device)}
        copy = graph.create(n.op, [env[v] for v in n.inputs], types, attributes,
                            names=[v.name for v in n.outputs], before=node)
        created.append(copy)
        env.update(zip(n.outputs, copy.outputs))
    for old, inner in zip(node.outputs, sub.outputs):
        graph.replace_all_uses(old, env[inner])
    graph.erase(node)
    for n in reversed(created):  # unused results of the decomposition
        if not any(v.uses or v in graph.outputs for v in n.outputs):
            graph.erase(n)
    kept = [n for n in created if n.graph is graph]
    mark_decomposition(*composite, kept, [env[inner] for inner in sub.outputs])


def _plain_addmm(node: Node) -> bool:
    """addmm(bias, x, w) with beta = alpha = 1 and a static output."""
    return node.attrs.get("beta", 1) == 1 and node.attrs.get("alpha", 1) == 1 and \
        len(node.inputs) == 3 and isinstance(node.outputs[0].type, TensorType)


def _feeds_fusible(value, registry, depth: int = 6) -> bool:
    """Some reader of ``value``, directly or through views, is pointwise or a reduction:
    only then does splitting off the bias add save a kernel."""
    frontier = [value]
    for _ in range(depth):
        nxt = []
        for v in frontier:
            for user in v.users():
                category = registry.get(user.op).category
                if category in ("pointwise", "reduction") or user.region is not None:
                    return True
                if category == "view":
                    nxt.extend(user.outputs)
        frontier = nxt
    return False


def _split_addmm(graph: Graph, node: Node) -> None:
    bias, x, w = node.inputs
    out = node.output
    mm = graph.create("aten.mm.default", [x, w], [out.type], names=["mm"], before=node)
    add = graph.create("aten.add.Tensor", [mm.output, bias], [out.type], names=[out.name],
                       before=node)
    graph.replace_all_uses(out, add.output)
    graph.erase(node)
    mark_decomposition(_ADDMM, unmarked_attrs(node), [bias, x, w], [mm, add], [add.output])
