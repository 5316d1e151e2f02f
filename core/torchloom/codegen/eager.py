"""The reference codegen: runs a group's region with torch, op by op.

Its "source" is the region's IR text; loading parses it and builds the runtime's Python
plan for it, so a cached entry needs nothing but text.
"""

from __future__ import annotations

from typing import Any

from torchloom.codegen.base import Kernel, KernelSource, Reason
from torchloom.ir.graph import Node
from torchloom.ir.text import parse_graph, print_graph


class EagerCodegen:
    """Executes the region through the runtime's Python plan. Supports every group."""

    name = "eager"
    version = "1"

    def supports(self, group: Node, registry: Any) -> Reason | None:
        return None

    def generate(self, group: Node, registry: Any) -> KernelSource:
        return KernelSource(self.name, print_graph(group.region))

    def load(self, kernel: KernelSource, registry: Any) -> Kernel:
        from torchloom.runtime.executor import build_function
        return build_function(parse_graph(kernel.source), registry).fn
