"""``dedup.kernels``: fusion groups equal up to names share one kernel."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import (FUSION_GROUP, Graph, Node, Pass, PassContext, PassResult,
                           remove_region_input, select_region_inputs, structural_hash)

#: ``node.meta`` key holding a group's canonical key (the structural hash of its region)
KEY = "dedup.key"


@attrs.frozen
class DedupKernels(Pass):
    """Put every fusion group in canonical form and annotate it with its canonical key,
    so groups that differ only in value names, in the order of their inputs or in an input
    passed twice hit one kernel-cache entry (one ``generate`` per key per process, none
    with a warm disk cache).

    Canonical form: an outer value passed twice becomes one parameter; parameters the
    region does not read are dropped; parameters are ordered by first use; region values
    are renamed ``in0, in1, ...`` and ``t0, t1, ...``; the region is named after its key.

    before::

        %u = torchloom.fusion_group(%y, %x) : f32[8] region @group0(%b: f32[8], %a: f32[8]) {
          %s = aten.mul.Tensor(%a, %b) : f32[8]
          return %s
        }
        %v = torchloom.fusion_group(%x, %y) : f32[8] region @group1(%p: f32[8], %q: f32[8]) {
          %m = aten.mul.Tensor(%p, %q) : f32[8]
          return %m
        }

    after (both groups now print, hash and compile the same)::

        %u = torchloom.fusion_group(%x, %y) : f32[8] region @k_3f2a9c1e(%in0: f32[8], %in1: f32[8]) {
          %t0 = aten.mul.Tensor(%in0, %in1) : f32[8]
          return %t0
        }
        %v = torchloom.fusion_group(%x, %y) : f32[8] region @k_3f2a9c1e(%in0: f32[8], %in1: f32[8]) {
          %t0 = aten.mul.Tensor(%in0, %in1) : f32[8]
          return %t0
        }

    Stats: ``groups``, ``unique_kernels`` (distinct keys), ``canonicalized`` (groups
    rewritten), ``inputs_merged``, ``inputs_dropped``.
    """

    name: ClassVar[str] = "dedup.kernels"
    after: ClassVar[tuple[str, ...]] = ("fusion.vertical", "fusion.horizontal",
                                        "fusion.merge-groups", "views.strip-bookends")
    rename: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        stats = {"groups": 0, "unique_kernels": 0, "canonicalized": 0, "inputs_merged": 0,
                 "inputs_dropped": 0}
        keys: dict[str, int] = {}
        for group in [n for n in graph.nodes if n.op == FUSION_GROUP]:
            before = _snapshot(group)
            stats["inputs_merged"] += _merge_duplicate_inputs(group)
            stats["inputs_dropped"] += _drop_unused_inputs(group)
            _order_inputs_by_first_use(group)
            key = structural_hash(group.region)
            if self.rename:
                _rename(group, key)
            group.meta[KEY] = key
            keys[key] = keys.get(key, 0) + 1
            stats["canonicalized"] += _snapshot(group) != before
            stats["groups"] += 1
        stats["unique_kernels"] = len(keys)
        if stats["groups"] > stats["unique_kernels"]:
            ctx.note(f"dedup.kernels: @{graph.name} has {stats['groups']} fusion groups but "
                     f"{stats['unique_kernels']} unique kernels")
        return PassResult(stats["canonicalized"] > 0, stats)


def _snapshot(group: Node) -> tuple:
    region = group.region
    return (tuple(group.inputs), region.name, tuple(v.name for v in region.inputs),
            tuple(v.name for n in region.nodes for v in n.outputs))


def _merge_duplicate_inputs(group: Node) -> int:
    """An outer value passed in two slots becomes one parameter."""
    region, merged = group.region, 0
    first: dict = {}
    for i in range(len(group.inputs) - 1, -1, -1):
        first[group.inputs[i]] = i
    for i in range(len(group.inputs) - 1, -1, -1):
        keep = first[group.inputs[i]]
        if keep != i:
            region.replace_all_uses(region.inputs[i], region.inputs[keep])
            remove_region_input(group, i)
            merged += 1
    return merged


def _drop_unused_inputs(group: Node) -> int:
    region, dropped = group.region, 0
    for i in range(len(group.inputs) - 1, -1, -1):
        param = region.inputs[i]
        if not param.uses and param not in region.outputs:
            remove_region_input(group, i)
            dropped += 1
    return dropped


def _order_inputs_by_first_use(group: Node) -> None:
    region = group.region
    rank: dict = {}
    for n in region.nodes:
        for v in n.inputs:
            rank.setdefault(v, len(rank))
    for v in region.outputs:
        rank.setdefault(v, len(rank))
    order = sorted(range(len(region.inputs)), key=lambda i: rank.get(region.inputs[i], len(rank)))
    select_region_inputs(group, order)


def _rename(group: Node, key: str) -> None:
    region = group.region
    region.name = f"k_{key[:8]}"
    names = {v: f"in{i}" for i, v in enumerate(region.inputs)}
    # values of nested regions keep their (local) names
    outputs = [v for n in region.nodes for v in n.outputs]
    names.update((v, f"t{i}") for i, v in enumerate(outputs))
    region.rename(names, reset=True)
