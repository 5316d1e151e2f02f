"""Functions run in spawned child processes by the cpu codegen tests.

A spawned child imports the module that defines the function it runs; test modules import
``conftest`` by name, which in a child resolves to whichever ``conftest.py`` comes first on
the inherited ``sys.path`` (another folder's, in a whole-suite run). This module imports
nothing from the tests, so the child can always load it.
"""

from __future__ import annotations


def build_and_load(args: tuple[str, str]) -> str:
    """Build ``source`` with the cpu codegen's toolchain into ``directory``; load it."""
    import ctypes

    from torchloom_codegen_cpu.codegen import CpuCodegen
    from torchloom_codegen_cpu.toolchain import build

    source, directory = args
    codegen = CpuCodegen(cache_dir=directory)
    path = build(source, codegen.toolchain(), codegen.cache_dir, 60)
    ctypes.CDLL(str(path))
    return str(path)
