/* Attention by blocks of 64 queries and 64 keys, its products by the BLAS's sgemm (a
   pointer the caller passes: torch's own), the softmax between them SIMD loops; see
   attention.py. Built after the prelude (tl_exp_core) and attention_masks.c (the block
   sizes, the masks' maps), as two libraries: the helpers with the forward (TL_ATTN_FORWARD
   defined) or with the backward (TL_ATTN_BACKWARD), so that inference builds half the
   code and training builds the backward's at its first call. */

typedef void (*tl_sgemm_fn)(const char *, const char *, const void *, const void *,
                            const void *, const float *, const float *, const void *,
                            const float *, const void *, const float *, float *, const void *);

/* The BLAS's column-major sgemm: c (m x n, ldc) = alpha op(a) op(b) + beta c. Its integers
   are passed as int64 values: an LP64 BLAS reads their low halves (little-endian; every
   size and stride is below 2^31, checked by the caller), an ILP64 one the whole. */
static inline void tl_gemm(tl_sgemm_fn gemm, const char *ta, const char *tb, int64_t m,
                           int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                           const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  gemm(ta, tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}


/* e^x for x <= 0 or NaN, 0 below -80 (where e^x < 2e-35, nothing beside a row's largest
   term of 1): never a subnormal, whose arithmetic costs a microcode assist a vector */
static inline float tl_attn_exp(float x) {
  const float xc = x < -80.0f ? -80.0f : x;
  int32_t bits;
  const float y = tl_exp_core(xc, &bits);
  const uint32_t b = (uint32_t)(bits - 0x4B400000 + 127) << 23;
  float s;
  memcpy(&s, &b, 4);
  return x < -80.0f ? 0.0f : y * s;
}

/* Query qi's row of a block of scores (keys n0 .. n0 + bk): the mask's row (mk, or NULL)
   added to the keys a causal flag lets it see, whose count it returns. */
static inline int tl_attn_row(float *restrict row, const float *mk, int64_t sml, int64_t qi,
                              int64_t n0, int bk, int causal) {
  int lim = bk;
  if (causal) {
    const int64_t last = qi - n0 + 1;
    lim = last < bk ? (last < 0 ? 0 : (int)last) : bk;
  }
  if (mk != NULL) {
    const float *restrict mr = mk + qi * sml + n0;
    #pragma omp simd
    for (int j = 0; j < lim; j++) row[j] += mr[j];
  }
  return lim;
}

#ifdef TL_ATTN_FORWARD  /* the forward's library (attention.py: one per direction) */

/* One task: query rows [q0, q0 + n) of one head (mask rows mk, or NULL; dead: its row of
   tl_attn_dead_map); o: n x D. Scores are kept transposed, st[j * TL_ABQ + i] for key j and
   query i, so that each query's maximum and sum over its keys are vector operations across
   16 queries (a horizontal reduction per query row cost as much as the products). Blocks
   whose mask hides every key are skipped (tl_attn_skips, kmost: tl_attn_key_bounds); 1
   when a row then had no key its mask lets through (its softmax would need the skipped
   blocks), had no key at all (-inf everywhere) or an infinite score (a mask's +inf that
   tl_attn_block's early answer did not see): eager's op decides what those give; or when
   a query of a masked task is not finite (a hidden key's zero weight is NaN in eager's
   op), else 0. */
static int tl_attn_fwd_task(tl_sgemm_fn gemm, const float *q, int64_t sql, const float *k,
                            int64_t skl, const float *v, int64_t svl, const float *mk,
                            int64_t sml, const unsigned char *dead, const float *kmost,
                            float *restrict out, int64_t sol, float *restrict lse,
                            int64_t slse, int64_t q0, int n, int64_t Lk, int D, float scale,
                            int causal, float *restrict st, float *restrict o) {
  float m[TL_ABQ], l[TL_ABQ], mx[TL_ABQ], base[TL_ABQ], alpha[TL_ABQ], sum[TL_ABQ];
  const float qmost = mk != NULL ? tl_attn_most(q + q0 * sql, sql, n, D) : 0.0f;
  if (qmost == INFINITY) return 1;
  const double dscale = D * fabs((double)scale);
  for (int i = 0; i < n; i++) { m[i] = -INFINITY; l[i] = 0.0f; }
  memset(o, 0, sizeof(float) * n * D);
  const int64_t nk = causal ? (q0 + n < Lk ? q0 + n : Lk) : Lk;
  int skipped = 0;
  for (int64_t n0 = 0; n0 < nk; n0 += TL_ABK) {
    const int bk = nk - n0 < TL_ABK ? (int)(nk - n0) : TL_ABK;
    const int block = mk != NULL ? dead[n0 / TL_ABK] : TL_ZERO;
    if (mk != NULL && tl_attn_skips(block, qmost, kmost[n0 / TL_ABK], dscale)) {
      skipped = 1;
      continue;
    }
    /* st (bk x n, ld TL_ABQ) = scale * k q^T (+ the mask's block, transposed) */
    tl_gemm(gemm, "T", "N", n, bk, D, scale, q + q0 * sql, sql, k + n0 * skl, skl, 0.0f, st,
            TL_ABQ);
    if (block != TL_ZERO)
      for (int j = 0; j < bk; j++) {
        float *restrict col = st + j * TL_ABQ;
        const float *mj = mk + q0 * sml + n0 + j;
        #pragma omp simd
        for (int i = 0; i < n; i++) col[i] += mj[i * sml];
      }
    if (causal && n0 + bk - 1 > q0) /* keys after the query: hidden */
      for (int j = 0; j < bk; j++) {
        float *restrict col = st + j * TL_ABQ;
        #pragma omp simd
        for (int i = 0; i < n; i++) col[i] = n0 + j > q0 + i ? -INFINITY : col[i];
      }
    for (int i = 0; i < n; i++) mx[i] = -INFINITY;
    for (int j = 0; j < bk; j++) {
      const float *restrict col = st + j * TL_ABQ;
      #pragma omp simd
      for (int i = 0; i < n; i++) mx[i] = col[i] > mx[i] ? col[i] : mx[i];
    }
    #pragma omp simd
    for (int i = 0; i < n; i++) {
      const float mn = mx[i] > m[i] ? mx[i] : m[i];
      alpha[i] = m[i] == -INFINITY ? 0.0f : tl_attn_exp(m[i] - mn);
      base[i] = mn == -INFINITY ? 0.0f : mn; /* a row with no key yet: every e^-inf is 0 */
      m[i] = mn;
      sum[i] = 0.0f;
    }
    for (int j = 0; j < bk; j++) {
      float *restrict col = st + j * TL_ABQ;
      #pragma omp simd
      for (int i = 0; i < n; i++) {
        const float e = tl_attn_exp(col[i] - base[i]);
        col[i] = e;
        sum[i] += e;
      }
    }
    for (int i = 0; i < n; i++) {
      l[i] = l[i] * alpha[i] + sum[i];
      if (alpha[i] != 1.0f) {
        float *restrict oi = o + i * D;
        const float a = alpha[i];
        #pragma omp simd
        for (int d = 0; d < D; d++) oi[d] *= a;
      }
    }
    /* o (n x D) += p (n x bk) v (bk x D), p held transposed in st */
    tl_gemm(gemm, "N", "T", D, n, bk, 1.0f, v + n0 * svl, svl, st, TL_ABQ, 1.0f, o, D);
  }
  for (int i = 0; i < n; i++)
    if ((skipped && !(m[i] > TL_DEAD)) || m[i] == -INFINITY || m[i] == INFINITY) return 1;
  for (int i = 0; i < n; i++) {
    const float inv = 1.0f / l[i];
    float *restrict dst = out + (q0 + i) * sol;
    const float *restrict src = o + i * D;
    #pragma omp simd
    for (int d = 0; d < D; d++) dst[d] = src[d] * inv;
    lse[(q0 + i) * slse] = m[i] + logf(l[i]);
  }
  return 0;
}

/* q [B, H, Lq, D], k and v [B, Hk, Lk, D] (H a multiple of Hk), out like q, lse [B, H, Lq],
   mask [B, H, Lq, Lk] added to the scaled scores (or NULL; broadcast dims of stride 0);
   strides: the first three of q, k, v, out, lse and mask, in elements (the last dim of each
   contiguous). 0, or 1 (out of memory), or 2 (a row whose mask hides every key of the
   blocks computed, or a masked query that is not finite) or 3 (a mask that hides fewer
   than a quarter of the blocks whole) or 4 (a key or value that is not finite):
   tl_attn_few_dead; eager's op runs for those three. */
int tl_attn_fwd_f32(int threads, void *sgemm, const float *q, const float *k, const float *v,
                    float *out, float *lse, int64_t B, int64_t H, int64_t Hk, int64_t Lq,
                    int64_t Lk, int64_t D, const float *mask, const int64_t *strides,
                    double scale, int causal) {
  const tl_sgemm_fn gemm = (tl_sgemm_fn)sgemm;
  const int64_t *sq = strides, *sk = sq + 3, *sv = sk + 3, *so = sv + 3, *sl = so + 3;
  const int64_t *sm = sl + 3;
  const int64_t blocks = (Lq + TL_ABQ - 1) / TL_ABQ, tasks = B * H * blocks, group = H / Hk;
  const int64_t kblocks = (Lk + TL_ABK - 1) / TL_ABK;
  const int64_t Bm = sm[0] != 0 ? B : 1, Hm = sm[1] != 0 ? H : 1;
  unsigned char *dead = mask != NULL ? malloc(Bm * Hm * blocks * kblocks) : NULL;
  float *most = malloc(sizeof(float) * kblocks);
  if (most == NULL || (mask != NULL && dead == NULL)) {
    free(dead);
    free(most);
    return 1;
  }
  int failed = 0;
  #pragma omp parallel num_threads(threads)
  {
    float *s = malloc(sizeof(float) * (TL_ABQ * TL_ABK + TL_ABQ * D));
    if (s == NULL) {
      #pragma omp atomic write
      failed = 1;
    }
    #pragma omp barrier
    if (!failed) {
      float *o = s + TL_ABQ * TL_ABK;
      const int none = tl_attn_few_dead(mask, sm, Bm, Hm, Lq, Lk, k, sk, v, sv, B, Hk, D,
                                        causal, most, dead, &failed);
      #pragma omp for schedule(dynamic, 1) nowait
      for (int64_t t = 0; t < (none ? 0 : tasks); t++) {
        /* the last rows first: the longest under a causal mask */
        const int64_t qb = blocks - 1 - t % blocks, bh = t / blocks;
        const int64_t b = bh / H, h = bh % H, hk = h / group;
        const int64_t q0 = qb * TL_ABQ, map = (Bm > 1 ? b : 0) * Hm + (Hm > 1 ? h : 0);
        const int n = Lq - q0 < TL_ABQ ? (int)(Lq - q0) : TL_ABQ;
        const float *mk = mask != NULL ? mask + b * sm[0] + h * sm[1] : NULL;
        const unsigned char *row = mask != NULL ? dead + (map * blocks + qb) * kblocks : NULL;
        if (tl_attn_fwd_task(gemm, q + b * sq[0] + h * sq[1], sq[2],
                             k + b * sk[0] + hk * sk[1], sk[2], v + b * sv[0] + hk * sv[1],
                             sv[2], mk, sm[2], row, most, out + b * so[0] + h * so[1], so[2],
                             lse + b * sl[0] + h * sl[1], sl[2], q0, n, Lk, (int)D,
                             (float)scale, causal, s, o)) {
          #pragma omp atomic write
          failed = 2;
        }
      }
    }
    free(s);
  }
  free(dead);
  free(most);
  return failed;
}

#endif  /* TL_ATTN_FORWARD */

#ifdef TL_ATTN_BACKWARD  /* the backward's library */

/* The gradients of one head (b, h): dq rows of the head, dk/dv rows of its key head (or of
   a private copy), each zeroed here; s and dp: TL_ABQ x TL_ABK. Blocks whose mask hides
   every key are skipped (tl_attn_skips, kmost: tl_attn_key_bounds) where each row's
   logsumexp came from keys its mask lets through. 1 where a masked block of rows has a
   query, output or output gradient that is not finite (eager's op: a hidden key's zero
   weights times it are NaN), or a logsumexp of +inf or NaN, else 0. */
static int tl_attn_bwd_task(tl_sgemm_fn gemm, const float *go, int64_t sgl, const float *q,
                             int64_t sql, const float *k, int64_t skl, const float *v,
                             int64_t svl, const float *mk, int64_t sml,
                             const unsigned char *dead, const float *kmost, int64_t kblocks,
                             const float *out,
                             int64_t sol, const float *lse,
                             int64_t slse, float *gq, int64_t sgql, float *gk, int64_t sgkl,
                             float *gv, int64_t sgvl, int64_t Lq, int64_t Lk, int D,
                             float scale, int causal, float *restrict s, float *restrict dp) {
  for (int64_t i = 0; i < Lq; i++) memset(gq + i * sgql, 0, sizeof(float) * D);
  for (int64_t j = 0; j < Lk; j++) {
    memset(gk + j * sgkl, 0, sizeof(float) * D);
    memset(gv + j * sgvl, 0, sizeof(float) * D);
  }
  float delta[TL_ABQ];
  const double dscale = D * fabs((double)scale);
  for (int64_t q0 = 0; q0 < Lq; q0 += TL_ABQ) {
    const int n = Lq - q0 < TL_ABQ ? (int)(Lq - q0) : TL_ABQ;
    for (int i = 0; i < n; i++) {
      const float *restrict a = go + (q0 + i) * sgl, *restrict b = out + (q0 + i) * sol;
      float sum = 0.0f;
      #pragma omp simd reduction(+:sum)
      for (int d = 0; d < D; d++) sum += a[d] * b[d];
      delta[i] = sum;
    }
    int live = mk != NULL;
    for (int i = 0; i < n && live; i++) live = lse[(q0 + i) * slse] > TL_DEAD;
    const int skips = mk != NULL || causal;  /* (keys this task may never multiply) */
    for (int i = 0; i < n && skips; i++)  /* +inf or NaN: eager's rules */
      if (!(lse[(q0 + i) * slse] <= 3.40282347e38f)) return 1;
    const float qmost = skips ? tl_attn_most(q + q0 * sql, sql, n, D) : 0.0f;
    if (skips && (qmost == INFINITY || tl_attn_most(go + q0 * sgl, sgl, n, D) == INFINITY ||
                  tl_attn_most(out + q0 * sol, sol, n, D) == INFINITY))
      return 1;
    const int64_t nk = causal ? (q0 + n < Lk ? q0 + n : Lk) : Lk;
    for (int64_t n0 = 0; n0 < nk; n0 += TL_ABK) {
      const int bk = nk - n0 < TL_ABK ? (int)(nk - n0) : TL_ABK;
      const int block = mk != NULL ? dead[q0 / TL_ABQ * kblocks + n0 / TL_ABK] : TL_MIXED;
      if (live && tl_attn_skips(block, qmost, kmost[n0 / TL_ABK], dscale)) continue;
      /* s = scale q k^T (+ mask), dp = go v^T (n x bk, row-major) */
      tl_gemm(gemm, "T", "N", bk, n, D, scale, k + n0 * skl, skl, q + q0 * sql, sql, 0.0f, s,
              TL_ABK);
      tl_gemm(gemm, "T", "N", bk, n, D, 1.0f, v + n0 * svl, svl, go + q0 * sgl, sgl, 0.0f, dp,
              TL_ABK);
      for (int i = 0; i < n; i++) {
        float *restrict p = s + i * TL_ABK, *restrict g = dp + i * TL_ABK;
        const int lim = tl_attn_row(p, block == TL_ZERO ? NULL : mk, sml, q0 + i, n0, bk,
                                    causal);
        const float m = lse[(q0 + i) * slse], di = delta[i];
        #pragma omp simd
        for (int j = 0; j < TL_ABK; j++) {
          const float e = j < lim ? tl_attn_exp(p[j] - m) : 0.0f;
          p[j] = e;
          g[j] = j < lim ? e * (g[j] - di) : 0.0f;
        }
      }
      /* dv (bk x D) += p^T go; dq (n x D) += scale ds k; dk (bk x D) += scale ds^T q */
      tl_gemm(gemm, "N", "T", D, bk, n, 1.0f, go + q0 * sgl, sgl, s, TL_ABK, 1.0f,
              gv + n0 * sgvl, sgvl);
      tl_gemm(gemm, "N", "N", D, n, bk, scale, k + n0 * skl, skl, dp, TL_ABK, 1.0f,
              gq + q0 * sgql, sgql);
      tl_gemm(gemm, "N", "T", D, bk, n, scale, q + q0 * sql, sql, dp, TL_ABK, 1.0f,
              gk + n0 * sgkl, sgkl);
    }
  }
  return 0;
}

/* The gradients of tl_attn_fwd_f32's attention: go, out like q; lse [B, H, Lq]; gq like q,
   gk and gv like k (strides: the first three of go, q, k, v, out, lse, gq, gk, gv, mask).
   A key head shared by several query heads (H > Hk) sums their gradients, each computed
   into private rows first. 0, or 1 (out of memory), or 2 (a masked query, output or output
   gradient that is not finite) or 3 (a mask that hides fewer than a quarter of the blocks
   whole) or 4 (a key or value that is not finite): tl_attn_few_dead; eager's op runs for
   those three. */
int tl_attn_bwd_f32(int threads, void *sgemm, const float *go, const float *q, const float *k,
                    const float *v, const float *out, const float *lse, float *gq, float *gk,
                    float *gv, int64_t B, int64_t H, int64_t Hk, int64_t Lq, int64_t Lk,
                    int64_t D, const float *mask, const int64_t *strides, double scale,
                    int causal) {
  const tl_sgemm_fn gemm = (tl_sgemm_fn)sgemm;
  const int64_t *sgo = strides, *sq = sgo + 3, *sk = sq + 3, *sv = sk + 3, *so = sv + 3;
  const int64_t *sl = so + 3, *sgq = sl + 3, *sgk = sgq + 3, *sgv = sgk + 3, *sm = sgv + 3;
  const int64_t group = H / Hk, head = Lk * D;
  const int64_t qblocks = (Lq + TL_ABQ - 1) / TL_ABQ, kblocks = (Lk + TL_ABK - 1) / TL_ABK;
  const int64_t Bm = sm[0] != 0 ? B : 1, Hm = sm[1] != 0 ? H : 1;
  /* [B, H, 2, Lk, D]: each query head's dk and dv when heads share keys */
  float *own = group > 1 ? malloc(sizeof(float) * B * H * 2 * head) : NULL;
  unsigned char *dead = mask != NULL ? malloc(Bm * Hm * qblocks * kblocks) : NULL;
  float *most = malloc(sizeof(float) * kblocks);
  if ((group > 1 && own == NULL) || most == NULL || (mask != NULL && dead == NULL)) {
    free(own);
    free(dead);
    free(most);
    return 1;
  }
  int failed = 0;
  #pragma omp parallel num_threads(threads)
  {
    float *s = malloc(sizeof(float) * 2 * TL_ABQ * TL_ABK);
    if (s == NULL) {
      #pragma omp atomic write
      failed = 1;
    }
    #pragma omp barrier
    if (!failed) {
      const int none = tl_attn_few_dead(mask, sm, Bm, Hm, Lq, Lk, k, sk, v, sv, B, Hk, D,
                                        causal, most, dead, &failed);
      #pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < (none ? 0 : B * H); t++) {
        const int64_t b = t / H, h = t % H, hk = h / group;
        const int64_t map = (Bm > 1 ? b : 0) * Hm + (Hm > 1 ? h : 0);
        float *dk = own != NULL ? own + t * 2 * head : gk + b * sgk[0] + hk * sgk[1];
        float *dv = own != NULL ? dk + head : gv + b * sgv[0] + hk * sgv[1];
        const int64_t sdk = own != NULL ? D : sgk[2], sdv = own != NULL ? D : sgv[2];
        const float *mk = mask != NULL ? mask + b * sm[0] + h * sm[1] : NULL;
        const unsigned char *rows = mask != NULL ? dead + map * qblocks * kblocks : NULL;
        if (tl_attn_bwd_task(gemm, go + b * sgo[0] + h * sgo[1], sgo[2],
                             q + b * sq[0] + h * sq[1], sq[2], k + b * sk[0] + hk * sk[1], sk[2],
                             v + b * sv[0] + hk * sv[1], sv[2], mk, sm[2], rows, most, kblocks,
                             out + b * so[0] + h * so[1], so[2], lse + b * sl[0] + h * sl[1],
                             sl[2], gq + b * sgq[0] + h * sgq[1], sgq[2], dk, sdk, dv, sdv, Lq,
                             Lk, (int)D, (float)scale, causal, s, s + TL_ABQ * TL_ABK)) {
          #pragma omp atomic write
          failed = 2;
        }
      }
      if (own != NULL && !none) {
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < B * Hk * Lk; r++) {
          const int64_t b = r / (Hk * Lk), hk = r / Lk % Hk, j = r % Lk;
          float *restrict dk = gk + b * sgk[0] + hk * sgk[1] + j * sgk[2];
          float *restrict dv = gv + b * sgv[0] + hk * sgv[1] + j * sgv[2];
          const float *first = own + (b * H + hk * group) * 2 * head + j * D;
          for (int d = 0; d < D; d++) { dk[d] = first[d]; dv[d] = first[head + d]; }
          for (int64_t g = 1; g < group; g++) {
            const float *restrict src = first + g * 2 * head;
            #pragma omp simd
            for (int d = 0; d < D; d++) { dk[d] += src[d]; dv[d] += src[head + d]; }
          }
        }
      }
    }
    free(s);
  }
  free(own);
  free(dead);
  free(most);
  return failed;
}

#endif  /* TL_ATTN_BACKWARD */
