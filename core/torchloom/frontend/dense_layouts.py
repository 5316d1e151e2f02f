"""Elementwise results laid out as a transposed input, made row-major before tracing.

Eager lays out an elementwise op's result as its inputs are (TensorIterator): a
transposed input makes a transposed result, and every result computed from it after that
follows. Whisper's encoder permutes its convolutions' output (``[1, 256, 512]`` to
``[1, 512, 256]``, strides ``[131072, 1, 512]``) and adds the positions to it: every
residual sum of every layer is then laid out transposed, and each layer norm reads its
rows with a stride of 512 elements (its kernels staged through blocks; in the
checkpointed training step's recomputation 3-4x Inductor's, which lays out the values
inside a graph as it likes). The joint graph's types are eager's layouts, fixed when
aot_autograd traces it, so the choice is made before: on Dynamo's graph, each such
result (an add, sub, mul or div of at least :data:`MIN_NUMEL` elements, static sizes, an
operand not row-major, dense with its last dim not innermost in memory, no graph output
reached from it but through a product, norm, convolution or attention (whose layouts do
not follow their operands': the outputs keep eager's layouts), and not computed from a
result this pass copied: the example values after a copy are stale) is followed by
``.contiguous()``, which its users read instead. The values are
the same, the graph is traced with row-major layouts from there on, and the copy fuses
into the op's kernel. Channels-last results (a convolutional model's chosen layout) are
left as they are.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

#: results smaller than this are left as they are (their kernels' reads cost little)
MIN_NUMEL = 4096

#: (out of place only: an in-place op's result aliases its operand, which others may see)
_FUNCTIONS = frozenset((operator.add, operator.sub, operator.mul, operator.truediv,
                        torch.add, torch.sub, torch.mul, torch.div))
_METHODS = frozenset(("add", "sub", "mul", "div", "__add__", "__sub__", "__mul__",
                      "__truediv__", "__radd__", "__rmul__"))


def _resets() -> frozenset:
    """Ops whose result is laid out whatever their operands' layouts (products, norms,
    convolutions, attention): a graph output reached from a copy only through one of them
    keeps eager's layout."""
    F = torch.nn.functional
    return frozenset((torch._C._nn.linear, F.linear, F.layer_norm, F.group_norm,
                      torch.layer_norm, torch.matmul, operator.matmul, torch.mm, torch.bmm,
                      F.scaled_dot_product_attention, F.conv1d, F.conv2d, F.conv3d))


def _reaches_output(node: torch.fx.Node, resets: frozenset) -> bool:
    """Whether a graph output is reached from ``node`` through ops that are not
    :func:`_resets` (whose layouts follow their operands': elementwise ops, views)."""
    seen, todo = {node}, [node]
    while todo:
        for user in todo.pop().users:
            if user.op == "output":
                return True
            if user in seen or (user.op == "call_function" and user.target in resets):
                continue
            seen.add(user)
            todo.append(user)
    return False


def _value(node: torch.fx.Node):
    value = node.meta.get("example_value")
    return value if isinstance(value, torch.Tensor) else None


def _static(t: torch.Tensor) -> bool:
    return all(type(d) is int for d in (*t.shape, *t.stride()))


def _elementwise(node: torch.fx.Node) -> bool:
    if "out" in node.kwargs:  # (its result is the ``out`` tensor: an alias)
        return False
    if node.op == "call_function":
        return node.target in _FUNCTIONS
    return node.op == "call_method" and node.target in _METHODS


def _transposed(t: torch.Tensor) -> bool:
    """Dense, its last dim not innermost in memory (rows read with a stride; attention's
    heads swapped with the sequence, ``[B, H, S, D]`` of a ``[B, S, H*D]`` tensor, keep
    their rows contiguous and are left), not channels-last, at least :data:`MIN_NUMEL`
    elements."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false
    # (sizes first: a comparison of a symbolic size would install a guard on it)
    if not _static(t) or t.dim() < 2 or t.numel() < MIN_NUMEL or t.is_contiguous() or \
            t.shape[-1] == 1 or t.stride(-1) == 1:
        return False
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return False
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
        return False
    return is_non_overlapping_and_dense_or_false(t)


def make_dense(gm: torch.fx.GraphModule) -> int:
    """Follow each transposed elementwise result of ``gm`` (module docstring) by
    ``.contiguous()``; returns how many. ``gm`` is recompiled when any is."""
    graph = gm.graph
    #: the copies made and the nodes after them, whose example values (layouts) are stale
    after: set[torch.fx.Node] = set()
    made = 0
    resets = _resets()
    for node in list(graph.nodes):
        if any(a in after for a in node.all_input_nodes):
            after.add(node)
            continue
        value = _value(node) if _elementwise(node) else None
        if value is None or not _transposed(value):
            continue
        if all(_value(a) is None or _value(a).is_contiguous() for a in node.all_input_nodes):
            continue  # (row-major operands, a transposed result: left as traced)
        if _reaches_output(node, resets):
            continue  # (a graph output's layout is the user's: eager's)
        with graph.inserting_after(node):
            copy = graph.call_method("contiguous", (node,))
        node.replace_all_uses_with(copy, delete_user_cb=lambda user: user is not copy)
        copy.meta.update({k: v for k, v in node.meta.items() if k != "example_value"})
        fake_mode = getattr(value, "fake_mode", None)
        if fake_mode is not None:
            with fake_mode:
                copy.meta["example_value"] = value.contiguous()
        after.update((node, copy))
        made += 1
    if made:
        gm.recompile()
    return made
