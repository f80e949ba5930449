// AVX2 + FMA + F16C: the Q2_K, Q3_K, IQ4_XS and IQ4_NL gemm tiles of
// gemm_iquant_x86_impl.h with maddubs + madd (16 ymm registers: 4 x 2
// accumulators for the K types; IQ4_NL keeps two per pair, so 4 x 1).
#include "backend/cpu/gemm_iquant_x86_impl.h"

namespace rill::cpu {
namespace {

struct IqOpsAvx2 {
  static constexpr int kMaxTK = 2;
  static constexpr int kMaxTNl = 1;
  static __m256i madd_acc(__m256i acc, __m256i p16, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, s));
  }
  static __m256i dot(__m256i u, __m256i s) { return simd::dot_us8_i32(u, s); }
};

}  // namespace

void fill_iquant_avx2(Kernels& k) {
  fill_iquant_gemm<IqOpsAvx2>(k);
}

}  // namespace rill::cpu
