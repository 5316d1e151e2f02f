"""Convolutional graphs traced channels-last on the CPU.

oneDNN's convolutions run faster on channels-last (NHWC) tensors than on NCHW ones (this
machine, 2 threads: a 7 x 7 stride-2 stem over ``[2, 3, 224, 224]`` 3.65 against 1.10 ms,
a 1 x 1 over ``[2, 64, 56, 56]`` 0.45 against 0.27), and Inductor lays out every CPU graph
with a convolution so (``decide_layout_opt``). The joint graph's layouts are eager's,
fixed when aot_autograd traces it, so the choice is made before, on Dynamo's graph, by
:func:`make_channels_last`:

- each ``conv2d`` reads its input and its weight through
  ``.contiguous(memory_format=channels_last)``: no copy where one already is (after the
  first convolution eager lays out what follows channels-last itself: convolutions'
  results, norms, pointwise ops, pooling, and their gradients in the backward; a 1 x 1
  kernel is both layouts at once); the weights are copied as Inductor copies them (an
  NCHW weight beside a channels-last input: 3 x 3 over ``[2, 256, 7, 7]`` 1.38 against
  0.58 ms; ConvNeXt's inference step 17.4 against 13.0 ms);
- but a convolution whose input needs a gradient and is not computed from such a
  convolution's result is left (the copy's gradient would reach the input channels-last,
  where eager's is row-major), and so, then, are the ones after it;
- a value whose layout may now differ from the traced one (*changed*: computed from a
  convolution's result through any op but :data:`_RESET_NAMES`, whose results are
  row-major whatever their operands) is read through ``.contiguous()`` again by every op
  not known to be indifferent to layouts (:data:`_SAFE_FUNCTIONS`, :data:`_SAFE_METHODS`:
  ``view`` is not, nor is an op this module has never heard of) and by the graph's
  outputs, so that they see eager's layouts;
- the backward lays out each input's gradient as the input (:func:`gradients_restored`)
  where every convolution read a row-major input and weight.

This is done where every ``conv2d`` is on the CPU, f32 or bf16, of static sizes, one
reads at least :data:`MIN_NUMEL` elements, oneDNN is there and on, and the backend option
``channels_last`` is not false. The graph is left as it is where a changed value must be
restored but was traced neither row-major nor channels-last, or where a copy made so where
eager's op returned a view could be seen (:func:`_breaks_aliases`: a restoring copy, or a
``contiguous``/``reshape``/``flatten`` of a changed value, with a tensor aliasing it written
in place after it, an in-place op on a restored value, outputs aliasing each other).
"""

from __future__ import annotations

import operator

import torch
import torch.fx

F = torch.nn.functional

#: ops whose result is a new tensor, never an alias of an operand (other ops are taken to
#: alias all of theirs), whatever their operands' layouts
_FRESH_FUNCTIONS = ("conv2d", "batch_norm", "layer_norm", "group_norm", "instance_norm",
                    "relu", "relu6", "gelu", "silu", "mish", "sigmoid", "tanh", "hardswish",
                    "hardsigmoid", "hardtanh", "leaky_relu", "elu", "selu", "softplus",
                    "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d",
                    "pad", "add", "sub", "mul", "div", "neg", "abs", "exp", "sqrt", "rsqrt",
                    "clamp", "pow", "mean", "sum", "amax", "amin", "cat", "where",
                    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "linear", "matmul",
                    "mm", "bmm")
_FRESH_NAMES = _FRESH_FUNCTIONS + ("__add__", "__sub__", "__mul__", "__truediv__",
                                   "__radd__", "__rmul__")
#: ops whose values do not depend on their operands' layouts and which accept any: the
#: fresh ones, views, reshapes that copy where they must, and a few that may write
_SAFE_FUNCTIONS = _FRESH_FUNCTIONS + ("relu_", "dropout", "dropout2d", "interpolate",
                                      "flatten", "reshape", "permute", "transpose",
                                      "unsqueeze", "squeeze")
_SAFE_OPERATORS = (operator.add, operator.sub, operator.mul, operator.truediv,
                   operator.iadd, operator.isub, operator.imul, operator.itruediv,
                   operator.neg, operator.getitem, operator.matmul, getattr)
_SAFE_METHODS = frozenset(_SAFE_FUNCTIONS + _FRESH_NAMES + (
    "add_", "sub_", "mul_", "div_", "clamp_", "sigmoid_", "tanh_", "size", "dim", "to",
    "float", "type_as", "contiguous"))
#: ... of which those whose results are laid out row-major whatever their operands'
_RESET_NAMES = ("linear", "matmul", "mm", "bmm")
_FRESH_OPERATORS = (operator.add, operator.sub, operator.mul, operator.truediv,
                    operator.neg, operator.matmul, operator.pow, operator.floordiv,
                    operator.mod)
#: ops whose result is a view of their operand where its layout allows, else a copy: of a
#: changed value, a copy where eager's was a view, perhaps
_VIEW_OR_COPY = frozenset(("contiguous", "reshape", "flatten", "to", "float", "type_as"))
_IN_PLACE_OPERATORS = frozenset((
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.imatmul, operator.iand, operator.ior,
    operator.ixor, operator.ilshift, operator.irshift, operator.setitem))
_IN_PLACE_DUNDERS = frozenset(f"__{name.__name__.strip('_')}__"
                              for name in _IN_PLACE_OPERATORS)

#: the dtypes oneDNN's channels-last convolutions are fast for
DTYPES = (torch.float32, torch.bfloat16)


def _functions(names) -> frozenset:
    found = set()
    for name in names:
        for module in (torch, F, torch._C._nn):
            if callable(getattr(module, name, None)):
                found.add(getattr(module, name))
    return frozenset(found)


def _value(node) -> torch.Tensor | None:
    value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _is_conv2d(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in (torch.conv2d, F.conv2d)


#: a graph whose convolutions all read fewer elements is left as it is: its copies into
#: and out of channels-last cost about what its convolutions gain, and its weights'
#: gradients, summed in another order, differ in the last bits from eager's for nothing
MIN_NUMEL = 16384


def _eligible(conv: torch.fx.Node) -> bool:
    """A CPU conv2d over a batch (4-D), f32 or bf16, of static sizes."""
    x = _value(conv.args[0]) if conv.args else None
    return x is not None and x.dim() == 4 and x.device.type == "cpu" and \
        x.dtype in DTYPES and all(type(d) is int for d in (*x.shape, *x.stride()))


def _mkldnn() -> bool:
    return torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled


#: norms that write their running statistics (arguments 1 and 2) in training
_NORMS = frozenset((F.batch_norm, F.instance_norm, torch.batch_norm, torch.instance_norm))


def _written(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The tensors ``node`` may write in place, over-approximated: ``out=``; the first
    argument (each tensor of a list there: ``_foreach_mul_``) of an in-place method or
    operator (``+=``, ``x[i] = v``), of a function named ``..._``, and of one given a
    literal ``True`` (``inplace``, positional or not: ``F.leaky_relu(z, 0.5, True)``;
    ``F.dropout``'s ``training`` counts too); a norm's running statistics; every tensor
    argument of an aten op whose schema writes."""
    out = node.kwargs.get("out")
    if isinstance(out, torch.fx.Node):
        return [out]
    first = node.args[0] if node.args else None
    firsts = [first] if isinstance(first, torch.fx.Node) else [
        a for a in first if isinstance(a, torch.fx.Node)] if isinstance(
            first, (list, tuple)) else []
    if node.op == "call_method":
        name = node.target
        in_place = name in _IN_PLACE_DUNDERS or name.endswith("_") and \
            not name.startswith("_")
        return firsts if in_place or node.kwargs.get("inplace") is True else []
    if node.op != "call_function":
        return []
    target = node.target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return list(node.all_input_nodes) if _mutable(target) else []
    if target in _NORMS:
        stats = (*node.args[1:3], node.kwargs.get("running_mean"),
                 node.kwargs.get("running_var"))
        return [a for a in stats if isinstance(a, torch.fx.Node)]
    if target in _IN_PLACE_OPERATORS or getattr(target, "__name__", "").endswith("_") or \
            any(a is True for a in (*node.args[1:], *node.kwargs.values())):
        return firsts
    return []


def _mutable(op) -> bool:
    overloads = [getattr(op, name) for name in op.overloads()] \
        if isinstance(op, torch._ops.OpOverloadPacket) else [op]
    return any(o._schema.is_mutable for o in overloads)


def _fresh(node: torch.fx.Node, fresh: frozenset) -> bool:
    """Whether ``node``'s result is a new tensor (:data:`_FRESH_NAMES`)."""
    if node.op == "call_method":
        return node.target in _FRESH_NAMES
    return node.op == "call_function" and (node.target in fresh or
                                           node.target in _FRESH_OPERATORS)


def _breaks_aliases(graph, changed: set, restores: list) -> bool:
    """Whether a copy made here where eager's op returned a view (a view-or-copy op of a
    changed value, a restoring copy) could be seen: a tensor aliasing it is written after
    it, or graph outputs alias each other and one of them is restored. Aliases are
    over-approximated: every op but the fresh ones (:func:`_fresh`) and in-place ones
    (their result is the tensor written) is taken to alias all its operands."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    parent: dict = {}

    def find(n):
        while parent.get(n, n) is not n:
            parent[n] = parent.get(parent[n], parent[n])  # (halving: short chains)
            n = parent[n]
        return n
    fresh = _functions(_FRESH_NAMES)
    writes = []  # (position, tensor written)
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        written = _written(node)
        for w in written:
            parent[find(node)] = find(w)
            writes.append((order[node], w))
        if not written and not _fresh(node, fresh):
            for a in node.all_input_nodes:
                parent[find(node)] = find(a)
    points = [(order[n], n) for n in changed if (n.op == "call_method" and
              n.target in _VIEW_OR_COPY or n.target in (torch.flatten, torch.reshape))
              and not _always_a_view(n)]
    points += [(order[user], value) for user, value in restores if user.op != "output"]
    if any(at >= pos and find(w) is find(n) for pos, n in points for at, w in writes):
        return True
    (output,) = [n for n in graph.nodes if n.op == "output"]
    outputs = output.all_input_nodes
    return any(sum(find(o) is find(value) for o in outputs) > 1
               for user, value in restores if user.op == "output")


def _always_a_view(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a ``flatten`` that merges at most one dim of a size over 1 (a
    pooled ``[N, C, 1, 1]`` flattened: a view whatever the strides)."""
    if node.target not in ("flatten", torch.flatten) or not node.args:
        return False
    value = _value(node.args[0])
    if value is None or value.dim() == 0:
        return False
    start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
    end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
    if not isinstance(start, int) or not isinstance(end, int):
        return False
    dims = value.shape[start % value.dim():end % value.dim() + 1]
    return all(type(d) is int for d in dims) and sum(1 for d in dims if d != 1) <= 1


def row_major_convolutions(gm: torch.fx.GraphModule) -> bool:
    """Whether every ``conv2d`` of ``gm`` reads a row-major input and weight (eager then
    lays out their gradients row-major: :func:`gradients_restored` applies)."""
    return all(_value(a) is not None and _value(a).is_contiguous()
               for n in gm.graph.nodes if _is_conv2d(n) for a in n.args[:2])


def _restore_format(node: torch.fx.Node):
    """The memory format that restores ``node``'s traced layout, or None where none does."""
    value = _value(node)
    return None if value is None else _format_of(value)


def plan(gm: torch.fx.GraphModule) -> tuple[list, list] | None:
    """(the convolutions, the (user, value) pairs to restore), or None where the graph is
    left as it is (module docstring)."""
    graph = gm.graph
    every = [n for n in graph.nodes if _is_conv2d(n)]
    if not every or not _mkldnn() or not all(_eligible(n) for n in every) or \
            max(_value(n.args[0]).numel() for n in every) < MIN_NUMEL:
        return None
    convs: list[torch.fx.Node] = []
    safe, resets = _functions(_SAFE_FUNCTIONS), _functions(_RESET_NAMES)
    changed: set[torch.fx.Node] = set()
    restores: list[tuple[torch.fx.Node, torch.fx.Node]] = []
    for node in graph.nodes:
        inputs = [a for a in node.all_input_nodes if a in changed]
        if node.op == "output":
            restores += [(node, a) for a in inputs]
        elif _is_conv2d(node):
            if inputs or not _value(node.args[0]).requires_grad:
                convs.append(node)  # (not read channels-last: a gradient eager lays out
                changed.add(node)   # row-major would come back channels-last)
        elif inputs and node.op == "call_method" and node.target in _SAFE_METHODS or \
                inputs and node.op == "call_function" and (
                    node.target in safe or node.target in _SAFE_OPERATORS):
            written = [] if node.target in _NORMS else _written(node)
            if written:  # (its result is the tensor written, as laid out)
                if any(w in changed for w in written):
                    changed.add(node)
            elif node.target not in resets and not (
                    node.op == "call_method" and node.target in _RESET_NAMES):
                changed.add(node)
        elif inputs:
            if any(w in changed for w in _written(node)):
                return None  # (restored, the copy would be written, not the tensor)
            restores += [(node, a) for a in inputs]
    if not convs or any(_restore_format(a) is None for _, a in restores) or \
            _breaks_aliases(graph, changed, restores):
        return None
    return convs, restores


def make_channels_last(gm: torch.fx.GraphModule) -> int:
    """Lay out ``gm``'s convolutions channels-last (module docstring); returns how many
    convolutions now read a channels-last input (0: the graph is as it was). ``gm`` is
    recompiled when changed."""
    planned = plan(gm)
    if planned is None:
        return 0
    convs, restores = planned
    graph = gm.graph
    for conv in convs:
        _read_through(graph, conv, conv.args[0], torch.channels_last)
        weight = _value(conv.args[1]) if len(conv.args) > 1 else None
        if weight is not None and weight.dim() == 4 and \
                not weight.is_contiguous(memory_format=torch.channels_last):
            _read_through(graph, conv, conv.args[1], torch.channels_last)
    for user, value in restores:
        _read_through(graph, user, value, _restore_format(value))
    gm.recompile()
    return len(convs)


def _read_through(graph, user: torch.fx.Node, value: torch.fx.Node, memory_format) -> None:
    """Make ``user`` read ``value`` through ``.contiguous(memory_format=...)``."""
    with graph.inserting_before(user):
        copy = graph.call_method("contiguous", (value,), {"memory_format": memory_format})
    copy.meta.update({k: v for k, v in value.meta.items() if k != "example_value"})
    traced = _value(value)
    fake_mode = getattr(traced, "fake_mode", None)
    if fake_mode is not None:
        with fake_mode:
            copy.meta["example_value"] = traced.contiguous(memory_format=memory_format)
    user.replace_input_with(value, copy)


def gradients_restored(partition_fn, example_inputs):
    """``partition_fn`` (aot_autograd's forward/backward split) whose backward lays out
    each input's gradient as eager does where a graph traced channels-last would not: as
    the input (a convolution's weight read by channels-last activations gets a
    channels-last gradient from oneDNN; eager's, from NCHW activations, is row-major).
    ``.grad`` would be copied to the parameter's layout anyway (autograd's layout
    contract); ``torch.autograd.grad`` returns it as it is."""
    def partition(joint, joint_inputs, **kwargs):
        forward, backward = partition_fn(joint, joint_inputs, **kwargs)
        restore_gradients(backward, example_inputs)
        return forward, backward
    return partition


def restore_gradients(backward: torch.fx.GraphModule, example_inputs) -> int:
    """Lay out each gradient ``backward`` returns as its input (one gradient or None per
    input, in order) where both are dense, row-major or channels-last, and differ;
    returns how many. Nothing where the outputs do not pair with the inputs."""
    (output,) = [n for n in backward.graph.nodes if n.op == "output"]
    grads = output.args[0]
    if not isinstance(grads, (list, tuple)) or len(grads) != len(example_inputs):
        return 0
    pairs = [(g, x) for g, x in zip(grads, example_inputs)
             if isinstance(g, torch.fx.Node) and isinstance(x, torch.Tensor)]
    vals = [g.meta.get("val") for g, _ in pairs]
    if any(not isinstance(v, torch.Tensor) or v.shape != x.shape
           for v, (_, x) in zip(vals, pairs)):
        return 0
    restored = 0
    for (grad, x), val in zip(pairs, vals):
        fmt = _format_of(x)
        if fmt is None or val.is_contiguous(memory_format=fmt):
            continue
        with backward.graph.inserting_before(output):
            copy = backward.graph.call_function(torch.ops.aten.clone.default, (grad,),
                                                {"memory_format": fmt})
        copy.meta.update(grad.meta)
        fake_mode = getattr(val, "fake_mode", None)
        if fake_mode is not None:
            with fake_mode:
                copy.meta["val"] = val.clone(memory_format=fmt)
        output.replace_input_with(grad, copy)
        restored += 1
    if restored:
        backward.recompile()
    return restored


def _format_of(x: torch.Tensor):
    """The memory format ``x`` is laid out in, row-major or channels-last, or None."""
    if x.is_contiguous():
        return torch.contiguous_format
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return None
