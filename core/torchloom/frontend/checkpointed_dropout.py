"""A checkpointed layer's dropout with its mask drawn from the shape, before the min-cut
partitioner splits the joint graph.

Under activation checkpointing the partitioner recomputes a layer's random ops in the
backward from the generator state the forward saved (``run_with_rng_state``). A dropout
is ``native_dropout(x, p)``: its recomputation needs ``x`` again, though the backward
reads only the mask (``native_dropout_backward(grad, mask, scale)``), so whatever makes
``x`` is recomputed too: in a pre-norm block (GPT-2, T5) the last projection of the layer,
a matrix product, only to draw a mask. Eager's CPU kernel draws the mask as
``bernoulli_(1 - p)`` of a new tensor shaped as ``x`` and then multiplies; this pass
writes that out for each dropout the partitioner must recompute (tagged
``PREFER_RECOMPUTE``/``MUST_RECOMPUTE``), on the CPU, of contiguous f32/f64 values with
static sizes (eager's mask takes the input's layout and draws in its memory order, where
``bernoulli.p`` makes a contiguous tensor: a channels-last input is left as it is):

    out, mask = native_dropout(x, p, True)    ->    e = empty(shape, dtype)
                                                    m = bernoulli.p(e, 1 - p)
                                                    mask = ne(m, 0)
                                                    out = mul(mul(x, m), scale)

where ``scale = 1 / (1 - p)`` (0 for ``p = 1``), as eager's kernel computes it: the same
draws (``bernoulli.p`` of a new tensor is ``bernoulli_(1 - p)`` of one), the same mask and
products, so the same bits (bf16 and f16 outputs are rounded another way by eager's
kernel: left as they are). The recomputation then draws the mask from the saved state
alone; the products stay in the forward, where the fusion takes them into the kernel
that reads the dropout's output.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

#: the dtypes whose dropout output eager computes as ``x * mask * scale``, rounded as written
_DTYPES = (torch.float32, torch.float64)


def rewritable(graph: torch.fx.Graph) -> bool:
    """Whether ``graph`` has a dropout :func:`masks_from_shapes` rewrites."""
    return any(_rewritable(n) for n in graph.nodes)


def masks_from_shapes(graph: torch.fx.Graph) -> int:
    """Rewrite each recomputed CPU dropout of ``graph`` as above, in place (a graph of the
    caller's own: the backend's copy of the joint graph); how many."""
    done = 0
    for node in list(graph.nodes):
        if _rewritable(node):
            _rewrite(graph, node)
            done += 1
    if done:
        graph.eliminate_dead_code()
    return done


def _recomputed(node: torch.fx.Node) -> bool:
    from torch.utils.checkpoint import CheckpointPolicy
    return node.meta.get("recompute") in (CheckpointPolicy.PREFER_RECOMPUTE,
                                          CheckpointPolicy.MUST_RECOMPUTE)


def _rewritable(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target is not torch.ops.aten.native_dropout.default \
            or node.kwargs or len(node.args) != 3 or not _recomputed(node):
        return False
    x, p, train = node.args
    value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    from torch._guards import detect_fake_mode
    return isinstance(value, torch.Tensor) and detect_fake_mode([value]) is not None and \
        value.device.type == "cpu" and value.is_contiguous() and \
        value.dtype in _DTYPES and all(isinstance(d, int) for d in value.shape) and \
        value.numel() > 0 and isinstance(p, float) and 0.0 <= p <= 1.0 and train is True and \
        all(u.op == "call_function" and u.target is operator.getitem and u.args[1] in (0, 1)
            for u in node.users)


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    aten = torch.ops.aten
    x, p, _ = node.args
    value = x.meta["val"]
    keep = 1.0 - p
    scale = 0.0 if keep == 0 else 1.0 / keep
    shape = list(value.shape)
    from torch._guards import detect_fake_mode
    mode = detect_fake_mode([value])

    def add(target, args, kwargs=None):
        made = graph.call_function(target, tuple(args), kwargs or {})
        made.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        vals = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args]
        with mode:  # (the partitioner reads each node's value)
            made.meta["val"] = target(*vals, **(kwargs or {}))
        return made

    with graph.inserting_before(node):
        empty = add(aten.empty.memory_format, [shape],
                    {"dtype": value.dtype, "device": torch.device("cpu"), "pin_memory": False})
        drawn = add(aten.bernoulli.p, [empty, keep])
        mask = add(aten.ne.Scalar, [drawn, 0])
        out = add(aten.mul.Tensor, [add(aten.mul.Tensor, [x, drawn]), scale])
    for use in list(node.users):
        use.replace_all_uses_with(out if use.args[1] == 0 else mask)
        graph.erase_node(use)
    graph.erase_node(node)


__all__ = ["masks_from_shapes", "rewritable"]
