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
void fused_add_gelu_mul_19d900c3ee(const float* in_a, const float* restrict in_b, const float* restrict in_c, float* out_m, int nthreads) {
  (void)nthreads;
  for (int64_t x = 0; x < 4; x++) {
    #pragma omp simd
    for (int64_t j = 0; j < 6; j++) {
      const float a1 = in_a[x * 6 + j];
      const float b2 = in_b[x * 6 + j];
      const float add3 = a1 + b2;
      const float gelu4 = tl_gelu_f32(add3);
      const float vc5 = in_c[j];
      const float mul6 = gelu4 * vc5;
      out_m[x * 6 + j] = mul6;
    }
  }
}
