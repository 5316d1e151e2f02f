"""The reference codegen: runs a group's region with torch, op by op."""

from __future__ import annotations

from typing import Any

from torchloom.codegen.base import Kernel, Reason
from torchloom.ir.graph import Node


class EagerCodegen:
    """Executes the region through the runtime's Python plan. Supports every group."""

    name = "eager"
    version = "1"

    def supports(self, group: Node, registry: Any) -> Reason | None:
        return None

    def compile(self, group: Node, registry: Any) -> Kernel:
        from torchloom.runtime.executor import build_function
        return build_function(group.region, registry, tuple_result=True).fn

    def source(self, group: Node, registry: Any) -> str | None:
        from torchloom.runtime.executor import build_function
        return build_function(group.region, registry, tuple_result=True).source
