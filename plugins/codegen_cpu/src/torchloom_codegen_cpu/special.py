"""C for the special functions the cpu kernels compute where libm has none: digamma,
erfinv and the modified Bessel functions i0, i0e, i1, i1e (the prelude appends
:data:`SPECIAL`). lgamma, entr and xlog1py are libm calls in
their op rows (ops.py).

Each is written from its mathematics, not from eager's source, so values agree with eager
within a few ulp rather than bit for bit (the test compares with f32's tolerance, special
values exactly: NaN, the infinities and their signs, the poles):

- ``tl_digamma`` (double) and ``tl_digammaf`` (float): 0 gives an infinity of the sign
  opposite to the zero's, a negative integer (or -inf) NaN; a negative x reflects,
  psi(1 - x) - pi / tan(pi frac(x)) (the fraction in double: pi x would lose it); x < 10
  is raised by psi(x) = psi(x + 1) - 1 / x; psi(10) is the constant; above, the asymptotic
  series ln x - 1 / (2x) - sum B_2k / (2k x^2k), seven terms of the Bernoulli numbers.
- ``tl_erfinv`` (double; the float one computes in double and rounds): NaN outside
  [-1, 1], the infinities at its ends; Giles' rational start (2010's single precision
  approximation of erfinv in w = -ln(1 - y^2)), then Newton steps on erf(x) - y where
  |y| <= 0.5 and on erfc(x) - (1 - y) above, where 1 - y is exact and erf would have lost
  the tail.
- ``tl_i0``, ``tl_i0e``, ``tl_i1``, ``tl_i1e`` (and their float ones): at |x| <= 30 the
  power series sum (x^2 / 4)^k / (k! (k + nu)!) (times x / 2 for nu = 1), all terms
  positive; above, the asymptotic expansion e^x / sqrt(2 pi x) sum_k prod_j ((2j - 1)^2 -
  4 nu^2) / (k! (8x)^k), summed while its terms fall. e^x is taken in the result's type,
  so the float ones overflow past 88.7 as eager's do, and an infinite x gives inf * 0 =
  NaN for i0 and i1 (eager's too), 0 for the scaled ones. i1 and i1e are odd (-0.0 gives
  +0.0, as eager), i0 and i0e even.
"""

from __future__ import annotations

SPECIAL = r"""
/* digamma (psi), see special.py */
#define TL_DIGAMMA(T, S)                                                           \
  static inline T tl_digamma##S(T x) {                                             \
    if (x == 0) return copysign##S((T)INFINITY, -x);                               \
    if (x < 0) {                                                                   \
      if (x == trunc##S(x)) return (T)NAN;                                         \
      double frac = (double)x - trunc((double)x);                                  \
      T cot = (T)(3.14159265358979323846 / tan(3.14159265358979323846 * frac));   \
      return tl_digamma##S(1 - x) - cot;                                           \
    }                                                                              \
    T shift = 0;                                                                   \
    while (x < 10) {                                                               \
      shift -= 1 / x;                                                              \
      x += 1;                                                                      \
    }                                                                              \
    if (x == 10) return shift + (T)2.25175258906672110764;                         \
    T tail = 0;                                                                    \
    if (x < (T)1e17) {                                                             \
      T z = 1 / (x * x);                                                           \
      T p = (T)(1.0 / 12);                                                         \
      p = p * z + (T)(-691.0 / 32760);                                             \
      p = p * z + (T)(1.0 / 132);                                                  \
      p = p * z + (T)(-1.0 / 240);                                                 \
      p = p * z + (T)(1.0 / 252);                                                  \
      p = p * z + (T)(-1.0 / 120);                                                 \
      p = p * z + (T)(1.0 / 12);                                                   \
      tail = z * p;                                                                \
    }                                                                              \
    return shift + log##S(x) - (T)0.5 / x - tail;                                  \
  }
TL_DIGAMMA(float, f)
TL_DIGAMMA(double, )

/* erfinv, see special.py */
static inline double tl_erfinv(double y) {
  if (!(fabs(y) <= 1)) return NAN;
  if (fabs(y) == 1) return copysign(INFINITY, y);
  double a = fabs(y), w = -log((1 - a) * (1 + a)), p;
  if (w < 5) {
    w -= 2.5;
    p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w;
    p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w;
    p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
  } else {
    w = sqrt(w) - 3;
    p = -0.000200214257;
    p = 0.000100950558 + p * w;
    p = 0.00134934322 + p * w;
    p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w;
    p = -0.0076224613 + p * w;
    p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
  }
  double x = p * a;
  for (int k = 0; k < 3; k++) {  /* Newton: the derivative of erf is 2 / sqrt(pi) e^-x^2 */
    double slope = 1.12837916709551257390 * exp(-x * x);
    if (slope == 0) break;
    double miss = a <= 0.5 ? erf(x) - a : (1 - a) - erfc(x);
    x -= miss / slope;
  }
  return copysign(x, y);
}
static inline float tl_erfinvf(float y) { return (float)tl_erfinv((double)y); }

/* modified Bessel functions of the first kind, orders nu = 0 and 1, see special.py */
static inline double tl_bessel_series(double a, int nu) {  /* I_nu(a), 0 <= a <= 30 */
  double q = a * a / 4, t = nu ? a / 2 : 1, sum = t;
  for (int k = 1; k < 200 && t > sum * 1e-17; k++) {
    t *= q / (k * (double)(k + nu));
    sum += t;
  }
  return sum;
}
static inline double tl_bessel_tail(double a, int nu) {  /* e^-a sqrt(2 pi a) I_nu(a), a > 30 */
  double mu = 4.0 * nu * nu, t = 1, sum = 1;
  for (int k = 1; k < 100; k++) {
    double next = t * ((2.0 * k - 1) * (2.0 * k - 1) - mu) / (8.0 * k * a);
    if (!(fabs(next) >= 1e-17 * fabs(sum))) break;
    t = next;
    sum += t;
  }
  return sum / sqrt(6.28318530717958647692 * a);
}
/* EXP: e^a in the result's type (eager's f32 overflows with expf); SCALED: times e^-a */
#define TL_BESSEL(NAME, T, NU, ODD, SCALED, EXP)                                     \
  static inline T NAME(T x) {                                                        \
    double a = fabs((double)x), r;                                                   \
    if (a != a) return x;                                                            \
    if (a <= 30) r = tl_bessel_series(a, NU) * (SCALED ? exp(-a) : 1);               \
    else r = SCALED ? tl_bessel_tail(a, NU) : (double)(EXP((T)a) * (T)tl_bessel_tail(a, NU)); \
    return (T)(ODD && x < 0 ? -r : r);                                               \
  }
TL_BESSEL(tl_i0, double, 0, 0, 0, exp)
TL_BESSEL(tl_i0f, float, 0, 0, 0, expf)
TL_BESSEL(tl_i0e, double, 0, 0, 1, exp)
TL_BESSEL(tl_i0ef, float, 0, 0, 1, expf)
TL_BESSEL(tl_i1, double, 1, 1, 0, exp)
TL_BESSEL(tl_i1f, float, 1, 1, 0, expf)
TL_BESSEL(tl_i1e, double, 1, 1, 1, exp)
TL_BESSEL(tl_i1ef, float, 1, 1, 1, expf)
"""
