// AVX-512 (F/BW/VL/DQ) with VNNI: the classic-quant gemm tiles with
// vpdpbusd (u8 x s8 -> i32 in one instruction) on 256-bit vectors, using
// the 32 vector registers AVX-512VL gives for 4 x 4 tiles: the 1-token tile
// of gemm_x86_impl.h, and for 2..4 tokens the tile of gemm_q_avx512_impl.h
// (same arithmetic per dot, fewer multiply-pipe instructions); the K-quant
// tiles of gemm_kquant_avx512_impl.h on 512-bit vectors (batches of 8+
// tokens: gemm_kquant_rows_avx512_impl.h). Installed only
// when the CPU has AVX512_VNNI; otherwise the AVX2 table stays.
#define RILL_KERNEL_TARGET __attribute__((target("avx512vnni")))
// GCC 12's AVX-512 permute / extract intrinsics read an undefined source
// vector (gemm_kquant_rows_avx512_impl.h): not a bug here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "backend/cpu/gemm_kquant_avx512_impl.h"
#include "backend/cpu/gemm_kquant_rows_avx512_impl.h"
#include "backend/cpu/gemm_q8_pair_avx512_impl.h"
#include "backend/cpu/gemm_q_avx512_impl.h"
#include "backend/cpu/gemm_x86_impl.h"

namespace rill::cpu {
namespace {

struct DotVnni {
  RILL_KERNEL_TARGET static __m256i dot(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
  }
};

constexpr size_t id(DType t) {
  return static_cast<size_t>(t);
}

// Q8_K rows, bit-identical to ref::quantize_row_q8_k (llama.cpp's
// quantize_row_q8_K_ref): the signed value of largest magnitude (the first
// one on ties), iscale = -127 / max, q = min(127, round-half-even(iscale * x))
// (nearest_int's magic-number rounding is RNE for |v| < 2^22, as cvtps2dq),
// bsums per 16, d = 1 / iscale.
void quantize_q8_k(const float* x, void* out, int64_t n) {
  auto* y = static_cast<BlockQ8_K*>(out);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    __m512 v[16];
    __m512 amax = _mm512_setzero_ps();
    for (int k = 0; k < 16; ++k) {
      v[k] = _mm512_loadu_ps(x + 16 * k);
      amax = _mm512_max_ps(amax, _mm512_abs_ps(v[k]));
    }
    const float m = _mm512_reduce_max_ps(amax);
    if (m == 0.0f) {
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    float max = 0.0f;
    for (int k = 0; k < 16; ++k) {
      const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(v[k]), _mm512_set1_ps(m), _CMP_EQ_OQ);
      if (hit) {
        max = x[16 * k + __builtin_ctz(hit)];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m512 vs = _mm512_set1_ps(iscale);
    for (int k = 0; k < 16; ++k) {
      const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(vs, v[k])), _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[i].qs + 16 * k), _mm512_cvtsepi32_epi8(q));
      y[i].bsums[k] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
    }
    y[i].d = 1.0f / iscale;
  }
}

}  // namespace

void fill_kernels_avx512(Kernels& k) {
  k.isa = Isa::kAvx512;
  fill_ops_avx512(k);
  k.quantize[id(DType::kQ8_K)] = quantize_q8_k;
  if (!cpu_features().avx512_vnni) return;
  k.gemm[id(DType::kQ4_0)] = gemm_q_vnni<DecQ4_0, DotVnni>();
  k.gemm[id(DType::kQ4_1)] = gemm_q_vnni<DecQ4_1, DotVnni>();
  k.gemm[id(DType::kQ5_0)] = gemm_q_vnni<DecQ5_0, DotVnni>();
  k.gemm[id(DType::kQ5_1)] = gemm_q_vnni<DecQ5_1, DotVnni>();
  k.gemm[id(DType::kQ8_0)] = &gemm_q8_pair_entry<DotVnni>;
  k.gemm[id(DType::kQ4_K)] = &gemm_k_rows_entry<KRowsQ4>;
  k.gemm[id(DType::kQ5_K)] = &gemm_k_rows_entry<KRowsQ5>;
  k.gemm[id(DType::kQ6_K)] = &gemm_k_rows_entry<KRowsQ6>;
  // The K-quant row tiles block tokens themselves, after one repack per call.
  for (DType t : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) k.gemm_max_tokens[id(t)] = 1 << 20;
}

}  // namespace rill::cpu
