/* torchloom cpu kernel for this group:
 *   graph @group0(%g: f32[64, 48], %w: f32[48], %x: f32[64, 48], %m: f32[64, 1], %r: f32[64, 1], %t: f32[64, 48]) {
 *     %t0 = aten.mul.Tensor(%g, %w) : f32[64, 48]
 *     %t1 = aten.mul.Tensor(%t0) {other = 48} : f32[64, 48]
 *     %t2 = aten.sum.dim_IntList(%t0) {dim = [1], keepdim = true} : f32[64, 1]
 *     %t3 = aten.sub.Tensor(%x, %m) : f32[64, 48]
 *     %t4 = aten.mul.Tensor(%t3, %r) : f32[64, 48]
 *     %t5 = aten.mul.Tensor(%t0, %t4) : f32[64, 48]
 *     %t6 = aten.sum.dim_IntList(%t5) {dim = [1], keepdim = true} : f32[64, 1]
 *     %t7 = aten.mul.Tensor(%t4, %t6) : f32[64, 48]
 *     %t8 = aten.sub.Tensor(%t1, %t2) : f32[64, 48]
 *     %t9 = aten.sub.Tensor(%t8, %t7) : f32[64, 48]
 *     %t10 = aten.div.Tensor(%r) {other = 48} : f32[64, 1]
 *     %t11 = aten.mul.Tensor(%t10, %t9) : f32[64, 48]
 *     %t12 = aten.add.Tensor(%t, %t11) : f32[64, 48]
 *     %t13 = aten.mul.Tensor(%g, %t4) : f32[64, 48]
 *     %t14 = aten.sum.dim_IntList(%t13) {dim = [0]} : f32[48]
 *     %t15 = aten.sum.dim_IntList(%g) {dim = [0]} : f32[48]
 *     return %t12, %t14, %t15
 *   }
 * reduction over 64 rows, reduction (columns) over 3 rows */
void fused_mul_sum_sub_div_add_c797fe3819(const float* restrict in_g, const float* restrict in_w, const float* restrict in_x, const float* restrict in_m, const float* restrict in_r, const float* restrict in_t, float* restrict out_t12, float* restrict out_t14, float* restrict out_t15, int nthreads) {
  (void)nthreads;
  for (int64_t x = 0; x < 64; x++) {
    float acc_sum1 = 0;
    int64_t r_n5 = 48;
    __asm__("" : "+r"(r_n5));
    #pragma omp simd reduction(+:acc_sum1)
    for (int64_t r = 0; r < r_n5; r++) {
      const float g2 = in_g[x * 48 + r];
      const float w3 = in_w[r];
      const float mul4 = g2 * w3;
      acc_sum1 += mul4;
    }
    float acc_sum6 = 0;
    const float m11 = in_m[x];
    const float vr13 = in_r[x];
    int64_t r_n16 = 48;
    __asm__("" : "+r"(r_n16));
    #pragma omp simd reduction(+:acc_sum6)
    for (int64_t r = 0; r < r_n16; r++) {
      const float g7 = in_g[x * 48 + r];
      const float w8 = in_w[r];
      const float mul9 = g7 * w8;
      const float vx10 = in_x[x * 48 + r];
      const float sub12 = vx10 - m11;
      const float mul14 = sub12 * vr13;
      const float mul15 = mul9 * mul14;
      acc_sum6 += mul15;
    }
    const float div18 = vr13 / ((float)48.0);
    int64_t r_n31 = 48;
    __asm__("" : "+r"(r_n31));
    #pragma omp simd
    for (int64_t r = 0; r < r_n31; r++) {
      const float t17 = in_t[x * 48 + r];
      const float g19 = in_g[x * 48 + r];
      const float w20 = in_w[r];
      const float mul21 = g19 * w20;
      const float mul22 = mul21 * ((float)48.0);
      const float sub23 = mul22 - acc_sum1;
      const float vx24 = in_x[x * 48 + r];
      const float sub25 = vx24 - m11;
      const float mul26 = sub25 * vr13;
      const float mul27 = mul26 * acc_sum6;
      const float sub28 = sub23 - mul27;
      const float mul29 = div18 * sub28;
      const float add30 = t17 + mul29;
      out_t12[x * 48 + r] = add30;
    }
  }
  const int64_t n_xb = 1;
  for (int64_t xb = 0; xb < n_xb; xb++) {
    const int64_t c0 = xb * 3 / n_xb * 16;
    const int64_t e1 = (xb + 1) * 3 / n_xb * 16;
    const int64_t c1 = e1 < 48 ? e1 : 48;
    float acc_sum1[48];
    for (int64_t x = 0; x < c1 - c0; x++) {
      acc_sum1[x] = 0;
    }
    float acc_sum2[48];
    for (int64_t x = 0; x < c1 - c0; x++) {
      acc_sum2[x] = 0;
    }
    for (int64_t r = 0; r < 64; r++) {
      const float m5 = in_m[r];
      const float vr7 = in_r[r];
      #pragma omp simd
      for (int64_t x = c0; x < c1; x++) {
        const float g3 = in_g[r * 48 + x];
        const float vx4 = in_x[r * 48 + x];
        const float sub6 = vx4 - m5;
        const float mul8 = sub6 * vr7;
        const float mul9 = g3 * mul8;
        acc_sum1[x - c0] += mul9;
        acc_sum2[x - c0] += g3;
      }
    }
    #pragma omp simd
    for (int64_t x = c0; x < c1; x++) {
      const float sum10 = acc_sum1[x - c0];
      out_t14[x] = sum10;
      const float sum11 = acc_sum2[x - c0];
      out_t15[x] = sum11;
    }
  }
}
