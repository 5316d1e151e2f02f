"""torchloom-cudagraphs: a runtime wrapper that replays a compiled graph through a CUDA graph.

Enable it in a pipeline::

    [runtime]
    cudagraphs = true

or with options::

    [runtime.cudagraphs]
    reuse_outputs = false   # true: hand out the recording's own output buffers (see Options)
    max_records = 8         # distinct input layouts recorded before recording stops
    warmup = 1              # eager calls per layout before it is recorded

A graph the wrapper cannot record safely runs the normal compiled path; the reason is
noted (``torchloom explain`` shows it) and logged once.
"""

from torchloom_cudagraphs.checks import skip_reasons
from torchloom_cudagraphs.recorder import CudaGraphRunner
from torchloom_cudagraphs.wrapper import CudaGraphs, CudaGraphsOptions

__all__ = ["CudaGraphs", "CudaGraphsOptions", "CudaGraphRunner", "skip_reasons"]
