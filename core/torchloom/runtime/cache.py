"""The kernel cache: compiled kernels in memory, keyed by codegen and the group's
structural hash, so groups equal up to renaming compile once per process.

(The on-disk layer — source + JSON metadata, atomic writes — belongs here too; see the
dedup issue.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchloom.codegen.base import Codegen, Kernel, compile_group
from torchloom.ir.canon import structural_hash
from torchloom.ir.graph import Node


class KernelCache:
    """Kernels by ``(codegen name, codegen version, structural hash of the region)``."""

    def __init__(self):
        self._kernels: dict[tuple[str, str, str], Kernel] = {}
        self.compiles = 0
        self.hits = 0

    @staticmethod
    def key(codegen: Codegen, group: Node) -> tuple[str, str, str]:
        return (codegen.name, str(codegen.version), structural_hash(group.region))

    def get_or_compile(self, codegen: Codegen, group: Node, registry: Any) -> Kernel:
        key = self.key(codegen, group)
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = compile_group(codegen, group, registry)
            self._kernels[key] = kernel
            self.compiles += 1
        else:
            self.hits += 1
        return kernel

    def __len__(self) -> int:
        return len(self._kernels)


__all__ = ["KernelCache", "Callable"]
