"""``views.strip-bookends``: views at a fusion group's edge run outside it, for free."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import (FUSION_GROUP, Graph, Node, Pass, PassContext, PassResult, Value,
                           add_region_input, format_type, remove_region_input,
                           select_region_outputs)
from torchloom_views.view_ops import copy_bytes, is_view, is_zero_copy, unit_dims_only


@attrs.frozen
class StripBookendViews(Pass):
    """Hoist views of group inputs out of the group, sink views producing group outputs
    after it; outside a group a view is a zero-copy metadata change. Views of an input
    the group also reads itself stay: the kernel has that tensor already, and outside each
    view would be one more op a call runs and one more tensor the kernel is handed (rotary
    embeddings read ``q`` and two slices of it).

    before::

        %y = torchloom.fusion_group(%x) : f32[8, 4] region @group0(%a: f32[32]) {
          %v = aten.view.default(%a) {size = [8, 4]} : f32[8, 4]
          %g = aten.gelu.default(%v) : f32[8, 4]
          return %g
        }

    after::

        %v = aten.view.default(%x) {size = [8, 4]} : f32[8, 4]
        %y = torchloom.fusion_group(%v) : f32[8, 4] region @group0(%v_in: f32[8, 4]) {
          %g = aten.gelu.default(%v_in) : f32[8, 4]
          return %g
        }

    A reshape that could not be a view of the tensor it reads (it would need a copy) stays
    in the kernel, where it is index math; the decision is noted for ``explain``. A view
    of an input that only adds or removes dims of size 1 (a batch norm's weight made
    ``[C, 1, 1]``) stays in a group that computes: inside it is no index math at all,
    outside it is one more call per run (ResNet's inference: 40 a call). A group left
    with nothing to compute is removed.
    """

    name: ClassVar[str] = "views.strip-bookends"
    after: ClassVar[tuple[str, ...]] = ("fusion.vertical", "fusion.horizontal")
    hoist_inputs: bool = True
    sink_outputs: bool = True

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        stats = {"hoisted": 0, "sunk": 0, "kept_copies": 0, "groups_removed": 0}
        for group in [n for n in graph.nodes if n.op == FUSION_GROUP]:
            if self.hoist_inputs:
                while _hoist_one(graph, group, ctx, stats):
                    stats["hoisted"] += 1
            if self.sink_outputs:
                while _sink_one(graph, group, ctx, stats):
                    stats["sunk"] += 1
            _drop_passthrough_outputs(graph, group)
            if not group.outputs:  # everything it computed now happens outside
                graph.erase(group)
                stats["groups_removed"] += 1
        changed = stats["hoisted"] + stats["sunk"] + stats["groups_removed"] > 0
        return PassResult(changed, stats)


def _hoist_one(graph: Graph, group: Node, ctx: PassContext, stats: dict) -> bool:
    region = group.region
    computes = any(not is_view(n) for n in region.nodes)
    for i, param in enumerate(region.inputs):
        if param in region.outputs or any(not is_view(u) for u in param.users()):
            continue  # the kernel reads the tensor itself anyway: its views stay index math
        for user in param.users():
            if not is_view(user) or user.inputs[0] is not param:
                continue
            if computes and unit_dims_only(user):
                continue  # no index math inside; a call outside (class text)
            outer = group.inputs[i]
            if not is_zero_copy(user, outer.type):
                _note_kept(ctx, user, outer, stats)
                continue
            hoisted = graph.create(user.op, [outer], [user.output.type], dict(user.attrs),
                                   names=[user.output.name], before=group)
            inner = add_region_input(group, hoisted.output, user.output.name + "_in")
            region.replace_all_uses(user.output, inner)
            region.erase(user)
            if not param.uses and param not in region.outputs:
                remove_region_input(group, i)
            return True
    return False


def _sink_one(graph: Graph, group: Node, ctx: PassContext, stats: dict) -> bool:
    region = group.region
    for j, result in enumerate(region.outputs):
        producer = result.producer
        if producer is None or not is_view(producer):
            continue
        base = producer.inputs[0]
        if not is_zero_copy(producer, base.type):
            continue
        # the base returned already: view that output, so that a write to it is seen
        # through the view as it was inside the group (two outputs are two tensors)
        same = [k for k, v in enumerate(region.outputs) if v is base]
        region.set_output(j, base)
        if not result.uses and result not in region.outputs:
            region.erase(producer)
        old = group.outputs[j]
        view_type = old.type
        graph.set_type(old, base.type)
        users = list(old.uses)
        in_outputs = [k for k, v in enumerate(graph.outputs) if v is old]
        source = group.outputs[same[0]] if same else old
        sunk = graph.create(producer.op, [source], [view_type], dict(producer.attrs),
                            names=[old.name + "_view"], after=group)
        _redirect(graph, old, sunk.output, users, in_outputs)
        return True
    return False


def _redirect(graph: Graph, old: Value, new: Value, users: list[Node],
              output_slots: list[int]) -> None:
    """Point the given readers of ``old`` (not later ones) at ``new``."""
    for user in users:
        for k, v in enumerate(user.inputs):
            if v is old:
                user.set_input(k, new)
    for k in output_slots:
        graph.set_output(k, new)


def _drop_passthrough_outputs(graph: Graph, group: Node) -> None:
    """A group output that is just one of its inputs is read from the input instead."""
    region = group.region
    j = 0
    while j < len(region.outputs):
        result = region.outputs[j]
        if result in region.inputs:
            outer_in = group.inputs[region.inputs.index(result)]
            out = group.outputs[j]
            _redirect(graph, out, outer_in, list(out.uses),
                      [k for k, v in enumerate(graph.outputs) if v is out])
            select_region_outputs(group, [k for k in range(len(region.outputs)) if k != j])
            continue
        j += 1
    for i in reversed(range(len(region.inputs))):
        if not region.inputs[i].uses and region.inputs[i] not in region.outputs:
            remove_region_input(group, i)
    if not region.outputs:  # nothing left to compute: the region's nodes are dead
        for node in reversed(list(region.nodes)):
            region.erase(node)


def _note_kept(ctx: PassContext, view: Node, outer: Value, stats: dict) -> None:
    stats["kept_copies"] += 1
    ctx.note(f"views.strip-bookends: {view.op} of %{outer.name} ({format_type(outer.type)}) "
             f"kept in the kernel as index math: outside it would be a copy moving "
             f"{copy_bytes(outer.type)} bytes")
