#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float tl_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t tl_f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return x != x ? (uint16_t)0x7FC0 : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline float tl_round_bf16(float x) { return tl_bf16_to_f32(tl_f32_to_bf16(x)); }

/* f16 is stored as its 16 bits. Conversions use the compiler's _Float16 where it has one
   (gcc >= 12, clang >= 15 on x86-64: F16C instructions), else exact bit arithmetic
   (round to nearest even, NaN -> quiet NaN, subnormals kept; F. Giesen's half_to_float
   and float_to_half_fast3_rtne). */
#if defined(__FLT16_MAX__)
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
#else
static inline float tl_f16_to_f32(uint16_t h) {
  uint32_t o = (uint32_t)(h & 0x7fffu) << 13;
  const uint32_t exp = o & 0x0f800000u;
  o += (uint32_t)(127 - 15) << 23;
  float f, magic;
  const uint32_t magic_bits = 113u << 23;
  memcpy(&magic, &magic_bits, 4);
  const uint32_t special = o + ((uint32_t)(128 - 16) << 23);
  const uint32_t tiny_bits = o + (1u << 23);
  float tiny;
  memcpy(&tiny, &tiny_bits, 4);
  tiny -= magic;
  uint32_t tiny_u;
  memcpy(&tiny_u, &tiny, 4);
  o = exp == 0x0f800000u ? special : (exp == 0 ? tiny_u : o);
  o |= (uint32_t)(h & 0x8000u) << 16;
  memcpy(&f, &o, 4);
  return f;
}
static inline uint16_t tl_f32_to_f16(float x) {
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
  return (uint16_t)(o | (sign >> 16));
}
#endif
static inline float tl_round_f16(float x) { return tl_f16_to_f32(tl_f32_to_f16(x)); }

/* erf for GELU: a rational approximation on [-4, 4] (beyond it erf rounds to +-1 in f32),
   about twice as fast as libmvec's erff; max abs error 3.5e-7 over every float (measured,
   and tested against double precision in tests/codegen_cpu/test_vector_math.py). NaN passes
   through the clamp; -0.0 stays -0.0. */
static inline float tl_erf_fast(float a) {
  const float x = a > 4.0f ? 4.0f : (a < -4.0f ? -4.0f : a);
  const float x2 = x * x;
  float p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
  p = x2 * p + -2.10102402082508e-06f;
  p = x2 * p + -5.69250639462346e-05f;
  p = x2 * p + -7.34990630326855e-04f;
  p = x2 * p + -2.95459980854025e-03f;
  p = x2 * p + -1.60960333262415e-02f;
  float q = x2 * -1.45660718464996e-05f + -2.13374055278905e-04f;
  q = x2 * q + -1.68282697438203e-03f;
  q = x2 * q + -7.37332916720468e-03f;
  q = x2 * q + -1.42647390514189e-02f;
  return x * p / q;
}

/* erf as eager computes it for bf16/f16 (Abramowitz & Stegun 7.1.26, absolute error
   1.5e-7): ``sign(x) * (1 - r(t) * t * exp(-x * x))`` with ``t = 1 / (1 + p|x|)``. It is
   zero below |x| ~ 1.8e-7, where the exact erf is not, and later ops (sqrt, log) see that
   zero's sign: the low-precision erf follows eager, f32 and f64 use libm's. */
static inline float tl_erf_as(float x) {
  const float a = fabsf(x);
  const float t = 1.0f / (0.3275911f * a + 1.0f);
  const float r = (((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f)
                  * t + 0.254829592f;
  const float y = -(r * t) * expf(-(x * x)) + 1.0f;
  return copysignf(y, x);
}

/* NaN where x is +inf, y elsewhere: a function, so y is computed unconditionally and a
   libm call in it does not need a masked SIMD variant */
static inline float tl_nan_at_inf(float x, float y) { return x == INFINITY ? NAN : y; }

/* floor division of floats exactly as eager's div_floor_floating (Python semantics) */
#define TL_DIV_FLOOR(T, SUFFIX)                                                      static inline T tl_div_floor##SUFFIX(T a, T b) {                                    if (b == 0) return a / b;                                                         T mod = fmod##SUFFIX(a, b);                                                       T div = (a - mod) / b;                                                            if (mod != 0 && (b < 0) != (mod < 0)) div -= (T)1;                                if (div == 0) return copysign##SUFFIX((T)0, a / b);                               T floordiv = floor##SUFFIX(div);                                                  return div - floordiv > (T)0.5 ? floordiv + (T)1 : floordiv;                    }
TL_DIV_FLOOR(float, f)
TL_DIV_FLOOR(double, )

#if defined(TL_LIBMVEC) && defined(__x86_64__) && defined(_OPENMP)
#pragma omp declare simd notinbranch
extern float expf(float);
#pragma omp declare simd notinbranch
extern double exp(double);
#pragma omp declare simd notinbranch
extern float exp2f(float);
#pragma omp declare simd notinbranch
extern double exp2(double);
#pragma omp declare simd notinbranch
extern float expm1f(float);
#pragma omp declare simd notinbranch
extern double expm1(double);
#pragma omp declare simd notinbranch
extern float logf(float);
#pragma omp declare simd notinbranch
extern double log(double);
#pragma omp declare simd notinbranch
extern float log2f(float);
#pragma omp declare simd notinbranch
extern double log2(double);
#pragma omp declare simd notinbranch
extern float log10f(float);
#pragma omp declare simd notinbranch
extern double log10(double);
#pragma omp declare simd notinbranch
extern float log1pf(float);
#pragma omp declare simd notinbranch
extern double log1p(double);
#pragma omp declare simd notinbranch
extern float sinf(float);
#pragma omp declare simd notinbranch
extern double sin(double);
#pragma omp declare simd notinbranch
extern float cosf(float);
#pragma omp declare simd notinbranch
extern double cos(double);
#pragma omp declare simd notinbranch
extern float tanf(float);
#pragma omp declare simd notinbranch
extern double tan(double);
#pragma omp declare simd notinbranch
extern float tanhf(float);
#pragma omp declare simd notinbranch
extern double tanh(double);
#pragma omp declare simd notinbranch
extern float erff(float);
#pragma omp declare simd notinbranch
extern double erf(double);
#endif

/* torchloom cpu kernel for this group:
 *   graph @group0(%a: f32[4, 6], %b: f32[24], %c: f32[6]) {
 *     %v = aten.view.default(%b) {size = [4, 6]} : f32[4, 6]
 *     %t = aten.t.default(%v) : f32[6, 4]
 *     %u = aten.transpose.int(%t) {dim0 = 0, dim1 = 1} : f32[4, 6]
 *     %q = aten.unsqueeze.default(%c) {dim = 0} : f32[1, 6]
 *     %e = aten.expand.default(%q) {size = [4, 6]} : f32[4, 6]
 *     %s = aten.add.Tensor(%a, %u) : f32[4, 6]
 *     %g = aten.gelu.default(%s) : f32[4, 6]
 *     %m = aten.mul.Tensor(%g, %e) : f32[4, 6]
 *     return %m
 *   }
 * pointwise over 4 rows */
void fused_add_gelu_mul_19d900c3ee(const float* restrict in_a, const float* restrict in_b, const float* restrict in_c, float* restrict out_m, int nthreads) {
  (void)nthreads;
  for (int64_t x = 0; x < 4; x++) {
    #pragma omp simd
    for (int64_t j = 0; j < 6; j++) {
      const float a1 = in_a[x * 6 + j];
      const float b2 = in_b[x * 6 + j];
      const float add3 = a1 + b2;
      const float gelu4 = tl_nan_at_inf(add3, (float)0.5 * add3 * ((float)1 + tl_erf_fast(add3 * ((float)0.70710678118654752440))));
      const float c5 = in_c[j];
      const float mul6 = gelu4 * c5;
      out_m[x * 6 + j] = mul6;
    }
  }
}
