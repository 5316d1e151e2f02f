"""``torch.compile(model, backend="torchloom", mode=...)``: what each mode changes.

=============================  =========================================================
``default`` (or None)          the pipeline as written
``reduce-overhead``            CUDA graphs on (the runtime wrappers whose ``modes`` name
                               the mode: ``cudagraphs``, with its default options, unless
                               the pipeline configures it)
``max-autotune``               a wider autotuning search (each codegen's
                               ``for_mode(mode)`` copy, where it has one) and CUDA graphs
``max-autotune-no-cudagraphs`` the wider search only
=============================  =========================================================

As with Inductor, CUDA graphs replay only graphs that allow it; the wrapper notes why a
graph runs without them (on a CPU, every graph).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

import attrs

from torchloom.errors import PipelineError

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_CUDAGRAPHS = ("reduce-overhead", "max-autotune")
_WIDE = ("max-autotune", "max-autotune-no-cudagraphs")


def check_mode(mode: str | None) -> str:
    """``mode`` as given, ``"default"`` for None; an unknown one is an error."""
    if mode is None:
        return "default"
    if mode not in MODES:
        close = difflib.get_close_matches(str(mode), MODES, n=1)
        raise PipelineError(f"torch.compile(backend='torchloom'): unknown mode {mode!r}; "
                            f"known: {', '.join(MODES)}"
                            + (f"; did you mean {close[0]!r}?" if close else ""))
    return mode


def apply_mode(pipeline, plugins, mode: str) -> tuple[Any, list[str]]:
    """The pipeline with the runtime wrappers ``mode`` turns on (those whose ``modes``
    name it, with their default options, unless the pipeline configures them), and notes
    on what it could not turn on. The core names no wrapper: a wrapper says which modes it
    serves."""
    serving = {name: r for name, r in sorted(plugins.wrappers.items())
               if mode in getattr(r.obj, "modes", ())}
    notes = []
    if mode in _CUDAGRAPHS and not serving:
        notes.append(f"mode {mode!r} turns on CUDA graphs, but no installed runtime wrapper "
                     f"serves it (pip install torchloom-cudagraphs)")
    added = {name: r.obj.Options() for name, r in serving.items() if name not in pipeline.runtime}
    if not added:
        return pipeline, notes
    return attrs.evolve(pipeline, runtime={**pipeline.runtime, **added}), notes


def mode_codegens(chain: Sequence[Any], mode: str) -> list[Any]:
    """The codegen chain for ``mode``: for a max-autotune mode, each codegen's
    ``for_mode(mode)`` copy where it returns one (Triton: autotuning on, over every
    candidate launch configuration)."""
    if mode not in _WIDE:
        return list(chain)
    out = []
    for cg in chain:
        for_mode = getattr(cg, "for_mode", None)
        copy = for_mode(mode) if for_mode is not None else None
        out.append(copy if copy is not None else cg)
    return out
