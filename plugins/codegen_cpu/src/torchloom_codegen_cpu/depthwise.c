/* Depthwise 2-D convolution of f32 tensors whose channels are contiguous (channels-last),
   forward and backward (depthwise.py calls these; its doc says when).

   Shapes: input [N, H, W, C] (element strides sx[0..2], channel stride 1), weight taken as
   wt[KH * KW][C] (depthwise.py transposes eager's [C, 1, KH, KW]), output [N, OH, OW, C]
   (strides so[0..2], channel stride 1). Element (n, oh, ow, c) of the output reads input
   (n, oh * st - pd + kh * dl, ow * sw - pw + kw * dw, c): sizes in g[] (below).

   The channels are the inner loop, in blocks of TL_DW_LANES (a literal count gcc
   vectorizes; the last block of a channel count that is no multiple of it is a loop of
   its own). Products are added by fused multiply-adds (fmaf, as oneDNN's kernels: one
   rounding each). Sums: an output element's KH * KW products in f32 (as eager's); the weight's
   gradient over N * OH * OW products is summed in f32 along one output row, then in
   double across rows and threads, so a large image loses no more than a row's rounding.
   Threads split the rows (n, oh) of the output (forward, weight gradient) or of the
   input (input gradient). */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define TL_DW_LANES 16

/* g[]: N, H, W, C, OH, OW, KH, KW, st, sw, pd, pw, dh, dw */
enum { G_N, G_H, G_W, G_C, G_OH, G_OW, G_KH, G_KW, G_SH, G_SW, G_PH, G_PW, G_DH, G_DW };

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

/* One row of a depthwise correlation: dst pixel q (stride sd, q < P) is the sum, from 0,
   over the rows src[k] (k < nrows, each a row of srcW pixels of stride ss, from tap
   row taph[k]) and the taps kw < KW, of src[k][q * step + base + kw * delta] * wt[tap][c],
   plus bias[c] where bias is not NULL (last, as eager: a bias of -0 gives +0 on a sum of
   +0). Pixels whose every tap is inside the row go TL_DW_PIXELS at a time, with their
   accumulators in registers; the others tap by tap. */
static void tl_dw_row(float *restrict dst, int64_t sd, int64_t P, const float *const *src,
                      const int64_t *taph, int nrows, int64_t ss, int64_t srcW, int64_t step,
                      int64_t base, int64_t delta, int64_t KW, const float *wt, int64_t C,
                      const float *bias) {
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
      for (int64_t c0 = 0; c0 < full; c0 += TL_DW_LANES) {
        float acc[TL_DW_PIXELS][TL_DW_LANES];
        for (int p = 0; p < TL_DW_PIXELS; p++) {
          #pragma omp simd
          for (int64_t c = 0; c < TL_DW_LANES; c++) acc[p][c] = 0.0f;
        }
        for (int k = 0; k < nrows; k++) {
          const float *row = src[k] + c0;
          const float *wrow = wt + taph[k] * KW * C + c0;
          for (int64_t kw = 0; kw < KW; kw++) {
            const float *wp = wrow + kw * C;
            const float *xp = row + (q * step + base + kw * delta) * ss;
            for (int p = 0; p < TL_DW_PIXELS; p++) {
              #pragma omp simd
              for (int64_t c = 0; c < TL_DW_LANES; c++)
                acc[p][c] = fmaf(xp[p * step * ss + c], wp[c], acc[p][c]);
            }
          }
        }
        for (int p = 0; p < TL_DW_PIXELS; p++) {
          #pragma omp simd
          for (int64_t c = 0; c < TL_DW_LANES; c++)
            dst[(q + p) * sd + c0 + c] = bias ? acc[p][c] + bias[c0 + c] : acc[p][c];
        }
      }
      if (full < C) {  /* the channels past the last block, pixel by pixel */
        for (int p = 0; p < TL_DW_PIXELS; p++) {
          float *d = dst + (q + p) * sd;
          for (int64_t c = full; c < C; c++) d[c] = 0.0f;
          for (int k = 0; k < nrows; k++)
            for (int64_t kw = 0; kw < KW; kw++) {
              const float *xp = src[k] + ((q + p) * step + base + kw * delta) * ss;
              const float *wp = wt + (taph[k] * KW + kw) * C;
              for (int64_t c = full; c < C; c++) d[c] = fmaf(xp[c], wp[c], d[c]);
            }
          if (bias)
            for (int64_t c = full; c < C; c++) d[c] += bias[c];
        }
      }
      q += TL_DW_PIXELS - 1;
      continue;
    }
    float *d = dst + q * sd;  /* a pixel some of whose taps fall outside the row */
    for (int64_t c = 0; c < C; c++) d[c] = 0.0f;
    for (int k = 0; k < nrows; k++)
      for (int64_t kw = 0; kw < KW; kw++) {
        const int64_t col = q * step + base + kw * delta;
        if (col >= 0 && col < srcW)
          tl_dw_fma(d, src[k] + col * ss, wt + (taph[k] * KW + kw) * C, C);
      }
    if (bias)
      for (int64_t c = 0; c < C; c++) d[c] += bias[c];
  }
}

/* at most this many tap rows (a larger kernel height goes to eager's op: depthwise.py) */
#define TL_DW_MAX_KH 64

/* A thread's copies of source rows with zero pixels on both sides (lp left, the rest
   right), so that every tap of every destination pixel reads inside its copy and every
   pixel but a row's last few goes by tl_dw_row's block of registers: `slots` rows of
   `width` floats (pixels of C channels, contiguous), each tagged with the source row it
   holds (-1: none). A source row is copied once per thread while its slot keeps it. */
typedef struct {
  float *rows;
  int64_t *tag;
  int64_t slots, width, lp;
} tl_dw_ring;

/* lp and the padded width for a row of ws source pixels that pixels q < P read at
   q * step + base + kw * delta (kw < KW) */
static void tl_dw_pads(int64_t ws, int64_t P, int64_t step, int64_t base, int64_t delta,
                       int64_t KW, int64_t *lp, int64_t *wp) {
  const int64_t lo = base + (delta < 0 ? (KW - 1) * delta : 0);
  const int64_t hi = (P - 1) * step + base + (delta > 0 ? (KW - 1) * delta : 0);
  *lp = lo < 0 ? -lo : 0;
  *wp = *lp + ws + (hi > ws - 1 ? hi - (ws - 1) : 0);
}

/* Opens a thread's ring where `use` (else leaves it empty) for a kernel of g[] whose
   destination rows read source rows (KH - 1) * dh + 1 apart at most: 1 (and *failed set)
   where its memory could not be had, else 0. */
static int tl_dw_ring_open(tl_dw_ring *r, int use, const int64_t *g, int64_t lp, int64_t wp,
                           int *failed) {
  const int64_t slots = (g[G_KH] - 1) * g[G_DH] + 1;
  if (!use) return 0;
  r->slots = slots;
  r->lp = lp;
  r->width = wp * g[G_C];
  r->rows = calloc((size_t)(slots * r->width), sizeof(float));
  r->tag = malloc(sizeof(int64_t) * (size_t)slots);
  if (!r->rows || !r->tag) {
    #pragma omp atomic write
    *failed = 1;
    return 1;
  }
  for (int64_t i = 0; i < slots; i++) r->tag[i] = -1;
  return 0;
}

static void tl_dw_ring_close(tl_dw_ring *r) {
  free(r->rows);
  free(r->tag);
}

/* the padded copy of source row `key` (ws pixels at src, pixel stride ss), kept in slot
   key % slots: the caller's rows of one destination row are fewer than `slots` apart */
static const float *tl_dw_ring_row(tl_dw_ring *r, int64_t key, const float *src, int64_t ss,
                                   int64_t ws, int64_t C) {
  const int64_t slot = key % r->slots;
  float *row = r->rows + slot * r->width;
  if (r->tag[slot] != key) {
    for (int64_t w = 0; w < ws; w++)
      memcpy(row + (r->lp + w) * C, src + w * ss, sizeof(float) * (size_t)C);
    r->tag[slot] = key;
  }
  return row;
}

/* whether every tap is finite: only then may a padded row's zeros be multiplied (eager
   skips the taps outside the input: an infinite tap there gives no NaN) */
static int tl_dw_finite(const float *wt, int64_t n) {
  int bad = 0;
  #pragma omp simd reduction(|:bad)
  for (int64_t i = 0; i < n; i++) bad |= !isfinite(wt[i]);
  return !bad;
}

/* the forward: out = conv(x, w) + bias (bias may be NULL), from padded copies of the
   input's rows where the taps are finite, else from the rows themselves. Returns 1 where
   a thread's padded rows could not be had (the output is then unfinished), else 0. */
int tl_dw_fwd_f32(int threads, const float *x, const int64_t *sx, const float *wt,
                  const float *bias, float *out, const int64_t *so, const int64_t *g) {
  const int64_t rows = g[G_N] * g[G_OH], C = g[G_C];
  const int padded = tl_dw_finite(wt, g[G_KH] * g[G_KW] * C);
  int64_t lp, wp;
  tl_dw_pads(g[G_W], g[G_OW], g[G_SW], -g[G_PW], g[G_DW], g[G_KW], &lp, &wp);
  int failed = 0;
  #pragma omp parallel num_threads(threads)
  {
    tl_dw_ring ring = {0};
    const int none = tl_dw_ring_open(&ring, padded, g, lp, wp, &failed);
    #pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      if (none) continue;
      const int64_t n = r / g[G_OH], oh = r % g[G_OH];
      const float *src[TL_DW_MAX_KH];
      int64_t taph[TL_DW_MAX_KH];
      int nrows = 0;
      for (int64_t kh = 0; kh < g[G_KH]; kh++) {
        const int64_t ih = oh * g[G_SH] - g[G_PH] + kh * g[G_DH];
        if (ih < 0 || ih >= g[G_H]) continue;
        const float *row = x + n * sx[0] + ih * sx[1];
        src[nrows] = padded ? tl_dw_ring_row(&ring, n * g[G_H] + ih, row, sx[2], g[G_W], C)
                            : row;
        taph[nrows++] = kh;
      }
      if (padded)
        tl_dw_row(out + n * so[0] + oh * so[1], so[2], g[G_OW], src, taph, nrows, C, wp,
                  g[G_SW], lp - g[G_PW], g[G_DW], g[G_KW], wt, C, bias);
      else
        tl_dw_row(out + n * so[0] + oh * so[1], so[2], g[G_OW], src, taph, nrows, sx[2],
                  g[G_W], g[G_SW], -g[G_PW], g[G_DW], g[G_KW], wt, C, bias);
    }
    tl_dw_ring_close(&ring);
  }
  return failed;
}

/* the input's gradient: gi[n, ih, iw, c] = sum over the taps that read (ih, iw) of
   go[n, oh, ow, c] * wt[tap][c]. Unit strides: a correlation of go's rows (padded copies
   where the taps are finite) with the flipped taps (tl_dw_row); other strides: each
   input row zeroed, then each tap adds. Returns 1 where a thread's padded rows could not
   be had, else 0. */
int tl_dw_bwd_input_f32(int threads, const float *go, const int64_t *sgo, const float *wt,
                        float *gi, const int64_t *sgi, const int64_t *g) {
  const int64_t rows = g[G_N] * g[G_H], C = g[G_C];
  const int stride1 = g[G_SH] == 1 && g[G_SW] == 1;
  const int unit = stride1 && tl_dw_finite(wt, g[G_KH] * g[G_KW] * C);
  int64_t lp, wp;
  tl_dw_pads(g[G_OW], g[G_W], 1, g[G_PW], -g[G_DW], g[G_KW], &lp, &wp);
  int failed = 0;
  #pragma omp parallel num_threads(threads)
  {
    tl_dw_ring ring = {0};
    const int none = tl_dw_ring_open(&ring, unit, g, lp, wp, &failed);
    #pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      if (none) continue;
      const int64_t n = r / g[G_H], ih = r % g[G_H];
      float *grow = gi + n * sgi[0] + ih * sgi[1];
      const float *src[TL_DW_MAX_KH];
      int64_t taph[TL_DW_MAX_KH];
      int nrows = 0;
      for (int64_t kh = 0; kh < g[G_KH]; kh++) {
        const int64_t th = ih + g[G_PH] - kh * g[G_DH];
        if (th < 0 || th % g[G_SH] || th / g[G_SH] >= g[G_OH]) continue;
        const float *row = go + n * sgo[0] + (th / g[G_SH]) * sgo[1];
        src[nrows] = unit ? tl_dw_ring_row(&ring, n * g[G_OH] + th, row, sgo[2], g[G_OW], C)
                          : row;
        taph[nrows++] = kh;
      }
      if (unit) {
        tl_dw_row(grow, sgi[2], g[G_W], src, taph, nrows, C, wp, 1, lp + g[G_PW], -g[G_DW],
                  g[G_KW], wt, C, NULL);
        continue;
      }
      if (stride1) {  /* (taps not all finite: go's own rows, the taps outside skipped) */
        tl_dw_row(grow, sgi[2], g[G_W], src, taph, nrows, sgo[2], g[G_OW], 1, g[G_PW],
                  -g[G_DW], g[G_KW], wt, C, NULL);
        continue;
      }
      for (int64_t iw = 0; iw < g[G_W]; iw++)
        for (int64_t c = 0; c < C; c++) grow[iw * sgi[2] + c] = 0.0f;
      for (int k = 0; k < nrows; k++)
        for (int64_t kw = 0; kw < g[G_KW]; kw++) {
          int64_t lo, hi;  /* the output columns this tap reads the input row from */
          tl_dw_columns(g, kw, &lo, &hi);
          const float *wp_ = wt + (taph[k] * g[G_KW] + kw) * C;
          const int64_t off = kw * g[G_DW] - g[G_PW];
          for (int64_t ow = lo; ow < hi; ow++)
            tl_dw_fma(grow + (ow * g[G_SW] + off) * sgi[2], src[k] + ow * sgo[2], wp_, C);
        }
    }
    tl_dw_ring_close(&ring);
  }
  return failed;
}

/* one output row's products into row[tap][c] (f32) and, with brow, its gradient's sum
   into brow[c] */
static void tl_dw_weight_row(float *restrict row, float *restrict brow, const float *gorow,
                             const int64_t *sgo, const float *xn, const int64_t *sx,
                             const int64_t *g, int64_t oh) {
  const int64_t C = g[G_C], taps = g[G_KH] * g[G_KW];
  memset(row, 0, sizeof(float) * taps * C);
  if (brow) {
    memset(brow, 0, sizeof(float) * C);
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
          acc[c0 + c] = (a[0][c] + a[1][c]) + (a[2][c] + a[3][c]);
      }
      for (int64_t ow = lo; ow < hi && c0 < C; ow++)
        for (int64_t c = c0; c < C; c++)
          acc[c] = fmaf(gorow[ow * sgo[2] + c], xrow[(ow * g[G_SW] + off) * sx[2] + c], acc[c]);
    }
  }
}

/* the weight's gradient gwt[tap][c] (f32, written whole) and, where gb is not NULL, the
   bias's gb[c]: sums over every output element. Returns 1 where scratch memory could not
   be had (nothing written), else 0. */
int tl_dw_bwd_weight_f32(int threads, const float *go, const int64_t *sgo, const float *x,
                         const int64_t *sx, float *gwt, float *gb, const int64_t *g) {
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
    const int t = omp_get_thread_num();
    #else
    const int t = 0;
    #endif
    double *mine = sums + (int64_t)t * width;
    float *row = scratch + (int64_t)t * width;
    float *brow = gb ? row + taps * C : NULL;
    #pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      const int64_t n = r / g[G_OH], oh = r % g[G_OH];
      tl_dw_weight_row(row, brow, go + n * sgo[0] + oh * sgo[1], sgo, x + n * sx[0], sx, g,
                       oh);
      const int64_t used = gb ? width : taps * C;
      #pragma omp simd
      for (int64_t i = 0; i < used; i++) mine[i] += row[i];
    }
  }
  for (int64_t i = 0; i < taps * C; i++) {
    double s = 0;
    for (int t = 0; t < threads; t++) s += sums[(int64_t)t * width + i];
    gwt[i] = (float)s;
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
