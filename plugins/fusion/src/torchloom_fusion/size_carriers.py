"""``fusion.size-carriers``: a group that needs a size symbol none of its inputs holds as
a dim is passed a tensor of the graph that does, for its shape only."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import (Graph, Node, Pass, PassContext, PassResult, ScalarType,
                           TensorType, Value, add_region_input, add_subgraph_input, int_sizes,
                           subgraph_calls, symbols)

from torchloom_fusion.fusibility import is_group

#: dtypes every codegen takes as an input (a carrier's elements are never read)
_CARRIER_DTYPES = frozenset({"f32", "f64", "f16", "bf16", "i64", "i32", "i16", "i8", "u8",
                             "b8"})


@attrs.frozen
class SizeCarriers(Pass):
    """Under dynamic shapes a group's types may name a size symbol only inside
    expressions (MobileViT's patches: ``CeilToInt(IntTrueDiv(s4, 2))`` dims with ``s4``
    the image height, a dim of no tensor the group reads): a kernel then has no value for
    it and the group ran on eager ("size symbol s4 has no value in the kernel"). This pass
    passes such a group a tensor input of its graph that has the symbol as a dim: a
    *carrier*, read for its shape only (codegens check no layout of an input nothing
    reads, and load nothing from it).

    before::

        graph @g(%x: f32[s0, 4], %y: f32["CeilToInt(IntTrueDiv(s0,2))", 4]) {
          %z = torchloom.fusion_group(%y) : f32["CeilToInt(IntTrueDiv(s0,2))", 4] region @k(%p: f32["CeilToInt(IntTrueDiv(s0,2))", 4]) {
            ...
          }

    after::

        graph @g(%x: f32[s0, 4], %y: f32["CeilToInt(IntTrueDiv(s0,2))", 4]) {
          %z = torchloom.fusion_group(%y, %x) : f32["CeilToInt(IntTrueDiv(s0,2))", 4] region @k(%p: f32["CeilToInt(IntTrueDiv(s0,2))", 4], %x_size: f32[s0, 4]) {
            ...
          }

    A symbol an int input gives (a view's size, as Dynamo passes SymInts) needs no
    carrier. Carriers are the graph's inputs (alive for the whole call anyway): an int
    that is the symbol (``int[s4]``, a SymInt input of the graph: backward graphs take
    their sizes so) where there is one, else a tensor on the group's device. A group in a
    shared subgraph (``dedup.regions``: BEiT's relative position bias, repeated per layer)
    is passed the top-level graph's carrier through a new input of the subgraph, which
    every call passes.
    """

    name: ClassVar[str] = "fusion.size-carriers"
    after: ClassVar[tuple[str, ...]] = ("fusion.merge-groups", "fusion.combine",
                                        "dedup.kernels")
    idempotent: ClassVar[bool] = True

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        holders = _holders(graph)
        added = _thread(graph, holders)  # (a subgraph is run after, on its own)
        for node in list(graph.nodes):
            if is_group(node) and holders:
                added += _carry(node, holders)
        return PassResult(added > 0, {"carriers": added})


def _holders(graph: Graph) -> dict[tuple[str, str | None], Value]:
    """(symbol, device) -> the first tensor input of ``graph`` with that symbol as a dim;
    (symbol, None) -> the first int input that is the symbol (``int[s4]``)."""
    found: dict[tuple[str, str | None], Value] = {}
    for v in graph.inputs:
        t = v.type
        if isinstance(t, ScalarType) and t.size is not None:
            found.setdefault((t.size, None), v)
        elif isinstance(t, TensorType) and t.dtype in _CARRIER_DTYPES:
            for d in t.shape:
                if symbols.is_symbol(d):
                    found.setdefault((d, t.device), v)
    return found


def needed_symbols(group: Node) -> list[str]:
    """The size symbols in ``group``'s region types that are no dim of a tensor input of
    the region and no int input's size (``int_sizes``: an ``int[sN]``, or an int a view
    inside takes as a size)."""
    region = group.region
    held: set[str] = set()
    named: dict[str, None] = {}

    def note(t) -> None:
        if isinstance(t, TensorType):
            for d in (*t.shape, *(t.actual_strides() or ())):
                named.update(dict.fromkeys(symbols.symbols_of(d)))

    for v in region.inputs:
        note(v.type)
        if isinstance(v.type, TensorType):
            held.update(d for d in v.type.shape if symbols.is_symbol(d))
    for n in region.nodes:
        for o in n.outputs:
            note(o.type)
    held.update(d for _, d in int_sizes(region) if symbols.is_symbol(d))
    return [s for s in named if s not in held]


def _carry(group: Node, holders: dict[tuple[str, str | None], Value]) -> int:
    device = _device(group)
    added = 0
    for s in needed_symbols(group) if device is not None else ():
        carrier = _holder(holders, s, device)
        if carrier is None or carrier in group.inputs:
            continue
        add_region_input(group, carrier, f"{carrier.name}_size")
        added += 1
    return added


def _thread(root: Graph, holders: dict[tuple[str, str | None], Value]) -> int:
    """Give each shared subgraph of ``root`` whose groups need a symbol none of its own
    inputs holds ``root``'s carrier of it, as a new input of the subgraph (where every
    call is a node of ``root``'s own list, so the carrier is visible there)."""
    added = 0
    for sub in list(root.subgraphs.values()):
        if not all(call.graph is root for call in subgraph_calls(sub)):
            continue
        for group in [n for n in sub.nodes if is_group(n)]:
            device = _device(group)
            for s in needed_symbols(group) if device is not None else ():
                if _holder(_holders(sub), s, device) is not None:
                    continue
                outer = _holder(holders, s, device)
                if outer is not None:
                    add_subgraph_input(sub, outer, f"{outer.name}_size")
                    added += 1
    return added


def _device(group: Node) -> str | None:
    """The one device of ``group``'s tensor inputs (None: none, or several)."""
    devices = {v.type.device for v in group.inputs if isinstance(v.type, TensorType)}
    return next(iter(devices)) if len(devices) == 1 else None


def _holder(holders: dict[tuple[str, str | None], Value], symbol: str,
            device: str) -> Value | None:
    return holders.get((symbol, None), holders.get((symbol, device)))  # an int first


__all__ = ["SizeCarriers", "needed_symbols"]
