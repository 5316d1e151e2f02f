"""``fusion.decompose``: rewrite composite ops into primitives a codegen can fuse."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import torch

from torchloom.api import (Graph, Node, PassContext, PassResult, Pass, ScalarType,
                           TensorType, attrs_key, decomposition_table, eager_rejects, import_fx,
                           mark_decomposition, symbols, unmarked_attrs)

from torchloom_fusion.decompose_when import ONLY_WHEN

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
    # Swin's shifted windows, pads: the input read through tiled views by the kernel
    # reading the result (on the CPU: torchloom.frontend.decompositions; where
    # _rolled_on_cpu and _padded_on_cpu say)
    "aten.roll.default", "aten.constant_pad_nd.default",
)


#: (a composite ONLY_WHEN (decompose_when.py) does not name is decomposed wherever found)
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
            if node.op in wanted and ONLY_WHEN.get(node.op, _always)(node, ctx):
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
        if _mutates(gm):
            return None
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


def _mutates(gm) -> bool:
    """Whether the traced decomposition writes a tensor in place (torch's
    ``constant_pad_nd`` copies the input into a view of the filled result with
    ``prims.copy_to``): the IR's ops are values, so such a write would be lost."""
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and
               n.target._schema.is_mutable for n in gm.graph.nodes)


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
