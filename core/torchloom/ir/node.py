"""SSA values and nodes of the graph IR (a graph, ``torchloom.ir.graph``, owns them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from torchloom.ir.types import Type

if TYPE_CHECKING:
    from torchloom.ir.graph import Graph


class Value:
    """An SSA value: a graph input (``producer is None``) or one output of a node."""

    __slots__ = ("name", "type", "producer", "index", "uses", "graph")

    def __init__(self, name: str, type: Type, producer: "Node | None" = None, index: int = 0,
                 graph: "Graph | None" = None):
        self.name, self.type, self.producer, self.index = name, type, producer, index
        self.graph = graph
        #: one entry per input slot that reads this value (a node may appear twice)
        self.uses: list[Node] = []

    def users(self) -> list["Node"]:
        """Distinct nodes reading this value, in use order."""
        return list(dict.fromkeys(self.uses))

    def __repr__(self) -> str:
        return f"%{self.name}"


class Node:
    """An operation. ``op`` is a qualified name such as ``aten.add.Tensor``."""

    __slots__ = ("op", "inputs", "attrs", "outputs", "region", "graph", "prev", "next",
                 "position", "meta")

    def __init__(self, op: str, inputs: Sequence[Value], attrs: Mapping[str, Any] | None = None,
                 region: "Graph | None" = None):
        self.op = op
        self.inputs: list[Value] = list(inputs)
        self.attrs: Mapping[str, Any] = MappingProxyType(dict(attrs or {}))
        self.outputs: list[Value] = []
        self.region = region
        self.graph: Graph | None = None
        self.prev: Node | None = None
        self.next: Node | None = None
        self.position = 0
        #: pass-private annotations; never printed, never hashed
        self.meta: dict[str, Any] = {}

    @property
    def output(self) -> Value:
        if len(self.outputs) != 1:
            raise ValueError(f"{self.op} has {len(self.outputs)} outputs, not 1")
        return self.outputs[0]

    def with_attrs(self, **changes) -> None:
        """Replace attributes (they are immutable mappings; this swaps the mapping)."""
        self.attrs = MappingProxyType({**self.attrs, **changes})

    def set_input(self, i: int, value: Value) -> None:
        old = self.inputs[i]
        old.uses.remove(self)
        self.inputs[i] = value
        value.uses.append(self)

    def users(self) -> list["Node"]:
        return list(dict.fromkeys(u for v in self.outputs for u in v.uses))

    def __repr__(self) -> str:
        outs = ", ".join(repr(v) for v in self.outputs)
        return f"<Node {outs} = {self.op}({', '.join(map(repr, self.inputs))})>"
