// AVX2 + FMA + F16C: tiled gemm for the classic quant types and float
// weights, and the Q8_0 / Q8_1 activation quantizers (bit-identical to
// quants_ref.cpp).
#include "backend/cpu/gemm_kquant_x86_impl.h"
#include "backend/cpu/gemm_x86_impl.h"

namespace rill::cpu {
namespace {

struct DotMaddubs {
  static constexpr int kMaxT = 2;  // 16 ymm registers: 4 x 2 accumulators + operands
  static __m256i dot(__m256i u, __m256i s) { return simd::dot_us8_i32(u, s); }
};

// One block: q = round_half_even(x * 127/amax); returns the i8 values and d.
inline __m256i quantize_block(const float* x, float* d_out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
  }
  const float m = simd::hmax(amax);
  *d_out = m / 127.0f;
  const __m256 id = _mm256_set1_ps(m != 0.0f ? 127.0f / m : 0.0f);
  __m256i q[4];
  for (int k = 0; k < 4; ++k)
    q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return simd::pack_i32x32_to_i8(q[0], q[1], q[2], q[3]);
}

void quantize_q8_0(const float* x, void* out, int64_t n) {
  auto* y = static_cast<BlockQ8_0*>(out);
  for (int64_t i = 0; i < n / kQK; ++i) {
    float d;
    const __m256i q = quantize_block(x + i * kQK, &d);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs), q);
    y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
  }
}

void quantize_q8_1(const float* x, void* out, int64_t n) {
  auto* y = static_cast<BlockQ8_1*>(out);
  for (int64_t i = 0; i < n / kQK; ++i) {
    float d;
    const __m256i q = quantize_block(x + i * kQK, &d);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs), q);
    // sum of the 32 int8 values
    const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
    const int sum = simd::hsum_i32(_mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
    y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    y[i].s = _cvtss_sh(d * static_cast<float>(sum), _MM_FROUND_TO_NEAREST_INT);
  }
}

constexpr size_t id(DType t) {
  return static_cast<size_t>(t);
}

}  // namespace

void fill_kernels_avx2(Kernels& k) {
  k.isa = Isa::kAvx2;
  k.gemm[id(DType::kQ4_0)] = gemm_q<DecQ4_0, DotMaddubs>();
  k.gemm[id(DType::kQ4_1)] = gemm_q<DecQ4_1, DotMaddubs>();
  k.gemm[id(DType::kQ5_0)] = gemm_q<DecQ5_0, DotMaddubs>();
  k.gemm[id(DType::kQ5_1)] = gemm_q<DecQ5_1, DotMaddubs>();
  k.gemm[id(DType::kQ8_0)] = gemm_q<DecQ8_0, DotMaddubs>();
  k.gemm[id(DType::kQ4_K)] = gemm_k<KDecQ4>();
  k.gemm[id(DType::kQ5_K)] = gemm_k<KDecQ5>();
  k.gemm[id(DType::kQ6_K)] = gemm_k<KDecQ6>();
  k.gemm[id(DType::kF32)] = gemm_f<LoadF32, DotMaddubs>();
  k.gemm[id(DType::kF16)] = gemm_f<LoadF16, DotMaddubs>();
  k.gemm[id(DType::kBF16)] = gemm_f<LoadBF16, DotMaddubs>();
  k.quantize[id(DType::kQ8_0)] = quantize_q8_0;
  k.quantize[id(DType::kQ8_1)] = quantize_q8_1;
  fill_ops_avx2(k);
}

}  // namespace rill::cpu
