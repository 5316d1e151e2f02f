"""The codegen protocol: how a region node (fusion group) becomes a callable kernel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import attrs

from torchloom.ir.graph import Node

#: a compiled group: called with the group's inputs, returns a tuple of its outputs
Kernel = Callable[..., tuple]


@attrs.frozen
class Reason:
    """Why a codegen will not take a group; shown by ``explain``."""

    codegen: str
    message: str

    def __str__(self) -> str:
        return f"{self.codegen}: {self.message}"


@runtime_checkable
class Codegen(Protocol):
    """A code generator for region nodes. Registered through ``torchloom_codegens``."""

    name: str
    version: str

    def supports(self, group: Node, registry: Any) -> Reason | None:
        """None if this codegen can compile ``group``; otherwise the reason it cannot."""

    def compile(self, group: Node, registry: Any) -> Kernel:
        """A callable running the group's region: ``kernel(*inputs) -> tuple(outputs)``."""

    def source(self, group: Node, registry: Any) -> str | None:
        """Readable source of the kernel for dumps (None when there is none)."""
