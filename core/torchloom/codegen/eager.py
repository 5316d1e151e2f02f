"""The reference codegen: runs a group's region with torch, op by op.

Its "source" is the region's IR text; loading parses it into a :class:`RegionKernel`,
which the plan builder (:mod:`torchloom.codegen.plan`) inlines into the enclosing plan (so
the group adds no call of its own, and decomposed composites in it run whole again, as eager
runs them). A cached entry needs nothing but text.
"""

from __future__ import annotations

from typing import Any

from torchloom.codegen.base import Kernel, KernelSource, Reason, RegionKernel
from torchloom.ir.graph import Node
from torchloom.ir.text import parse_graph, print_graph


class EagerCodegen:
    """Executes the region through the Python plan. Supports every group."""

    name = "eager"
    version = "2"

    def takes_device(self, device: str) -> bool:
        """Every device's groups (the last codegen of every chain)."""
        return True

    def supports(self, group: Node, registry: Any) -> Reason | None:
        return None

    def generate(self, group: Node, registry: Any) -> KernelSource:
        return KernelSource(self.name, print_graph(group.region))

    def load(self, kernel: KernelSource, registry: Any) -> Kernel:
        from torchloom.codegen.plan import build_function
        graph = parse_graph(kernel.source)
        return RegionKernel(graph, lambda: build_function(graph, registry).fn)
