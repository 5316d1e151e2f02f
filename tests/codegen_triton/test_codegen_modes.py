"""torch.compile's max-autotune modes on the triton codegen (codegen.for_mode,
plan.wider_configs): autotuning on whatever TORCHLOOM_AUTOTUNE says, a wider search whose
first candidate is still the default, kernels cached apart, results unchanged."""

from __future__ import annotations

import pytest
import torch
from torchloom.api import parse_graph
from torchloom.runtime.executor import CompiledGraph

from conftest import group_text
from torchloom_codegen_triton import TritonCodegen

POINTWISE = group_text("%a: f32[64, 300]", "%e = aten.exp.default(%a) : f32[64, 300]",
                       "%e: f32[64, 300]")
ROWSUM = group_text("%a: f32[64, 300]",
                    "%s = aten.sum.dim_IntList(%a) {dim = [1], keepdim = false} : f32[64]",
                    "%s: f32[64]")


@pytest.mark.slow
@pytest.mark.parametrize("text, form", [(POINTWISE, "pointwise"),
                                        (ROWSUM, "persistent reduction")])
def test_max_autotune_widens_the_search_and_keeps_the_default_first(
        text, form, registry, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHLOOM_AUTOTUNE", "0")
    base = TritonCodegen(cache_dir=tmp_path)
    wide = base.for_mode("max-autotune")
    assert base.autotune is False and wide.autotune is True
    assert wide.version != base.version  # its kernels are cached apart
    assert base.for_mode("reduce-overhead") is None
    node = next(parse_graph(text).nodes)
    narrow_meta = base.generate(node, registry).metadata
    kernel = wide.generate(node, registry)
    meta = kernel.metadata
    assert narrow_meta["form"] == form
    assert kernel.source == base.generate(node, registry).source
    assert meta["configs"][:len(narrow_meta["configs"])] == narrow_meta["configs"]
    assert len(meta["configs"]) > len(narrow_meta["configs"])
    assert meta["config"] == narrow_meta["config"]
    assert len({tuple(sorted(c.items())) for c in meta["configs"]}) == len(meta["configs"])
    # every candidate launches the kernel correctly (Triton's interpreter, on the CPU)
    x = torch.randn(64, 300)
    want = x.exp() if form == "pointwise" else x.sum(1)
    compiled = CompiledGraph(parse_graph(text), registry, [wide])
    launcher = wide.load(kernel, registry)
    for config in meta["configs"]:
        launcher.config = dict(config)
        (got,) = launcher(x)
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(compiled(x)[0], want)
