"""The ``cudagraphs`` runtime wrapper: the object the ``torchloom_runtime_wrappers`` hook
returns. ``[runtime] cudagraphs = true`` in a pipeline enables it with default options;
``[runtime.cudagraphs]`` sets them.

``declines`` runs the static checks of :mod:`torchloom_cudagraphs.checks` on the graph the
pipeline produced; the compiler asks it before making the plan. When one fails the graph
is not wrapped (and its plan keeps donating inputs), and the reason is noted for
``torchloom explain`` and logged once, as a warning where the pipeline turned the wrapper
on, at INFO where ``mode="reduce-overhead"`` did (on a CPU no graph records)::

    cudagraphs: @graph0 runs without CUDA graphs: graph input %x is on cpu; CUDA graphs
    record only CUDA work

Otherwise ``wrap`` returns a :class:`~torchloom_cudagraphs.recorder.CudaGraphRunner` (it
checks again for a caller that did not ask).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import ClassVar

import attrs
import torch

from torchloom_cudagraphs.checks import input_aliases, skip_reasons
from torchloom_cudagraphs.recorder import CudaGraphRunner

log = logging.getLogger("torchloom.cudagraphs")


def cuda_available() -> bool:
    return torch.cuda.is_available()


@attrs.frozen
class CudaGraphsOptions:
    """Options of ``[runtime.cudagraphs]``.

    - ``reuse_outputs``: return the recording's own output tensors instead of copies.
      Saves one copy per output per call, but the next replay overwrites what the
      previous call returned: only for callers that consume each result before calling
      again (and do not keep it, e.g. for a later backward).
    - ``max_records``: recordings per compiled graph (one per input layout, plus one per
      static input that moved); beyond it new layouts run without CUDA graphs.
    - ``warmup``: normal calls per layout before recording it (at least 1: lazy
      initialisation such as cuBLAS handles or Triton autotuning cannot be captured, and
      two calls are needed to see which inputs keep their address).
    """

    reuse_outputs: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    max_records: int = attrs.field(default=8, validator=[attrs.validators.instance_of(int),
                                                         attrs.validators.ge(1)])
    warmup: int = attrs.field(default=1, validator=[attrs.validators.instance_of(int),
                                                    attrs.validators.ge(1)])


class CudaGraphs:
    """Replays a compiled graph through CUDA graphs when that is safe."""

    name: ClassVar[str] = "cudagraphs"
    Options: ClassVar[type] = CudaGraphsOptions
    #: torch.compile modes that turn it on, as they turn on Inductor's CUDA graphs
    modes: ClassVar[tuple[str, ...]] = ("reduce-overhead", "max-autotune")

    def declines(self, graph, options: CudaGraphsOptions, ctx) -> str | None:
        """Why ``graph`` would run without CUDA graphs (the compiler then does not wrap
        it, notes this and keeps the plan's input donation), or None."""
        del options
        reasons = skip_reasons(graph, ctx.registry)
        if not reasons and not cuda_available():
            reasons = ["CUDA is not available on this machine"]
        if reasons:
            return f"cudagraphs: @{graph.name} runs without CUDA graphs: {'; '.join(reasons)}"
        return None

    def wrap(self, fn: Callable[..., tuple], options: CudaGraphsOptions, ctx,
             compiled) -> Callable[..., tuple]:
        graph = compiled.graph
        message = self.declines(graph, options, ctx)
        if message is not None:  # (a caller that did not ask first)
            ctx.note(message)
            log.warning("torchloom: %s", message)
            return fn
        ctx.note(f"cudagraphs: @{graph.name} is replayed through CUDA graphs "
                 f"(reuse_outputs={options.reuse_outputs}, max_records={options.max_records})")
        aliases = {k: j for k, (j, _) in input_aliases(graph, ctx.registry).items()}
        return CudaGraphRunner(fn, reuse_outputs=options.reuse_outputs,
                               max_records=options.max_records, warmup=options.warmup,
                               name=graph.name, aliases=aliases, note=ctx.note)


__all__ = ["CudaGraphs", "CudaGraphsOptions"]
