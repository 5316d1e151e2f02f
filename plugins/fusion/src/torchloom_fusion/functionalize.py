"""``fusion.functionalize``: in-place ops become out-of-place where nobody can tell."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import Graph, Node, Pass, PassContext, PassResult, TensorType


@attrs.frozen
class Functionalize(Pass):
    """Rewrite ``aten.<op>_`` into ``aten.<op>`` when no alias observes the write: the
    written value is not a graph input, not a view and has no views, and no other op
    writes it, and it is not the result of an in-place op that returns the tensor it
    wrote. Readers after the in-place op then read the new value. Otherwise the op
    stays (mutating ops are never fused, so it keeps fusion from crossing it).

    before::

        %e = aten.exp.default(%x) : f32[4]
        %a = aten.add_.Tensor(%e, %y) : f32[4]
        %n = aten.neg.default(%e) : f32[4]

    after::

        %e = aten.exp.default(%x) : f32[4]
        %a = aten.add.Tensor(%e, %y) : f32[4]
        %n = aten.neg.default(%a) : f32[4]
    """

    name: ClassVar[str] = "fusion.functionalize"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        reg = ctx.registry
        viewed = set()
        writes: dict = {}
        for node in graph.nodes:
            opdef = reg.get(node.op)
            for i in range(len(node.outputs)):
                src = opdef.aliased_input(node, i)
                if src is not None and not opdef.mutates:
                    viewed.add(node.inputs[src])
                    viewed.add(node.outputs[i])
            for i in opdef.mutated_inputs(node):
                writes[node.inputs[i]] = writes.get(node.inputs[i], 0) + 1
        inputs = set(graph.inputs)
        rewritten = kept = 0
        for node in list(graph.nodes):
            opdef = reg.get(node.op)
            if not opdef.mutates:
                continue
            target = _out_of_place(node, reg)
            mutated = opdef.mutated_inputs(node)
            if target is None or len(mutated) != 1 or len(node.outputs) != 1:
                kept += 1
                continue
            x = node.inputs[mutated[0]]
            if x in inputs or x in viewed or writes.get(x, 0) != 1 or x.producer is None \
                    or _aliases_its_input(x, reg) \
                    or not isinstance(x.type, TensorType) or node.output.type != x.type:
                kept += 1
                continue
            _rewrite(graph, node, target, x)
            rewritten += 1
        return PassResult(rewritten > 0, {"functionalized": rewritten, "kept_inplace": kept})


def _aliases_its_input(x, reg) -> bool:
    """Whether ``x`` is the result of an in-place op that returns the tensor it wrote
    (``%b = aten.mul_.Tensor(%a)`` is ``%a``): writing ``x`` writes that tensor too. An op
    functionalized earlier in this run produces a fresh value instead."""
    return reg.get(x.producer.op).aliased_input(x.producer, x.index) is not None


def _out_of_place(node: Node, reg) -> str | None:
    """``aten.add_.Tensor`` -> ``aten.add.Tensor`` when that op exists, is not mutating
    and takes the same arguments."""
    parts = node.op.split(".")
    if len(parts) != 3 or not parts[1].endswith("_") or parts[1].startswith("_"):
        return None
    name = f"{parts[0]}.{parts[1][:-1]}.{parts[2]}"
    opdef = reg.get(name)
    if opdef.fn is None or opdef.mutates or opdef.schema is None:
        return None
    src = reg.get(node.op).schema
    if [a.name for a in opdef.schema.arguments] != [a.name for a in src.arguments]:
        return None
    return name


def _rewrite(graph: Graph, node: Node, target: str, x) -> None:
    graph.renumber()
    here = node.position
    later = [u for u in x.users() if u is not node and u.position > here]
    new = graph.create(target, list(node.inputs), [node.output.type], node.attrs,
                       names=[node.output.name], before=node)
    graph.replace_all_uses(node.output, new.output)
    for user in later:
        for i, v in enumerate(user.inputs):
            if v is x:
                user.set_input(i, new.output)
    graph.replace_outputs({x: new.output})
    name = node.output.name
    graph.erase(node)
    graph.rename({new.output: name})  # the in-place result's name is free again
