// AVX-512 VL + VNNI: the Q2_K, Q3_K, IQ4_XS and IQ4_NL gemm tiles of
// gemm_iquant_x86_impl.h on 256-bit vectors with vpdpwssd (the scaled i16
// pair sums accumulated in one instruction) and vpdpbusd (IQ4_NL's u8 x s8
// dot), and the 32 vector registers AVX-512VL gives: 4 x 4 tiles for the
// K types, 4 x 2 for IQ4_NL. Installed only when the CPU has AVX512_VNNI.
#define RILL_KERNEL_TARGET __attribute__((target("avx512vnni")))
#include "backend/cpu/gemm_iquant_x86_impl.h"

namespace rill::cpu {
namespace {

struct IqOpsVnni {
  static constexpr int kMaxTK = 4;
  static constexpr int kMaxTNl = 2;
  RILL_KERNEL_TARGET static __m256i madd_acc(__m256i acc, __m256i p16, __m256i s) {
    return _mm256_dpwssd_epi32(acc, p16, s);
  }
  RILL_KERNEL_TARGET static __m256i dot(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
  }
};

}  // namespace

void fill_iquant_avx512(Kernels& k) {
  if (!cpu_features().avx512_vnni) return;
  fill_iquant_gemm<IqOpsVnni>(k);
}

}  // namespace rill::cpu
