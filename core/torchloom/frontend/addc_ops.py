"""``addcdiv`` and ``addcmul`` put back where Dynamo wrote them out.

Dynamo traces ``torch.addcdiv(x, a, b, value=v)`` as ``torch.add(x, torch.mul(torch.div(a,
b), v))``, ``x.addcdiv_(a, b, value=v)`` as ``prims.fma(torch.div(a, b), v, x)`` and
``x.addcmul_(a, b, value=v)`` as ``prims.fma(torch.mul(a, b), v, x)``, each then copied
into ``x`` (its ``handle_addcdiv``, ``method_addcdiv_``, ``method_addcmul_``: a Python
number in the graph instead of a graph break). Eager's kernels compute ``x + v * a / b``
and ``x + v * a * b`` in one expression, in f32 for bf16 and f16: the ops Dynamo writes
round ``a / b`` (``a * b``) first, and in bf16/f16 each result, so a compiled Adam step
without ``foreach`` (``exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)``,
``param.addcdiv_(exp_avg, denom, value=-lr)``) differed from eager's in about a quarter of
its elements in f32 and by several units in the last place in f16 (0.0029 in -1.5693).
:func:`restore_addc_ops` makes the ops again where the ops are Dynamo's: the ``torch``
functions and ``prims.fma`` (not the operators ``+``, ``*``, ``/`` a program writes), ``v``
a Python number, the quotient or product read by nothing else.
"""

from __future__ import annotations

import numbers

import torch


def _single_use(node, target, arity: int) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and \
        node.target is target and len(node.args) == arity and not node.kwargs and \
        len(node.users) == 1


def _number(value) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def _written_out(node: torch.fx.Node):
    """(the op, x, a, b, v, the nodes it replaces) where ``node`` ends Dynamo's writing of
    ``addcdiv`` or ``addcmul``, else None."""
    if node.op != "call_function" or node.kwargs:
        return None
    if node.target is torch.add and len(node.args) == 2:  # torch.addcdiv(x, a, b, value=v)
        x, product = node.args
        if not (_single_use(product, torch.mul, 2) and _number(product.args[1])):
            return None
        inner, value = product.args
        dead = [product, inner]
        ops = {torch.div: torch.addcdiv}
    elif isinstance(node.target, torch._ops.OpOverload) and \
            str(node.target) == "prims.fma.default" and len(node.args) == 3:  # addc..._
        inner, value, x = node.args
        if not _number(value):
            return None
        dead = [inner]
        ops = {torch.div: torch.addcdiv, torch.mul: torch.addcmul}
    else:
        return None
    op = next((made for target, made in ops.items() if _single_use(inner, target, 2)), None)
    if op is None or not isinstance(x, torch.fx.Node):
        return None
    a, b = inner.args
    if not (isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node)):
        return None
    return op, x, a, b, value, dead


def restore_addc_ops(gm: torch.fx.GraphModule) -> int:
    """Each ``addcdiv`` and ``addcmul`` Dynamo wrote out in ``gm`` (module docstring) as the
    op again; returns how many. ``gm`` is recompiled when any is."""
    graph = gm.graph
    made = 0
    for node in list(graph.nodes):
        found = _written_out(node)
        if found is None:
            continue
        op, x, a, b, value, dead = found
        with graph.inserting_before(node):
            made_again = graph.call_function(op, (x, a, b), {"value": value})
        made_again.meta.update(node.meta)  # (the same result: its example value, its source)
        node.replace_all_uses_with(made_again)
        for old in (node, *dead):
            graph.erase_node(old)
        made += 1
    if made:
        gm.recompile()
    return made
