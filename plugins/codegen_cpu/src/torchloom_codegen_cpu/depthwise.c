/* The backward of a depthwise 2-D convolution of f32 tensors whose channels are contiguous
   (channels-last): the input's gradient and the weight's (depthwise.py calls these; its
   doc says when; the forward is eager's op).

   Shapes: input [N, H, W, C] and output (its gradient) [N, OH, OW, C] (element strides
   of n, h and w in g[], channel stride 1), weight [C, 1, KH, KW] (strides of c, kh and
   kw in g[]), read as wt[KH * KW][C] (tl_dw_taps). Element (n, oh, ow, c) of the output reads input
   (n, oh * sh - ph + kh * dh, ow * sw - pw + kw * dw, c). One array g[] (below) holds the
   sizes and strides: one argument to convert per call.

   The channels are the inner loop, in blocks of TL_DW_LANES (a literal count gcc
   vectorizes; the last block of a channel count that is no multiple of it is a loop of
   its own). Products are added by fused multiply-adds (fmaf, as oneDNN's kernels: one
   rounding each). Sums: an input gradient element's products in f32 (as eager's); the weight's
   gradient over N * OH * OW products is summed in f32 over a few rows (at least
   TL_DW_BATCH output pixels), then in double across those and threads, so a large image
   loses no more than a few rows' rounding.
   Threads split the rows (n, oh) of the output's gradient (weight gradient) or of the
   input (input gradient). */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define TL_DW_LANES 16

/* g[]: N, H, W, C, OH, OW, KH, KW, strides, paddings, dilations (h, w each), then the
   n, h, w strides of the call's first and second tensor (G_A, G_B: each function says
   which) and the c, kh, kw strides of the weight (or of the weight's gradient: G_WC) */
enum { G_N, G_H, G_W, G_C, G_OH, G_OW, G_KH, G_KW, G_SH, G_SW, G_PH, G_PW, G_DH, G_DW,
       G_A = 14, G_B = 17, G_WC = 20, G_SIZE = 23 };

/* the weight [C, 1, KH, KW] (strides at g + G_WC) as taps wt[KH * KW][C] (malloc'd; NULL
   where memory could not be had) */
static float *tl_dw_taps(const float *w, const int64_t *g) {
  const int64_t C = g[G_C], KW = g[G_KW], *sw = g + G_WC;
  float *wt = malloc(sizeof(float) * (size_t)(g[G_KH] * KW * C));
  if (wt)
    for (int64_t kh = 0; kh < g[G_KH]; kh++)
      for (int64_t kw = 0; kw < KW; kw++)
        for (int64_t c = 0; c < C; c++)
          wt[(kh * KW + kw) * C + c] = w[c * sw[0] + kh * sw[1] + kw * sw[2]];
  return wt;
}

/* the first and one past the last output column whose tap kw reads inside the input */
static inline void tl_dw_columns(const int64_t *g, int64_t kw, int64_t *lo, int64_t *hi) {
  const int64_t off = kw * g[G_DW] - g[G_PW];  /* iw = ow * sw + off */
  int64_t a = off >= 0 ? 0 : (-off + g[G_SW] - 1) / g[G_SW];
  int64_t b = g[G_W] - 1 - off < 0 ? 0 : (g[G_W] - 1 - off) / g[G_SW] + 1;
  *lo = a;
  *hi = b < g[G_OW] ? b : g[G_OW];
}

/* dst[c] += a[c] * b[c] over C channels: blocks of TL_DW_LANES, then the rest */
static inline void tl_dw_fma(float *restrict dst, const float *a, const float *b, int64_t C) {
  int64_t c0 = 0;
  for (; c0 + TL_DW_LANES <= C; c0 += TL_DW_LANES) {
    #pragma omp simd
    for (int64_t c = 0; c < TL_DW_LANES; c++) dst[c0 + c] = fmaf(a[c0 + c], b[c0 + c], dst[c0 + c]);
  }
  for (int64_t c = c0; c < C; c++) dst[c] = fmaf(a[c], b[c], dst[c]);
}

/* TL_DW_PIXELS pixels of a row at once: their accumulators stay in registers across taps */
#define TL_DW_PIXELS 4

/* TL_DW_PIXELS pixels q.. of tl_dw_row (its arguments), channels c0 .. c0 + lanes - 1:
   their sums in registers across the taps. `lanes` is a literal at each call (inlined:
   32 channels are two vectors, eight independent sums, the FMA units kept busy). */
static inline __attribute__((always_inline)) void tl_dw_block(
    float *restrict dst, int64_t sd, int64_t q, const float *const *src, const int64_t *taph,
    int nrows, int64_t ss, int64_t step, int64_t base, int64_t delta, int64_t KW,
    const float *wt, int64_t C, int64_t c0, const int lanes) {
  float acc[TL_DW_PIXELS][lanes];
  for (int p = 0; p < TL_DW_PIXELS; p++) {
    #pragma omp simd
    for (int c = 0; c < lanes; c++) acc[p][c] = 0.0f;
  }
  for (int k = 0; k < nrows; k++) {
    const float *row = src[k] + c0;
    const float *wrow = wt + taph[k] * KW * C + c0;
    for (int64_t kw = 0; kw < KW; kw++) {
      const float *wp = wrow + kw * C;
      const float *xp = row + (q * step + base + kw * delta) * ss;
      for (int p = 0; p < TL_DW_PIXELS; p++) {
        #pragma omp simd
        for (int c = 0; c < lanes; c++)
          acc[p][c] = fmaf(xp[p * step * ss + c], wp[c], acc[p][c]);
      }
    }
  }
  for (int p = 0; p < TL_DW_PIXELS; p++) {
    #pragma omp simd
    for (int c = 0; c < lanes; c++)
      dst[(q + p) * sd + c0 + c] = acc[p][c];
  }
}

/* Channels c0 .. c0 + lanes - 1 of pixel q of tl_dw_row (its arguments) whose taps may
   fall outside the row (skipped): the even and the odd taps of a row summed apart in
   registers (two chains of fused multiply-adds per vector, not one), then added. `lanes`
   is a literal at each call (inlined). */
static inline __attribute__((always_inline)) void tl_dw_edge(
    float *restrict d, int64_t q, const float *const *src, const int64_t *taph, int nrows,
    int64_t ss, int64_t srcW, int64_t step, int64_t base, int64_t delta, int64_t KW,
    const float *wt, int64_t C, int64_t c0, const int lanes) {
  float even[lanes], odd[lanes];
  #pragma omp simd
  for (int c = 0; c < lanes; c++) even[c] = odd[c] = 0.0f;
  for (int k = 0; k < nrows; k++)
    for (int64_t kw = 0; kw < KW; kw++) {
      const int64_t col = q * step + base + kw * delta;
      if (col < 0 || col >= srcW) continue;
      const float *xp = src[k] + col * ss + c0, *wp = wt + (taph[k] * KW + kw) * C + c0;
      if (kw & 1) {
        #pragma omp simd
        for (int c = 0; c < lanes; c++) odd[c] = fmaf(xp[c], wp[c], odd[c]);
      } else {
        #pragma omp simd
        for (int c = 0; c < lanes; c++) even[c] = fmaf(xp[c], wp[c], even[c]);
      }
    }
  #pragma omp simd
  for (int c = 0; c < lanes; c++)
    d[c0 + c] = even[c] + odd[c];
}

/* Channels c0 .. C - 1 (fewer than a block, or none) of pixel q of tl_dw_row (its
   arguments), tap by tap in memory, the taps outside the row skipped. */
static void tl_dw_rest(float *restrict d, int64_t q, const float *const *src,
                       const int64_t *taph, int nrows, int64_t ss, int64_t srcW, int64_t step,
                       int64_t base, int64_t delta, int64_t KW, const float *wt, int64_t C,
                       int64_t c0) {
  if (c0 >= C) return;
  for (int64_t c = c0; c < C; c++) d[c] = 0.0f;
  for (int k = 0; k < nrows; k++)
    for (int64_t kw = 0; kw < KW; kw++) {
      const int64_t col = q * step + base + kw * delta;
      if (col >= 0 && col < srcW)
        tl_dw_fma(d + c0, src[k] + col * ss + c0, wt + (taph[k] * KW + kw) * C + c0, C - c0);
    }
}

/* One row of a depthwise correlation: dst pixel q (stride sd, q < P) is the sum, from 0,
   over the rows src[k] (k < nrows, each a row of srcW pixels of stride ss, from tap
   row taph[k]) and the taps kw < KW, of src[k][q * step + base + kw * delta] * wt[tap][c].
   Pixels whose every tap is inside the row go TL_DW_PIXELS at a time, with their
   accumulators in registers (tl_dw_block: blocks of 32 channels, then one of 16); the
   others by tl_dw_edge, and the channels past the last block by tl_dw_rest. */
static void tl_dw_row(float *restrict dst, int64_t sd, int64_t P, const float *const *src,
                      const int64_t *taph, int nrows, int64_t ss, int64_t srcW, int64_t step,
                      int64_t base, int64_t delta, int64_t KW, const float *wt,
                      int64_t C) {
  /* the pixels whose taps all fall inside the row: q in [qa, qb) */
  const int64_t first = delta >= 0 ? base : base + (KW - 1) * delta;  /* leftmost tap */
  const int64_t last = delta >= 0 ? base + (KW - 1) * delta : base;
  int64_t qa = first >= 0 ? 0 : (-first + step - 1) / step;
  int64_t qb = srcW - 1 - last < 0 ? 0 : (srcW - 1 - last) / step + 1;
  if (qb > P) qb = P;
  if (qa > qb) qa = qb;
  const int64_t full = C - C % TL_DW_LANES;
  int64_t q = 0;
  for (; q < P; q++) {
    if (q >= qa && q + TL_DW_PIXELS <= qb && full > 0) {  /* a block of interior pixels */
      int64_t c0 = 0;
      for (; c0 + 2 * TL_DW_LANES <= full; c0 += 2 * TL_DW_LANES)
        tl_dw_block(dst, sd, q, src, taph, nrows, ss, step, base, delta, KW, wt, C, c0,
                    2 * TL_DW_LANES);
      if (c0 < full)
        tl_dw_block(dst, sd, q, src, taph, nrows, ss, step, base, delta, KW, wt, C, c0,
                    TL_DW_LANES);
      for (int p = 0; p < TL_DW_PIXELS && full < C; p++)  /* the channels past the blocks */
        tl_dw_rest(dst + (q + p) * sd, q + p, src, taph, nrows, ss, srcW, step, base, delta,
                   KW, wt, C, full);
      q += TL_DW_PIXELS - 1;
      continue;
    }
    /* a pixel some of whose taps fall outside the row (or past the last block) */
    int64_t c0 = 0;  /* blocks of 64 channels (eight chains), then 32, then 16 */
    for (; c0 + 4 * TL_DW_LANES <= C; c0 += 4 * TL_DW_LANES)
      tl_dw_edge(dst + q * sd, q, src, taph, nrows, ss, srcW, step, base, delta, KW, wt, C,
                 c0, 4 * TL_DW_LANES);
    if (c0 + 2 * TL_DW_LANES <= C) {
      tl_dw_edge(dst + q * sd, q, src, taph, nrows, ss, srcW, step, base, delta, KW, wt, C,
                 c0, 2 * TL_DW_LANES);
      c0 += 2 * TL_DW_LANES;
    }
    if (c0 + TL_DW_LANES <= C) {
      tl_dw_edge(dst + q * sd, q, src, taph, nrows, ss, srcW, step, base, delta, KW, wt, C,
                 c0, TL_DW_LANES);
      c0 += TL_DW_LANES;
    }
    tl_dw_rest(dst + q * sd, q, src, taph, nrows, ss, srcW, step, base, delta, KW, wt, C,
               c0);
  }
}

/* at most this many tap rows (a larger kernel height goes to eager's op: depthwise.py) */
#define TL_DW_MAX_KH 64

/* the input's gradient: gi[n, ih, iw, c] = sum over the taps that read (ih, iw) of
   go[n, oh, ow, c] * wt[tap][c] (go's strides at G_A, gi's at G_B). Unit strides: a
   correlation of go with the flipped taps (tl_dw_row); other strides: each input row
   zeroed, then each tap adds. Returns 1 where memory for the taps could not be had
   (nothing written), else 0. */
int tl_dw_bwd_input_f32(int threads, const float *go, const float *w, float *gi,
                        const int64_t *g) {
  const int64_t rows = g[G_N] * g[G_H], C = g[G_C], *sgo = g + G_A, *sgi = g + G_B;
  const int unit = g[G_SH] == 1 && g[G_SW] == 1;
  float *wt = tl_dw_taps(w, g);
  if (!wt) return 1;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const int64_t n = r / g[G_H], ih = r % g[G_H];
    float *grow = gi + n * sgi[0] + ih * sgi[1];
    const float *src[TL_DW_MAX_KH];
    int64_t taph[TL_DW_MAX_KH];
    int nrows = 0;
    for (int64_t kh = 0; kh < g[G_KH]; kh++) {
      const int64_t th = ih + g[G_PH] - kh * g[G_DH];
      if (th < 0 || th % g[G_SH] || th / g[G_SH] >= g[G_OH]) continue;
      src[nrows] = go + n * sgo[0] + (th / g[G_SH]) * sgo[1];
      taph[nrows++] = kh;
    }
    if (unit) {
      tl_dw_row(grow, sgi[2], g[G_W], src, taph, nrows, sgo[2], g[G_OW], 1, g[G_PW],
                -g[G_DW], g[G_KW], wt, C);
      continue;
    }
    for (int64_t iw = 0; iw < g[G_W]; iw++)
      for (int64_t c = 0; c < C; c++) grow[iw * sgi[2] + c] = 0.0f;
    for (int k = 0; k < nrows; k++)
      for (int64_t kw = 0; kw < g[G_KW]; kw++) {
        int64_t lo, hi;  /* the output columns this tap reads the input row from */
        tl_dw_columns(g, kw, &lo, &hi);
        const float *wp = wt + (taph[k] * g[G_KW] + kw) * C;
        const int64_t off = kw * g[G_DW] - g[G_PW];
        for (int64_t ow = lo; ow < hi; ow++)
          tl_dw_fma(grow + (ow * g[G_SW] + off) * sgi[2], src[k] + ow * sgo[2], wp, C);
      }
  }
  free(wt);
  return 0;
}

/* one output row's products added to row[tap][c] (f32) and, with brow, its gradient's
   sum added to brow[c] */
static void tl_dw_weight_row(float *restrict row, float *restrict brow, const float *gorow,
                             const int64_t *sgo, const float *xn, const int64_t *sx,
                             const int64_t *g, int64_t oh) {
  const int64_t C = g[G_C];
  if (brow) {
    for (int64_t ow = 0; ow < g[G_OW]; ow++) {
      const float *gp = gorow + ow * sgo[2];
      #pragma omp simd
      for (int64_t c = 0; c < C; c++) brow[c] += gp[c];
    }
  }
  for (int64_t kh = 0; kh < g[G_KH]; kh++) {
    const int64_t ih = oh * g[G_SH] - g[G_PH] + kh * g[G_DH];
    if (ih < 0 || ih >= g[G_H]) continue;
    const float *xrow = xn + ih * sx[1];
    for (int64_t kw = 0; kw < g[G_KW]; kw++) {
      int64_t lo, hi;
      tl_dw_columns(g, kw, &lo, &hi);
      const int64_t off = kw * g[G_DW] - g[G_PW];
      float *acc = row + (kh * g[G_KW] + kw) * C;
      int64_t c0 = 0;
      for (; c0 + TL_DW_LANES <= C; c0 += TL_DW_LANES) {
        /* TL_DW_PIXELS columns at once: as many independent sums in registers */
        float a[TL_DW_PIXELS][TL_DW_LANES];
        for (int p = 0; p < TL_DW_PIXELS; p++) {
          #pragma omp simd
          for (int64_t c = 0; c < TL_DW_LANES; c++) a[p][c] = 0.0f;
        }
        int64_t ow = lo;
        for (; ow + TL_DW_PIXELS <= hi; ow += TL_DW_PIXELS) {
          const float *gp = gorow + ow * sgo[2] + c0;
          const float *xp = xrow + (ow * g[G_SW] + off) * sx[2] + c0;
          for (int p = 0; p < TL_DW_PIXELS; p++) {
            #pragma omp simd
            for (int64_t c = 0; c < TL_DW_LANES; c++)
              a[p][c] = fmaf(gp[p * sgo[2] + c], xp[p * g[G_SW] * sx[2] + c], a[p][c]);
          }
        }
        for (; ow < hi; ow++) {
          const float *gp = gorow + ow * sgo[2] + c0;
          const float *xp = xrow + (ow * g[G_SW] + off) * sx[2] + c0;
          #pragma omp simd
          for (int64_t c = 0; c < TL_DW_LANES; c++) a[0][c] = fmaf(gp[c], xp[c], a[0][c]);
        }
        #pragma omp simd
        for (int64_t c = 0; c < TL_DW_LANES; c++)
          acc[c0 + c] += (a[0][c] + a[1][c]) + (a[2][c] + a[3][c]);
      }
      for (int64_t ow = lo; ow < hi && c0 < C; ow++)
        for (int64_t c = c0; c < C; c++)
          acc[c] = fmaf(gorow[ow * sgo[2] + c], xrow[(ow * g[G_SW] + off) * sx[2] + c], acc[c]);
    }
  }
}

/* the output pixels (at least) whose products a thread sums in f32 before adding them to
   its double sums */
#define TL_DW_BATCH 64

/* the weight's gradient gw (written whole, in its strides at G_WC) and, where gb is not
   NULL, the bias's gb[c]: sums over every output element (go's strides at G_A, x's at
   G_B). Returns 1 where scratch memory could not be had (nothing written), else 0. */
int tl_dw_bwd_weight_f32(int threads, const float *go, const float *x, float *gw, float *gb,
                         const int64_t *g) {
  const int64_t *sgo = g + G_A, *sx = g + G_B, *sw = g + G_WC;
  const int64_t C = g[G_C], taps = g[G_KH] * g[G_KW], rows = g[G_N] * g[G_OH];
  const int64_t width = (taps + 1) * C;  /* a thread's sums: the taps', then the bias's */
  if (threads < 1) threads = 1;
  if (rows < threads) threads = rows > 0 ? (int)rows : 1;
  double *sums = calloc((size_t)threads * width, sizeof(double));
  float *scratch = malloc(sizeof(float) * (size_t)threads * width);
  if (!sums || !scratch) {
    free(sums);
    free(scratch);
    return 1;
  }
  #pragma omp parallel num_threads(threads)
  {
    #ifdef _OPENMP
    const int t = omp_get_thread_num(), team = omp_get_num_threads();  /* (<= threads) */
    #else
    const int t = 0, team = 1;
    #endif
    double *mine = sums + (int64_t)t * width;
    float *row = scratch + (int64_t)t * width;
    float *brow = gb ? row + taps * C : NULL;
    const int64_t used = gb ? width : taps * C;
    /* this thread's rows; their f32 sums go into the double ones every `batch` rows (a
       row of at least TL_DW_BATCH pixels each, fewer narrower ones at once) */
    const int64_t first = rows * t / team, end = rows * (t + 1) / team;
    const int64_t batch = (TL_DW_BATCH + g[G_OW] - 1) / g[G_OW];
    for (int64_t r0 = first; r0 < end; r0 += batch) {
      memset(row, 0, sizeof(float) * (size_t)used);
      for (int64_t r = r0; r < end && r < r0 + batch; r++) {
        const int64_t n = r / g[G_OH], oh = r % g[G_OH];
        tl_dw_weight_row(row, brow, go + n * sgo[0] + oh * sgo[1], sgo, x + n * sx[0], sx,
                         g, oh);
      }
      #pragma omp simd
      for (int64_t i = 0; i < used; i++) mine[i] += row[i];
    }
  }
  for (int64_t i = 0; i < taps * C; i++) {  /* i: tap (kh * KW + kw) * C + c */
    double s = 0;
    for (int t = 0; t < threads; t++) s += sums[(int64_t)t * width + i];
    const int64_t tap = i / C, c = i % C;
    gw[c * sw[0] + (tap / g[G_KW]) * sw[1] + (tap % g[G_KW]) * sw[2]] = (float)s;
  }
  if (gb)
    for (int64_t c = 0; c < C; c++) {
      double s = 0;
      for (int t = 0; t < threads; t++) s += sums[(int64_t)t * width + taps * C + c];
      gb[c] = (float)s;
    }
  free(sums);
  free(scratch);
  return 0;
}
