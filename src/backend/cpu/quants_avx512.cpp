// AVX-512 (F/BW/VL/DQ) with VNNI: the classic-quant gemm tiles with
// vpdpbusd (u8 x s8 -> i32 in one instruction) on 256-bit vectors, using
// the 32 vector registers AVX-512VL gives for 4 x 4 tiles: the 1-token tile
// of gemm_x86_impl.h, and for 2..4 tokens the tile of gemm_q_avx512_impl.h
// (same arithmetic per dot, fewer multiply-pipe instructions); the K-quant
// tiles of gemm_kquant_avx512_impl.h on 512-bit vectors. Installed only
// when the CPU has AVX512_VNNI; otherwise the AVX2 table stays.
#define RILL_KERNEL_TARGET __attribute__((target("avx512vnni")))
#include "backend/cpu/gemm_kquant_avx512_impl.h"
#include "backend/cpu/gemm_q_avx512_impl.h"
#include "backend/cpu/gemm_x86_impl.h"

namespace rill::cpu {
namespace {

struct DotVnni {
  static constexpr int kMaxT = 4;
  RILL_KERNEL_TARGET static __m256i dot(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
  }
};

constexpr size_t id(DType t) {
  return static_cast<size_t>(t);
}

}  // namespace

void fill_kernels_avx512(Kernels& k) {
  k.isa = Isa::kAvx512;
  fill_ops_avx512(k);
  if (!cpu_features().avx512_vnni) return;
  k.gemm[id(DType::kQ4_0)] = gemm_q_vnni<DecQ4_0, DotVnni>();
  k.gemm[id(DType::kQ4_1)] = gemm_q_vnni<DecQ4_1, DotVnni>();
  k.gemm[id(DType::kQ5_0)] = gemm_q_vnni<DecQ5_0, DotVnni>();
  k.gemm[id(DType::kQ5_1)] = gemm_q_vnni<DecQ5_1, DotVnni>();
  k.gemm[id(DType::kQ8_0)] = gemm_q_vnni<DecQ8_0, DotVnni>();
  k.gemm[id(DType::kQ4_K)] = gemm_k_vnni<KVnniQ4>();
  k.gemm[id(DType::kQ5_K)] = gemm_k_vnni<KVnniQ5>();
  k.gemm[id(DType::kQ6_K)] = gemm_k_vnni<KVnniQ6>();
}

}  // namespace rill::cpu
