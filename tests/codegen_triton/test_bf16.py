"""bf16 rounding (emitter.py): on a GPU the hardware conversion rounds (to nearest even,
as eager), once per rounding eager does, and the store's conversion is the last rounding
(no second one); the interpreter, whose conversion truncates, rounds in software and
matches eager bit for bit."""

from __future__ import annotations

import torch
from torchloom.api import parse_graph

from conftest import group_text, on_device
from torchloom_codegen_triton import TritonCodegen
from torchloom_codegen_triton.aot import compile_ahead

BIAS_GELU = group_text("%y: bf16[64, 96], %b: bf16[96]", """
    %a = aten.add.Tensor(%y, %b) : bf16[64, 96]
    %g = aten.gelu.default(%a) : bf16[64, 96]""", "%g: bf16[64, 96], %a: bf16[64, 96]")


def test_gpu_kernels_round_with_the_hardware_conversion_once_per_rounding(registry, tmp_path):
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False).for_target("sm_90")
    group = next(on_device(parse_graph(BIAS_GELU), "cuda").nodes)
    kernel = codegen.generate(group, registry)
    body = kernel.source.split("def fused")[1]
    assert "_round_to_bf16(" not in body
    # eager rounds twice (the add's result, the gelu's result); the add's rounded value
    # is stored as it is, the gelu's is rounded by the store's conversion
    assert body.count(".to(tl.bfloat16)") == 3 and body.count("tl.store(") == 2
    assert compile_ahead(kernel, 90)["cubin"][:4] == b"\x7fELF"


BIAS_SQUARE = BIAS_GELU.replace("aten.gelu.default(%a)", "aten.mul.Tensor(%a, %a)")


def test_interpreter_kernels_round_in_software_bit_exactly(check):
    g = torch.Generator().manual_seed(11)
    y = (torch.randn(64, 96, generator=g) * 3).to(torch.bfloat16)
    b = torch.randn(96, generator=g).to(torch.bfloat16)
    y[0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 3.0e38])
    _, compiled = check(BIAS_SQUARE, y, b, exact=True)
    source = check.codegen.generate(compiled.choices[0].node, check.registry).source
    body = source.split("def fused")[1]
    assert body.count("_round_to_bf16(") == 2  # once per rounding, none again at the store
