"""The C prelude every generated translation unit starts with.

- bf16 is stored as its 16 bits: widening is a shift; narrowing rounds to nearest even
  exactly as c10::BFloat16 does (NaN becomes the quiet NaN 0x7FC0).
- f16 is stored as its 16 bits too; conversions use the compiler's ``_Float16`` where it
  has one (gcc >= 12, clang >= 15 on x86-64), else exact bit arithmetic (clang 14).
- Transcendentals: libm's calls in ``#pragma omp simd`` loops call glibc's libmvec
  variants without any fast-math flag, one variant per function on every path so that an
  element's value is the same in every loop and every kernel (``libmvec.py``). glibc
  documents libmvec's maximum error as 4 ulp, with special inputs (NaN, inf, overflow)
  handled by the scalar function; tests/codegen_cpu measure the error against eager on
  every op (see ``test_vector_math_error_bound``).
"""

from __future__ import annotations

from torchloom_codegen_cpu import libmvec
from torchloom_codegen_cpu.overrun import SHARE
from torchloom_codegen_cpu.special import SPECIAL

_INCLUDES = """\
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
"""

_TEMPLATE = """\

/* a * b + c rounded once where the CPU fuses multiply-adds, else twice. The kernels are
   built with -ffp-contract=off (toolchain.py): these are the only fused ones, where the
   prelude's polynomials were measured with them and where eager's kernels call fmadd */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
static inline float tl_fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
static inline double tl_fma(double a, double b, double c) { return __builtin_fma(a, b, c); }
#define TL_TANH_CLAMP 7.99881172180175781f
#else
static inline float tl_fmaf(float a, float b, float c) { return a * b + c; }
static inline double tl_fma(double a, double b, double c) { return a * b + c; }
#define TL_TANH_CLAMP 7.90531110763549805f
#endif

static inline float tl_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* x rounded to bf16 (nearest even, NaN -> quiet NaN), as the bits of an f32 whose low 16
   are zero. tl_round_bf16 stays in these 32-bit lanes: through uint16_t, gcc packs every
   vector to 16-bit words and widens it back (12% of a bf16 GELU kernel) */
static inline uint32_t tl_f32_to_bf16_high(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return x != x ? 0x7FC00000u : ((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u);
}

static inline uint16_t tl_f32_to_bf16(float x) { return (uint16_t)(tl_f32_to_bf16_high(x) >> 16); }

static inline float tl_round_bf16(float x) {
  const uint32_t r = tl_f32_to_bf16_high(x);
  float f;
  memcpy(&f, &r, 4);
  return f;
}

/* the bits of a bf16 value held in a float (a result table's index, tables.py) */
static inline int32_t tl_bits_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return (int32_t)(u >> 16);
}

/* result tables (tables.py): defined 1 by the toolchain where table reads vectorize */
#ifndef TL_TABLES
#define TL_TABLES 0
#endif

/* f16 is stored as its 16 bits. Conversions use clang's _Float16 where it has one (clang
   >= 15 on x86-64: F16C instructions, vectorized), else exact bit arithmetic (round to
   nearest even, NaN -> quiet NaN, subnormals kept; F. Giesen's half_to_float and
   float_to_half_fast3_rtne). gcc 12 has _Float16 but never vectorizes its conversions: a
   loop converting f16 ran scalar, an f16 exp of 2048 x 3072 took 44 ms (6 ms this way). */
#if defined(__FLT16_MAX__) && defined(__clang__)
static inline float tl_f16_to_f32(uint16_t h) {
  _Float16 v;
  memcpy(&v, &h, 2);
  return (float)v;
}
static inline uint16_t tl_f32_to_f16(float x) {
  _Float16 v = (_Float16)x;
  uint16_t h;
  memcpy(&h, &v, 2);
  return h;
}
static inline float tl_round_f16(float x) { return (float)(_Float16)x; }
#else
/* the conversions on the 16 bits held in a uint32_t (see tl_round_f16). Widening: the
   exponent and mantissa bits moved to f32's places read as a float 2^112 too small
   (f16 subnormals as f32 subnormals) and one exact multiplication by 2^112 (F. Giesen's
   half_to_float_fast2); inf and NaN, which it leaves at >= 2^16, get the all-ones
   exponent back. */
static inline float tl_f16_bits_to_f32(uint32_t h) {
  const uint32_t o = (h & 0x7fffu) << 13;
  float f;
  memcpy(&f, &o, 4);
  f *= 5.192296858534828e+33f; /* 2^112 */
  uint32_t r;
  memcpy(&r, &f, 4);
  r = f >= 65536.0f ? r | 0x7f800000u : r;
  r |= (h & 0x8000u) << 16;
  memcpy(&f, &r, 4);
  return f;
}
static inline uint32_t tl_f32_to_f16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  const uint32_t magic_bits = (uint32_t)((127 - 15) + (23 - 10) + 1) << 23;
  float magic, a;
  memcpy(&magic, &magic_bits, 4);
  memcpy(&a, &u, 4);
  a += magic;
  uint32_t sub;
  memcpy(&sub, &a, 4);
  sub -= magic_bits;
  const uint32_t norm = (u + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
  uint32_t o = u >= (uint32_t)(127 + 16) << 23 ? (u > 0x7f800000u ? 0x7e00u : 0x7c00u)
               : (u < 113u << 23 ? sub : norm);
  return o | (sign >> 16);
}
static inline float tl_f16_to_f32(uint16_t h) { return tl_f16_bits_to_f32(h); }
static inline uint16_t tl_f32_to_f16(float x) { return (uint16_t)tl_f32_to_f16_bits(x); }
/* x rounded to f16 and back without the conversions (9 vector operations where they take
   ~20): |x| + c - c with c a power of two whose ulp is the f16 ulp at |x| (2^(e + 13), at
   least 2^-1 for f16's subnormal range), so the f32 addition rounds to nearest even on the
   f16 grid; |x| >= 65520 (and inf) is inf, NaN stays NaN, the sign is put back. Bit for
   bit tl_f16_bits_to_f32(tl_f32_to_f16_bits(x)) over all 2^32 floats (NaN as NaN; tested
   by tests/codegen_cpu/test_conversions.py on every f16 value, the midpoints and the
   edges). No multiplication: contraction to an fma cannot change it. */
static inline float tl_round_f16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint32_t ua = u & 0x7fffffffu;
  float a;
  memcpy(&a, &ua, 4);
  uint32_t cb = (ua & 0x7f800000u) + (13u << 23);
  cb = cb > 0x3f000000u ? cb : 0x3f000000u;
  float c;
  memcpy(&c, &cb, 4);
  float r = (a + c) - c;
  r = a >= 65520.0f ? INFINITY : r;
  uint32_t ru;
  memcpy(&ru, &r, 4);
  ru |= u & 0x80000000u;
  memcpy(&r, &ru, 4);
  return r;
}
#endif

/* erf for GELU: a rational approximation on [-4, 4] (beyond it erf rounds to +-1 in f32),
   about twice as fast as libmvec's erff; max abs error 3.5e-7 over every float (measured,
   and tested against double precision in tests/codegen_cpu/test_vector_math.py). |a| is
   clamped to 4 on its bits (an integer min: one instruction where a float select costs
   several), so NaN gives +-1: GELU and its gradient multiply by x, which keeps the NaN;
   -0.0 stays -0.0. */
static inline float tl_erf_fast(float a) {
  uint32_t u;
  memcpy(&u, &a, 4);
  uint32_t m = u & 0x7fffffffu;
  m = (m < 0x40800000u ? m : 0x40800000u) | (u & 0x80000000u);
  float x;
  memcpy(&x, &m, 4);
  const float x2 = x * x;
@ERF_RATIONAL@  return x * p / q;
}

/* e^x in f32, inline so SIMD loops need no call: Cody-Waite reduction x = n ln2 + r
   (|r| <= ln2 / 2), Cephes' degree-6 polynomial, then 2^n applied as two powers of two so
   that results in the subnormal range round once and e^88.7.. still overflows to inf. Max
   error 1.03 ulp against exp in double over every float (measured exhaustively; sampled in
   tests/codegen_cpu/test_vector_math.py); libmvec's expf is documented at 4 ulp and is a
   call per vector. x < -104 gives +0.0, x > 89 +inf (x is clamped there first, which also
   maps -inf and +inf); NaN stays NaN (the clamp's comparisons are false for it).
   tl_exp_core: p(r) for a clamped x, and the float whose low bits hold n (bits - 0x4B400000). */
static inline float tl_exp_core(float xc, int32_t* n_bits) {
  const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  const float t = tl_fmaf(xc, 1.44269504088896341f, shifter);
  const float n = t - shifter;
  float r = tl_fmaf(n, -0.693359375f, xc);
  r = tl_fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = tl_fmaf(p, r, 1.3981999507e-3f);
  p = tl_fmaf(p, r, 8.3334519073e-3f);
  p = tl_fmaf(p, r, 4.1665795894e-2f);
  p = tl_fmaf(p, r, 1.6666665459e-1f);
  p = tl_fmaf(p, r, 5.0000001201e-1f);
  memcpy(n_bits, &t, 4);
  return tl_fmaf(p * r, r, r) + 1.0f;
}

static inline float tl_exp(float x) {
  const float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  int32_t bits;
  const float y = tl_exp_core(xc, &bits);
  /* t = n + 254 (n in [-150, 129]); h = t >> 1 = (n >> 1) + 127, the first factor's
     biased exponent, t - h the second's: 5 integer operations where n, its halves and
     their biases took 7 (bit for bit the same over every float; ~2.5% of an exp kernel) */
  const int32_t t = bits - (0x4B400000 - 254);
  const int32_t h = t >> 1;
  const uint32_t b1 = (uint32_t)h << 23, b2 = (uint32_t)(t - h) << 23;
  float s1, s2;
  memcpy(&s1, &b1, 4);
  memcpy(&s2, &b2, 4);
  return y * s1 * s2;
}

/* tl_exp for an argument known to be <= 0 or NaN (softmax's x - max(x)), bit for bit:
   no upper clamp, and n in [-150, 0] lets 2^n be one power of two, 2^(n + 64) (a normal
   float: the product with p(r) is exact), times 2^-64 (the one rounding, as tl_exp's second
   factor): 6 vector operations fewer, ~18% of a softmax row on AVX-512. */
static inline float tl_exp_nonpos(float x) {
  const float xc = x < -104.0f ? -104.0f : x;
  int32_t bits;
  const float y = tl_exp_core(xc, &bits);
  /* (bits - 0x4B400000 + 127 + 64) << 23, where 0x4B400000 << 23 wraps to 0 */
  const uint32_t b = (uint32_t)(bits + 191) << 23;
  float s;
  memcpy(&s, &b, 4);
  return y * s * 5.42101086242752217e-20f; /* 2^-64 */
}

/* tanh in f32: an odd rational x P(x^2) / Q(x^2) (degrees 13 and 6, Eigen's
   coefficients for ptanh_float) on |x| clamped to TL_TANH_CLAMP, where the rational gives
   exactly 1: 7.9988117 with fused multiply-adds, 7.9053111 without (Eigen's two clamps;
   between them the fused rational is 1 - 4 ulp, tanh itself 1 - 4.5 ulp), one
   division and 13 vector operations where libmvec's tanhf is a call per vector (a 12 MB
   tanh kernel 1.41 -> 1.12 ms on the Intel Xeon of RESULTS.md, eager's Sleef 1.10). Within
   4.9 ulp of tanh in double over every float (measured exhaustively; libmvec's: 2.2), and
   below 2^-8 the series x - x^3/3 as before (correctly rounded but for ties, |tanh(x)| <=
   |x|: eager's bits there). The clamp `c < a ? c : a` keeps a NaN (its comparison is
   false); the sign is x's (-0.0 stays -0.0, +-inf gives +-1, NaN stays NaN). */
static inline float tl_tanh(float x) {
  float a = fabsf(x);
  a = TL_TANH_CLAMP < a ? TL_TANH_CLAMP : a;
  const float s = a * a;
@TANH_RATIONAL@  const float r = a < 0x1p-8f ? tl_fmaf(a, s * (-1.0f / 3.0f), a) : a * p / q;
  return copysignf(r, x);
}

/* erf as eager computes it for bf16/f16 (Abramowitz & Stegun 7.1.26, absolute error
   1.5e-7): ``sign(x) * (1 - r(t) * t * exp(-x * x))`` with ``t = 1 / (1 + p|x|)``. It is
   zero below |x| ~ 1.8e-7, where the exact erf is not, and later ops (sqrt, log) see that
   zero's sign: the low-precision erf follows eager, f32 and f64 use libm's. */
static inline float tl_erf_as(float x) {
  const float a = fabsf(x);
  const float t = 1.0f / tl_fmaf(0.3275911f, a, 1.0f);
  float r = tl_fmaf(1.061405429f, t, -1.453152027f);
  r = tl_fmaf(r, t, 1.421413741f);
  r = tl_fmaf(r, t, -0.284496736f);
  r = tl_fmaf(r, t, 0.254829592f);
  const float y = tl_fmaf(-(r * t), expf(-(x * x)), 1.0f);
  return copysignf(y, x);
}

/* GELU in f32 (exact form, x Phi(x)): tl_erf_fast's rational with x / sqrt(2) folded into
   its coefficients (prelude.py: _GELU_P, _GELU_Q), so a vector of 16 costs 18 operations where
   erf then GELU cost 27 (the division is the one left; on the Intel Xeon of RESULTS.md
   vdivps bounds the kernel). |x| is clamped at
   4 sqrt(2) (erf(4) rounds to 1) on its bits, as tl_erf_fast does (an integer min, where the
   float comparisons cost 7 vector operations of 28: 5% of the kernel); NaN becomes
   +-4 sqrt(2) there and stays NaN through the final x *. tl_gelu_erf is erf(x / sqrt 2);
   at the clamp it is 1 + 5e-8 in magnitude, so 1 + erf is kept >= 0 (GELU of a large
   negative x is then -0.0, and -inf gives NaN). Three forms, one per way eager's vectorized
   kernels treat special values (ops.py: GELU_FORMS, told by probing eager): tl_gelu_f32
   gives NaN at +inf and applies 0.5 last (inf above FLT_MAX / 2), as eager on AVX-512;
   tl_gelu_f32_fma is x/2 erf + x/2 with erf clamped to [-1, 1] (+0.0 at large negative x),
   eager's f32 on AVX2; tl_gelu_f32_half_first is x/2 (1 + erf), eager's bf16 on AVX2.
   Within 4 ulp + 2e-7 |x| of x Phi(x) in double (tests/codegen_cpu/test_vector_math.py). */
static inline float tl_gelu_ratio(float x, float* zp) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint32_t m = u & 0x7fffffffu;
  m = (m < 0x40B504F3u ? m : 0x40B504F3u) | (u & 0x80000000u); /* 0x40B504F3: 5.65685425f */
  float z;
  memcpy(&z, &m, 4);
  const float s = z * z;
@GELU_RATIONAL@  *zp = z;
  return p / q;
}

static inline float tl_gelu_erf(float x) {
  float z;
  const float w = tl_gelu_ratio(x, &z);
  return z * w;
}

/* 1 + tl_gelu_erf(x), rounded once */
static inline float tl_gelu_erf1(float x) {
  float z;
  const float w = tl_gelu_ratio(x, &z);
  return tl_fmaf(z, w, 1.0f);
}

static inline float tl_gelu_f32(float x) {
  /* 1 + erf, at least 0 */
  const float e1 = tl_gelu_erf1(x);
  const float y = x * (e1 > 0.0f ? e1 : 0.0f) * 0.5f;
  return x == INFINITY ? NAN : y;
}

static inline float tl_gelu_f32_fma(float x) {
  const float e = tl_gelu_erf(x);
  const float h = x * 0.5f;
  return h * (e > 1.0f ? 1.0f : e < -1.0f ? -1.0f : e) + h;
}

static inline float tl_gelu_f32_half_first(float x) {
  const float e1 = tl_gelu_erf1(x);
  return x * 0.5f * (e1 > 0.0f ? e1 : 0.0f);
}

/* floor division of floats exactly as eager's div_floor_floating (Python semantics) */
#define TL_DIV_FLOOR(T, SUFFIX)                                                    \
  static inline T tl_div_floor##SUFFIX(T a, T b) {                                \
    if (b == 0) return a / b;                                                     \
    T mod = fmod##SUFFIX(a, b);                                                   \
    T div = (a - mod) / b;                                                        \
    if (mod != 0 && (b < 0) != (mod < 0)) div -= (T)1;                            \
    if (div == 0) return copysign##SUFFIX((T)0, a / b);                           \
    T floordiv = floor##SUFFIX(div);                                              \
    return div - floordiv > (T)0.5 ? floordiv + (T)1 : floordiv;                  \
  }
TL_DIV_FLOOR(float, f)
TL_DIV_FLOOR(double, )

/* float -> int as eager converts on x86 (cvtt*: NaN, inf and out-of-range values give the
   most negative value; narrower ints wrap from int32): C leaves those undefined, and gcc
   made 0 of a NaN in some fused chains */
static inline int32_t tl_f2i32(float x) {
  return x >= -2147483648.0f && x < 2147483648.0f ? (int32_t)x : INT32_MIN;
}
static inline int32_t tl_d2i32(double x) {
  return x > -2147483649.0 && x < 2147483648.0 ? (int32_t)x : INT32_MIN;
}
static inline int64_t tl_f2i64(float x) {
  return x >= -9223372036854775808.0f && x < 9223372036854775808.0f ? (int64_t)x : INT64_MIN;
}
static inline int64_t tl_d2i64(double x) {
  return x >= -9223372036854775808.0 && x < 9223372036854775808.0 ? (int64_t)x : INT64_MIN;
}

/* the sign bit (NaN's too) */
static inline _Bool tl_signbitf(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return (u >> 31) != 0;
}
static inline _Bool tl_signbit(double x) {
  uint64_t u;
  memcpy(&u, &x, 8);
  return (u >> 63) != 0;
}

/* Python's remainder of floats exactly as eager's (fmod, moved into b's sign) */
#define TL_REMAINDER(T, SUFFIX)                                                    \
  static inline T tl_remainder##SUFFIX(T a, T b) {                                \
    T mod = fmod##SUFFIX(a, b);                                                   \
    return mod != 0 && (b < 0) != (mod < 0) ? mod + b : mod;                      \
  }
TL_REMAINDER(float, f)
TL_REMAINDER(double, )

/* the same for bf16 and f16: eager runs div_floor_floating on c10::BFloat16 / c10::Half,
   every step rounded to the type (R); fmod and floor are exact there */
#define TL_DIV_FLOOR_LOW(NAME, R)                                                  \
  static inline float NAME(float a, float b) {                                    \
    if (b == 0) return R(a / b);                                                  \
    float mod = fmodf(a, b);                                                      \
    float div = R(R(a - mod) / b);                                                \
    if (mod != 0 && (b < 0) != (mod < 0)) div = R(div - 1.0f);                    \
    if (div == 0) return copysignf(0.0f, R(a / b));                               \
    float floordiv = floorf(div);                                                 \
    return R(div - floordiv) > 0.5f ? R(floordiv + 1.0f) : floordiv;              \
  }
TL_DIV_FLOOR_LOW(tl_div_floor_bf16, tl_round_bf16)
TL_DIV_FLOOR_LOW(tl_div_floor_f16, tl_round_f16)
"""


#: tl_erf_fast's rational: erf(x) = x P(x^2) / Q(x^2) on [-4, 4], coefficients of x^0 first
_ERF_P = (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04,
          -5.69250639462346e-05, -2.10102402082508e-06, 2.77068142495902e-08,
          -2.72614225801306e-10)
_ERF_Q = (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03,
          -2.13374055278905e-04, -1.45660718464996e-05)
#: the same rational for GELU's 0.5 erf(z / sqrt(2)) = z P'(z^2) / Q'(z^2): x / sqrt(2)
#: and 0.5 folded in, normalised so that Q'(0) = 1
_GELU_P = tuple(c * 0.5 ** k * 2 ** -0.5 / _ERF_Q[0] for k, c in enumerate(_ERF_P))
_GELU_Q = tuple(c * 0.5 ** k / _ERF_Q[0] for k, c in enumerate(_ERF_Q))
#: tl_tanh's rational: tanh(x) = x P(x^2) / Q(x^2) on [-7.9, 7.9] (Eigen's ptanh_float)
_TANH_P = (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05,
           5.12229709037114e-08, -8.60467152213735e-11, 2.00018790482477e-13,
           -2.76076847742355e-16)
_TANH_Q = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04,
           1.19825839466702e-06)


def _horner(var: str, arg: str, coefficients: tuple[float, ...], digits: int) -> str:
    """C statements evaluating the polynomial into ``float var`` (Horner's rule, in f32)."""
    c = [f"{x:.{digits}e}f" for x in reversed(coefficients)]
    lines = [f"  float {var} = tl_fmaf({arg}, {c[0]}, {c[1]});"]
    lines += [f"  {var} = tl_fmaf({arg}, {var}, {x});" for x in c[2:]]
    return "\n".join(lines) + "\n"


_HEADER = _TEMPLATE.replace(
    "@ERF_RATIONAL@", _horner("p", "x2", _ERF_P, 14) + _horner("q", "x2", _ERF_Q, 14)).replace(
    "@GELU_RATIONAL@", _horner("p", "s", _GELU_P, 9) + _horner("q", "s", _GELU_Q, 9)).replace(
    "@TANH_RATIONAL@", _horner("p", "s", _TANH_P, 14) + _horner("q", "s", _TANH_Q, 14))


def prelude() -> str:
    """The prelude: libmvec's block (:func:`libmvec.declarations`) first, so its macros
    reach every later call of a libm function."""
    return _INCLUDES + libmvec.declarations() + _HEADER + SPECIAL + SHARE
