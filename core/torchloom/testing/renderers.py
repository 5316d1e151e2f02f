"""Checking a renderer (docs/writing-a-codegen.md) group by group against eager."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchloom.codegen.contract import Lowered, Renderer, Schedule
from torchloom.codegen.eager import EagerCodegen
from torchloom.codegen.lower import RendererCodegen, lower
from torchloom.ir.text import parse_graph
from torchloom.runtime.executor import CompiledGraph


def lowered_against_eager(renderer: Renderer, registry: Any, text: str,
                          inputs: Sequence[Any], rtol: float = 1.3e-6,
                          atol: float = 1e-5) -> Lowered:
    """The graph of ``text`` compiled with ``renderer`` (every group must be taken by it,
    eager's codegen standing behind), run on ``inputs`` and compared with eager's run:
    the same shapes and dtypes, values within ``rtol``/``atol`` (NaN where eager has NaN);
    returns the lowering of its first group, for a test to read its structure."""
    codegen = RendererCodegen(renderer)
    compiled = CompiledGraph(parse_graph(text), registry, [codegen, EagerCodegen()])
    taken = [c.codegen for c in compiled.choices]
    assert taken == [renderer.name] * len(taken), compiled.choices
    got = compiled(*inputs)
    want = CompiledGraph(parse_graph(text), registry, [EagerCodegen()])(*inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)
    group = next(parse_graph(text).nodes)
    return lower(group, registry, Schedule.of(group), renderer)
