/* The mask's and the inputs' part of the blocked attention (attention.py): which blocks
   of 64 queries x 64 keys a mask hides whole, and whether the inputs let a task skip
   them as eager's op would give them no weight. Built before attention.c (attention.py
   joins them); loops marked so are loops of the caller's parallel region. */

#define TL_ABQ 64 /* query rows per block (a task of the forward) */
#define TL_ABK 64 /* keys per block */

/* A mask value that hides its key: -inf, or what models write for it (finfo.min). */
#define TL_DEAD -1e30f

/* The mask's block of rows [0, n) and columns [0, bk): TL_MINUS_INF (every value -inf),
   TL_BELOW (every value hides its key, some finite), TL_ZERO (every value 0: nothing to
   add), TL_ODD (a NaN or +inf: eager's op decides such rows), else TL_MIXED. A task skips
   a block of the first two where tl_attn_skips says. */
#define TL_MIXED 0
#define TL_ZERO 2
#define TL_MINUS_INF 3
#define TL_BELOW 4
#define TL_ODD 5
static int tl_attn_block(const float *mk, int64_t sml, int n, int bk) {
  float lo = INFINITY, hi = -INFINITY;
  int nan = 0;
  for (int i = 0; i < n; i++) {
    const float *restrict r = mk + i * sml;
    #pragma omp simd reduction(min:lo) reduction(max:hi) reduction(|:nan)
    for (int j = 0; j < bk; j++) {
      lo = r[j] < lo ? r[j] : lo;
      hi = r[j] > hi ? r[j] : hi;
      nan |= r[j] != r[j];
    }
    if (nan || hi == INFINITY) return TL_ODD;
    if (!(hi <= TL_DEAD) && !(lo == 0.0f && hi == 0.0f)) return TL_MIXED;
  }
  return hi == -INFINITY ? TL_MINUS_INF : hi <= TL_DEAD ? TL_BELOW : TL_ZERO;
}

/* dead[(bm * Hm + hm) * qblocks + qb) * kblocks + kb]: tl_attn_block of query block qb and
   key block kb, for each of the mask's own (not broadcast) batches and heads; a loop of the
   caller's parallel region, which waits for it. */
static void tl_attn_dead_map(const float *mask, const int64_t *sm, int64_t Bm, int64_t Hm,
                             int64_t Lq, int64_t Lk, unsigned char *dead) {
  const int64_t qblocks = (Lq + TL_ABQ - 1) / TL_ABQ, kblocks = (Lk + TL_ABK - 1) / TL_ABK;
  #pragma omp for schedule(static)
  for (int64_t r = 0; r < Bm * Hm * qblocks; r++) {
    const int64_t bm = r / (Hm * qblocks), hm = r / qblocks % Hm, q0 = r % qblocks * TL_ABQ;
    /* a mask broadcast over queries (stride 0: BERT's padding) has one row to read */
    const int n = sm[2] == 0 ? 1 : Lq - q0 < TL_ABQ ? (int)(Lq - q0) : TL_ABQ;
    const float *rows = mask + bm * sm[0] + hm * sm[1] + q0 * sm[2];
    for (int64_t kb = 0; kb < kblocks; kb++) {
      const int64_t n0 = kb * TL_ABK;
      const int bk = Lk - n0 < TL_ABK ? (int)(Lk - n0) : TL_ABK;
      dead[r * kblocks + kb] = (unsigned char)tl_attn_block(rows + n0, sm[2], n, bk);
    }
  }
}

/* The largest |x| over the n x D rows of x (ld apart), INFINITY where one is not finite:
   one vector loop when they are contiguous. */
static float tl_attn_most(const float *x, int64_t ld, int64_t n, int64_t D) {
  const int64_t rows = ld == D ? 1 : n, len = ld == D ? n * D : D;
  float most = 0.0f;
  int bad = 0;
  for (int64_t j = 0; j < rows; j++) {
    const float *restrict r = x + j * ld;
    #pragma omp simd reduction(max:most) reduction(|:bad)
    for (int64_t d = 0; d < len; d++) {
      const float a = fabsf(r[d]);
      bad |= !(a <= 3.40282347e38f);
      most = a > most ? a : most;
    }
  }
  return bad ? INFINITY : most;
}

/* most[kb]: the largest |key| of key block kb (of every batch and key head), INFINITY where
   a key or value there is not finite (a loop of the caller's parallel region). */
static void tl_attn_key_bounds(const float *k, const int64_t *sk, const float *v,
                               const int64_t *sv, int64_t B, int64_t Hk, int64_t Lk,
                               int64_t D, float *most) {
  const int64_t kblocks = (Lk + TL_ABK - 1) / TL_ABK;
  #pragma omp for schedule(static)
  for (int64_t kb = 0; kb < kblocks; kb++) {
    const int64_t n0 = kb * TL_ABK;
    const int bk = Lk - n0 < TL_ABK ? (int)(Lk - n0) : TL_ABK;
    float m = 0.0f;
    for (int64_t bh = 0; bh < B * Hk && m < INFINITY; bh++) {
      const int64_t b = bh / Hk, h = bh % Hk;
      const float mk = tl_attn_most(k + b * sk[0] + h * sk[1] + n0 * sk[2], sk[2], bk, D);
      const float mv = tl_attn_most(v + b * sv[0] + h * sv[1] + n0 * sv[2], sv[2], bk, D);
      m = mv == INFINITY ? INFINITY : mk > m ? mk : m;
    }
    most[kb] = m;
  }
}

/* How many blocks of the map (n of them) are hidden whole; -1 where one is TL_ODD. */
static int64_t tl_attn_hidden(const unsigned char *dead, int64_t n) {
  int64_t hidden = 0;
  for (int64_t i = 0; i < n; i++) {
    if (dead[i] == TL_ODD) return -1;
    hidden += dead[i] == TL_MINUS_INF || dead[i] == TL_BELOW;
  }
  return hidden;
}

/* Whether a task skips a block of the map (tl_attn_block): one its mask hides whole gets no
   weight in eager's op always under -inf, and under finite values (TL_BELOW, -1e30 or less)
   where every score scale * q.k is below 1e22 (bounded by dscale * qmost * kmost: D *
   |scale| times the largest |q| of the task's rows and |k| of the block): a score added to
   such a value then rounds to -1e30 or less, 7.6e22 below any row maximum above TL_DEAD
   (rows that see no other key run eager's op). */
static inline int tl_attn_skips(int block, float qmost, float kmost, double dscale) {
  return block == TL_MINUS_INF || (block == TL_BELOW && dscale * qmost * kmost < 1e22);
}

/* The mask's dead-block map (tl_attn_dead_map: loops of the caller's parallel region),
   then whether fewer than a quarter of its blocks are hidden whole: below that, blocks of
   64 keys (no faster than eager's 512 at head dim 64, 0.75-0.95x without a block to skip)
   save too little, and *failed is 3 (eager's op runs), as for a mask with a NaN or +inf.
   Only then are the keys and values read (tl_attn_key_bounds into most, kblocks floats):
   one that is not finite makes it 4 (eager's op: a hidden key's zero weight times it is
   NaN there; under a causal flag too, whose hidden keys eager's blocks of 512 multiply).
   0 without either. Every thread counts the same map and bounds, so all take the same
   branch (each loop ends in the region's barrier). */
static int tl_attn_few_dead(const float *mask, const int64_t *sm, int64_t Bm, int64_t Hm,
                            int64_t Lq, int64_t Lk, const float *k, const int64_t *sk,
                            const float *v, const int64_t *sv, int64_t B, int64_t Hk,
                            int64_t D, int causal, float *most, unsigned char *dead,
                            int *failed) {
  if (mask == NULL && !causal) return 0;
  const int64_t kblocks = (Lk + TL_ABK - 1) / TL_ABK;
  int answer = 3;  /* (the mask's own verdict: attention.py keeps it for the mask) */
  int enough = 1;
  if (mask != NULL) {
    tl_attn_dead_map(mask, sm, Bm, Hm, Lq, Lk, dead);
    const int64_t n = Bm * Hm * ((Lq + TL_ABQ - 1) / TL_ABQ) * kblocks;
    enough = tl_attn_hidden(dead, n) * 4 >= n;
  }
  if (enough) {
    tl_attn_key_bounds(k, sk, v, sv, B, Hk, Lk, D, most);
    int finite = 1;
    for (int64_t kb = 0; kb < kblocks; kb++) finite &= most[kb] < INFINITY;
    if (finite) return 0;
    answer = 4;
  }
  #pragma omp atomic write
  *failed = answer;
  return 1;
}
