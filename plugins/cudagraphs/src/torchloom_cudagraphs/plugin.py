"""Entry point of torchloom-cudagraphs: registers the ``cudagraphs`` runtime wrapper."""

from __future__ import annotations

from torchloom.api import hookimpl


@hookimpl
def torchloom_runtime_wrappers():
    from torchloom_cudagraphs.wrapper import CudaGraphs
    return [CudaGraphs()]
