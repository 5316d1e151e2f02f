"""The prelude's f16 and bf16 conversions, exhaustively against torch: every f16 bit pattern
widened, and 1M floats spread over the whole range (plus every f16 value, the overflow and
subnormal boundaries, -0.0, inf and NaN) narrowed, bit for bit. f16 has two
implementations (clang's ``_Float16``, and bit arithmetic for gcc, whose ``_Float16``
conversions never vectorize, and for compilers without it, as clang 14): both are built
and checked (with gcc, "native" is the bit arithmetic too). The rounding in place (``tl_round_*``: a
value rounded and kept in f32, after every low-precision op) is checked on the same floats
and on every midpoint between adjacent 16-bit values and its two f32 neighbours (the ties
and the values that must not tie), vectorized as the kernels use it."""

from __future__ import annotations

import ctypes
import subprocess

import pytest
import torch

from torchloom_codegen_cpu.prelude import prelude

KERNELS = r'''
void to32(const uint16_t* h, float* o, int64_t n, int bf) {
  for (int64_t i = 0; i < n; i++) o[i] = bf ? tl_bf16_to_f32(h[i]) : tl_f16_to_f32(h[i]);
}
void to16(const float* f, uint16_t* o, int64_t n, int bf) {
  for (int64_t i = 0; i < n; i++) o[i] = bf ? tl_f32_to_bf16(f[i]) : tl_f32_to_f16(f[i]);
}
void rnd(const float* f, float* o, int64_t n, int bf) {
  #pragma omp simd
  for (int64_t i = 0; i < n; i++) o[i] = bf ? tl_round_bf16(f[i]) : tl_round_f16(f[i]);
}
'''


@pytest.fixture(scope="module", params=["native", "bits"])
def conversions(request, codegen, tmp_path_factory):
    tc = codegen.toolchain()
    directory = tmp_path_factory.mktemp(f"conv-{request.param}")
    src = directory / "conv.c"
    src.write_text(prelude() + KERNELS)
    extra = ["-U__FLT16_MAX__"] if request.param == "bits" else []
    lib = directory / "conv.so"
    subprocess.run([tc.cc, *tc.flags, *extra, "-o", str(lib), str(src), *tc.libs], check=True)
    return ctypes.CDLL(str(lib))


def _floats() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    spread = torch.randn(1 << 20, generator=g) * torch.exp(torch.randn(1 << 20, generator=g) * 8)
    every_half = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
    edges = torch.tensor([65504.0, 65519.99, 65520.0, 1e-8, 2.98e-8, 5.96e-8, 6.1e-5, -0.0,
                          float("inf"), float("-inf"), float("nan"), 3.39e38, 1e-45])
    return torch.cat([spread, every_half.float(), edges])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_widening_is_exact(conversions, dtype):
    h = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype).contiguous()
    out = torch.empty(65536)
    conversions.to32(ctypes.c_void_p(h.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                     ctypes.c_int64(65536), ctypes.c_int(dtype == torch.bfloat16))
    torch.testing.assert_close(out, h.float(), rtol=0, atol=0, equal_nan=True)
    assert torch.equal(out.signbit(), h.float().signbit())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_narrowing_rounds_as_torch(conversions, dtype):
    f = _floats()
    got = torch.empty(f.numel(), dtype=torch.int16)
    conversions.to16(ctypes.c_void_p(f.data_ptr()), ctypes.c_void_p(got.data_ptr()),
                     ctypes.c_int64(f.numel()), ctypes.c_int(dtype == torch.bfloat16))
    want = f.to(dtype)
    same = (got == want.view(torch.int16)) | (got.view(dtype).isnan() & want.isnan())
    assert bool(same.all()), f[~same][:8]


def _midpoints(dtype: torch.dtype) -> torch.Tensor:
    """Every midpoint between adjacent finite values of ``dtype`` (f32 holds them exactly)
    and the next f32 below and above each."""
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype).float()
    values = bits[torch.isfinite(bits)].unique()
    mid = (values[:-1].double() + values[1:].double()).div(2).float()
    return torch.cat([mid, torch.nextafter(mid, torch.tensor(-float("inf"))),
                      torch.nextafter(mid, torch.tensor(float("inf")))])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rounding_in_place_rounds_as_torch(conversions, dtype):
    f = torch.cat([_floats(), _midpoints(dtype)]).contiguous()
    got = torch.empty_like(f)
    conversions.rnd(ctypes.c_void_p(f.data_ptr()), ctypes.c_void_p(got.data_ptr()),
                    ctypes.c_int64(f.numel()), ctypes.c_int(dtype == torch.bfloat16))
    want = f.to(dtype).float()
    same = (got.view(torch.int32) == want.view(torch.int32)) | (got.isnan() & want.isnan())
    assert bool(same.all()), (f[~same][:8], got[~same][:8], want[~same][:8])
