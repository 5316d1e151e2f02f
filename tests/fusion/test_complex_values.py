"""Complex numbers stay out of fusion groups: no native codegen renders them, so a group
holding one runs on eager whole; left out, the real ops around them fuse (FNet: a bias add
before the cast to ``c64`` its FFT reads)."""

from __future__ import annotations

import pytest
import torch

from fusion_testing import fuse_and_compare, groups

CAST_TO_COMPLEX = """
graph @g(%x: f32[4, 8], %b: f32[8]) {
  %a = aten.add.Tensor(%x, %b) : f32[4, 8]
  %e = aten.exp.default(%a) : f32[4, 8]
  %c = aten._to_copy.default(%e) {dtype = #c64} : c64[4, 8]
  %d = aten.mul.Tensor(%c, %c) : c64[4, 8]
  return %d, %e
}"""


def test_a_cast_to_complex_and_complex_arithmetic_stay_outside_the_group(registry):
    fused = fuse_and_compare(CAST_TO_COMPLEX, registry)
    (group,) = groups(fused)
    assert [n.op for n in group.region.nodes] == ["aten.add.Tensor", "aten.exp.default"]
    outside = [n.op for n in fused.nodes if n is not group]
    assert outside == ["aten._to_copy.default", "aten.mul.Tensor"]


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_a_compiled_program_around_an_fft_runs_no_group_on_eager(tmp_path, dtype):
    from torchloom.backend import torchloom_backend
    from torchloom.tools import Compiler

    def model(x, b):  # FNet's mixing: real ops, a cast, an FFT, the real part, real ops
        mixed = torch.fft.fftn((x + b).to(dtype), dim=(-2, -1)).real
        return torch.layer_norm(mixed.to(x.dtype) + x, (x.shape[-1],))

    compiler = Compiler("default", cache_dir=tmp_path, compile_cache=False)
    fn = torch.compile(model, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    x, b = torch.randn(2, 16, 32), torch.randn(32)
    try:
        torch.testing.assert_close(fn(x, b), model(x, b), rtol=1e-5, atol=1e-5)
    finally:
        torch._dynamo.reset()
    choices = [c for comp in compiler.compilations for c in comp.compiled.choices]
    assert choices and all(c.codegen != "eager" for c in choices), \
        [(c.codegen, c.fallback_reasons) for c in choices]
