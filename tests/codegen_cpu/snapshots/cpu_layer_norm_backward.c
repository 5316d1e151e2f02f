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
    float acc_sum1_lanes[16];
    for (int64_t rl = 0; rl < 16; rl++) {
      acc_sum1_lanes[rl] = 0;
    }
    for (int64_t rb = 0; rb < 3; rb++) {
      #pragma omp simd
      for (int64_t rl = 0; rl < 16; rl++) {
        const int64_t r = rb * 16 + rl;
        const float g2 = in_g[x * 48 + r];
        const float w3 = in_w[r];
        const float mul4 = g2 * w3;
        acc_sum1_lanes[rl] += mul4;
      }
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 8; rl++) {
      acc_sum1_lanes[rl] += acc_sum1_lanes[rl + 8];
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 4; rl++) {
      acc_sum1_lanes[rl] += acc_sum1_lanes[rl + 4];
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 2; rl++) {
      acc_sum1_lanes[rl] += acc_sum1_lanes[rl + 2];
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 1; rl++) {
      acc_sum1_lanes[rl] += acc_sum1_lanes[rl + 1];
    }
    acc_sum1 += acc_sum1_lanes[0];
    float acc_sum5 = 0;
    const float m10 = in_m[x];
    const float vr12 = in_r[x];
    float acc_sum5_lanes[16];
    for (int64_t rl = 0; rl < 16; rl++) {
      acc_sum5_lanes[rl] = 0;
    }
    for (int64_t rb = 0; rb < 3; rb++) {
      #pragma omp simd
      for (int64_t rl = 0; rl < 16; rl++) {
        const int64_t r = rb * 16 + rl;
        const float g6 = in_g[x * 48 + r];
        const float w7 = in_w[r];
        const float mul8 = g6 * w7;
        const float vx9 = in_x[x * 48 + r];
        const float sub11 = vx9 - m10;
        const float mul13 = sub11 * vr12;
        const float mul14 = mul8 * mul13;
        acc_sum5_lanes[rl] += mul14;
      }
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 8; rl++) {
      acc_sum5_lanes[rl] += acc_sum5_lanes[rl + 8];
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 4; rl++) {
      acc_sum5_lanes[rl] += acc_sum5_lanes[rl + 4];
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 2; rl++) {
      acc_sum5_lanes[rl] += acc_sum5_lanes[rl + 2];
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 1; rl++) {
      acc_sum5_lanes[rl] += acc_sum5_lanes[rl + 1];
    }
    acc_sum5 += acc_sum5_lanes[0];
    const float div16 = vr12 / ((float)48.0);
    int64_t r_n29 = 48;
    __asm__("" : "+r"(r_n29));
    #pragma omp simd
    for (int64_t r = 0; r < r_n29; r++) {
      const float t15 = in_t[x * 48 + r];
      const float g17 = in_g[x * 48 + r];
      const float w18 = in_w[r];
      const float mul19 = g17 * w18;
      const float mul20 = mul19 * ((float)48.0);
      const float sub21 = mul20 - acc_sum1;
      const float vx22 = in_x[x * 48 + r];
      const float sub23 = vx22 - m10;
      const float mul24 = sub23 * vr12;
      const float mul25 = mul24 * acc_sum5;
      const float sub26 = sub21 - mul25;
      const float mul27 = div16 * sub26;
      const float add28 = t15 + mul27;
      out_t12[x * 48 + r] = add28;
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
