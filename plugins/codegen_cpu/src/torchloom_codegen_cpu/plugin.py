"""Hook implementations: registers the ``cpu`` codegen."""

from __future__ import annotations

from torchloom.api import hookimpl


@hookimpl
def torchloom_codegens():
    from torchloom_codegen_cpu.codegen import CpuCodegen
    return [CpuCodegen()]
