"""Hook implementations: registers the ``triton`` codegen."""

from __future__ import annotations

from torchloom.api import hookimpl


@hookimpl
def torchloom_codegens():
    from torchloom_codegen_triton.codegen import TritonCodegen
    return [TritonCodegen()]
