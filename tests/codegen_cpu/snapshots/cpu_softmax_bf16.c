/* torchloom cpu kernel for this group:
 *   graph @group0(%a: bf16[64, 1000]) {
 *     %f = prims.convert_element_type.default(%a) {dtype = #f32} : f32[64, 1000]
 *     %x = aten.amax.default(%f) {dim = [-1], keepdim = true} : f32[64, 1]
 *     %s = aten.sub.Tensor(%f, %x) : f32[64, 1000]
 *     %e = aten.exp.default(%s) : f32[64, 1000]
 *     %t = aten.sum.dim_IntList(%e) {dim = [-1], keepdim = true} : f32[64, 1]
 *     %y = aten.div.Tensor(%e, %t) : f32[64, 1000]
 *     %b = prims.convert_element_type.default(%y) {dtype = #bf16} : bf16[64, 1000]
 *     return %b
 *   }
 * reduction over 64 rows */
void fused_convert_element_type_amax_sub_exp_sum_div_fb08d4bf95(const uint16_t* in_a, uint16_t* out_b, int nthreads) {
  #pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int64_t x = 0; x < 64; x++) {
    float buf_e[1000];
    float acc_max1 = -INFINITY;
    int nan2 = 0;
    float acc_max1_lanes[16];
    for (int64_t rl = 0; rl < 16; rl++) {
      acc_max1_lanes[rl] = -INFINITY;
    }
    int nan2_lanes[16];
    for (int64_t rl = 0; rl < 16; rl++) {
      nan2_lanes[rl] = 0;
    }
    for (int64_t rb = 0; rb < 62; rb++) {
      #pragma omp simd
      for (int64_t rl = 0; rl < 16; rl++) {
        const int64_t r = rb * 16 + rl;
        const float a3 = tl_bf16_to_f32(in_a[x * 1000 + r]);
        acc_max1_lanes[rl] = a3 > acc_max1_lanes[rl] ? a3 : acc_max1_lanes[rl];
        nan2_lanes[rl] |= a3 != a3;
      }
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 16; rl++) {
      const int64_t r = 984 + rl;
      const float a3 = tl_bf16_to_f32(in_a[x * 1000 + r]);
      acc_max1_lanes[rl] = r >= 992 && (a3 > acc_max1_lanes[rl]) ? a3 : acc_max1_lanes[rl];
      const int nan2_lanes_in = r >= 992 ? a3 != a3 : 0;
      nan2_lanes[rl] |= nan2_lanes_in;
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 8; rl++) {
      acc_max1_lanes[rl] = acc_max1_lanes[rl + 8] > acc_max1_lanes[rl] ? acc_max1_lanes[rl + 8] : acc_max1_lanes[rl];
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 8; rl++) {
      nan2_lanes[rl] |= nan2_lanes[rl + 8];
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 4; rl++) {
      acc_max1_lanes[rl] = acc_max1_lanes[rl + 4] > acc_max1_lanes[rl] ? acc_max1_lanes[rl + 4] : acc_max1_lanes[rl];
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 4; rl++) {
      nan2_lanes[rl] |= nan2_lanes[rl + 4];
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 2; rl++) {
      acc_max1_lanes[rl] = acc_max1_lanes[rl + 2] > acc_max1_lanes[rl] ? acc_max1_lanes[rl + 2] : acc_max1_lanes[rl];
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 2; rl++) {
      nan2_lanes[rl] |= nan2_lanes[rl + 2];
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 1; rl++) {
      acc_max1_lanes[rl] = acc_max1_lanes[rl + 1] > acc_max1_lanes[rl] ? acc_max1_lanes[rl + 1] : acc_max1_lanes[rl];
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 1; rl++) {
      nan2_lanes[rl] |= nan2_lanes[rl + 1];
    }
    acc_max1 = acc_max1_lanes[0] > acc_max1 ? acc_max1_lanes[0] : acc_max1;
    nan2 |= nan2_lanes[0];
    const float max4 = nan2 ? (float)NAN : acc_max1;
    float acc_sum5 = 0;
    float acc_sum5_lanes[16];
    for (int64_t rl = 0; rl < 16; rl++) {
      acc_sum5_lanes[rl] = 0;
    }
    for (int64_t rb = 0; rb < 62; rb++) {
      #pragma omp simd
      for (int64_t rl = 0; rl < 16; rl++) {
        const int64_t r = rb * 16 + rl;
        const float a6 = tl_bf16_to_f32(in_a[x * 1000 + r]);
        const float sub7 = a6 - max4;
        const float exp8 = tl_exp_nonpos(sub7);
        buf_e[r] = exp8;
        acc_sum5_lanes[rl] += exp8;
      }
    }
    #pragma omp simd
    for (int64_t rl = 0; rl < 16; rl++) {
      const int64_t r = 984 + rl;
      const float a6 = tl_bf16_to_f32(in_a[x * 1000 + r]);
      const float sub7 = a6 - max4;
      const float exp8 = tl_exp_nonpos(sub7);
      buf_e[r] = r >= 992 ? exp8 : buf_e[r];
      const float acc_sum5_lanes_in = r >= 992 ? exp8 : 0;
      acc_sum5_lanes[rl] += acc_sum5_lanes_in;
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
    #pragma omp simd
    for (int64_t r = 0; r < 992; r++) {
      const float e9 = buf_e[r];
      const float div10 = e9 / acc_sum5;
      out_b[x * 1000 + r] = tl_f32_to_bf16(div10);
    }
    #pragma omp simd
    for (int64_t r = 984; r < 1000; r++) {
      const float e9 = buf_e[r];
      const float div10 = e9 / acc_sum5;
      out_b[x * 1000 + r] = r >= 992 ? (tl_f32_to_bf16(div10)) : out_b[x * 1000 + r];
    }
  }
}
