"""aot.py: every kernel the interpreter tests run also compiles for an H100 (sm_90 cubin),
on this machine, without a GPU: the GPU path's frontend, types and lowering are checked in
CI even where no device is lent."""

from __future__ import annotations

import pytest
from torchloom.api import parse_graph

import test_kernel
import test_reduction
from torchloom_codegen_triton import TritonCodegen
from torchloom_codegen_triton.aot import compile_ahead

CASES = [(f"pointwise-{n}", text, 4096) for n, (text, _) in sorted(test_kernel.CASES.items())]
CASES += [(f"reduction-{n}-{form}", text, limit)
          for n, (text, _) in sorted(test_reduction.CASES.items())
          for form, limit in (("persistent", 4096), ("looped", 4))]


@pytest.mark.parametrize("name,text,limit", CASES, ids=[c[0] for c in CASES])
def test_kernel_compiles_for_sm90(registry, tmp_path, name, text, limit):
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False, max_persistent=limit)
    kernel = codegen.generate(next(parse_graph(text).nodes), registry)
    asm = compile_ahead(kernel, arch=90)
    assert asm["cubin"][:4] == b"\x7fELF"
    assert f".entry {kernel.metadata['kernel']}" in asm["ptx"]


def test_every_autotuning_config_compiles(registry, tmp_path):
    text = test_reduction.CASES["softmax"][0]
    kernel = TritonCodegen(cache_dir=tmp_path).generate(next(parse_graph(text).nodes), registry)
    for config in kernel.metadata["configs"]:
        assert compile_ahead(kernel, 90, config)["cubin"]
