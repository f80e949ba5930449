// The AVX-512 form of attention_quant_impl.h's attend for heads of whole
// 32-element blocks (head_dim 32, 64, 96, 128 or 256): each K/V row's
// head is dequantized straight into zmm registers (no buffer, no call per
// row: the kernel is instantiated per type) once for the whole GQA group.
// Same contract as the baseline: f32 scores, softmax with max subtraction,
// exp as ggml's AVX-512 expf, the sum in double per 16 keys, f32 p.v. The
// arithmetic of a (query, head) depends only on its keys [j_begin, j_end)
// and head count, never on the batch, so results stay batch invariant.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cpu/attention_f16_avx512_impl.h"  // reduce16x16
#include "backend/cpu/attention_quant.h"
#include "backend/cpu/exp_ggml_avx512.h"
#include "backend/cpu/quants.h"
#include "core/half.h"

namespace rill::cpu::detail {
namespace {

inline __m512 splat_f16(uint16_t h) {
  return _mm512_set1_ps(f16_to_f32(h));
}

// 4-bit codes of one block (16 bytes): elements 0..15 (low nibbles) and
// 16..31 (high nibbles) as 32-bit ints.
inline void nibbles(const uint8_t* qs, __m512i& lo, __m512i& hi) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  lo = _mm512_cvtepu8_epi32(_mm_and_si128(x, mask));
  hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(x, 4), mask));
}
// Adds 16 to the elements whose bit is set in the block's qh (bit j: element j).
inline void high_bits(const uint8_t* qh, __m512i& lo, __m512i& hi) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  const __m512i sixteen = _mm512_set1_epi32(16);
  lo = _mm512_mask_add_epi32(lo, static_cast<__mmask16>(h & 0xFFFF), lo, sixteen);
  hi = _mm512_mask_add_epi32(hi, static_cast<__mmask16>(h >> 16), hi, sixteen);
}

// Block b (32 elements) of a head of type T at p: elements 0..15 in lo,
// 16..31 in hi; the same values as attention_quant_impl.h's dequantizers.
template <DType T>
inline void dq32(const uint8_t* p, int b, __m512& lo, __m512& hi) {
  if constexpr (T == DType::kF32) {
    const auto* f = reinterpret_cast<const float*>(p) + 32 * b;
    lo = _mm512_loadu_ps(f);
    hi = _mm512_loadu_ps(f + 16);
  } else if constexpr (T == DType::kF16) {
    const auto* h = reinterpret_cast<const __m256i*>(p + 64 * b);
    lo = _mm512_cvtph_ps(_mm256_loadu_si256(h));
    hi = _mm512_cvtph_ps(_mm256_loadu_si256(h + 1));
  } else if constexpr (T == DType::kBF16) {
    const auto* h = reinterpret_cast<const __m256i*>(p + 64 * b);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(h)), 16));
    hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(h + 1)), 16));
  } else if constexpr (T == DType::kQ8_0) {
    const auto* blk = reinterpret_cast<const BlockQ8_0*>(p) + b;
    const __m512 d = splat_f16(blk->d);
    const auto* q = reinterpret_cast<const __m128i*>(blk->qs);
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))), d);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))), d);
  } else if constexpr (T == DType::kQ4_0) {
    const auto* blk = reinterpret_cast<const BlockQ4_0*>(p) + b;
    const __m512 d = splat_f16(blk->d);
    __m512i l, h;
    nibbles(blk->qs, l, h);
    const __m512i eight = _mm512_set1_epi32(8);
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(l, eight)), d);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(h, eight)), d);
  } else if constexpr (T == DType::kQ4_1) {
    const auto* blk = reinterpret_cast<const BlockQ4_1*>(p) + b;
    const __m512 d = splat_f16(blk->d), m = splat_f16(blk->m);
    __m512i l, h;
    nibbles(blk->qs, l, h);
    lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l), d, m);
    hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h), d, m);
  } else if constexpr (T == DType::kQ5_0) {
    const auto* blk = reinterpret_cast<const BlockQ5_0*>(p) + b;
    const __m512 d = splat_f16(blk->d);
    __m512i l, h;
    nibbles(blk->qs, l, h);
    high_bits(blk->qh, l, h);
    const __m512i sixteen = _mm512_set1_epi32(16);
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(l, sixteen)), d);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(h, sixteen)), d);
  } else {
    static_assert(T == DType::kQ5_1);
    const auto* blk = reinterpret_cast<const BlockQ5_1*>(p) + b;
    const __m512 d = splat_f16(blk->d), m = splat_f16(blk->m);
    __m512i l, h;
    nibbles(blk->qs, l, h);
    high_bits(blk->qh, l, h);
    lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l), d, m);
    hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h), d, m);
  }
}

template <DType T, int NB>
inline void dq_head(const uint8_t* p, __m512 (&x)[2 * NB]) {
#pragma GCC unroll 8
  for (int b = 0; b < NB; ++b) dq32<T>(p, b, x[2 * b], x[2 * b + 1]);
}

// scores[g * n + j - j_begin] = scale * q_g.k_j (softcapped) for every head
// of the group, 16 keys at a time: each K row dequantized once per kHeads
// heads; per (key, head) one fma chain per 16-dim half of each block pair,
// the two added, then the 16 keys' lane sums at once (reduce16x16). A
// partial last block is padded with zero vectors, so every key's score is
// the same arithmetic wherever it falls.
template <DType KT, int NB>
void k_scores(const QuantAttendArgs& a, int64_t n) {
  constexpr int64_t hd = 32 * NB;
  constexpr int kHeads = 8;
  alignas(64) __m512 c[kHeads][16];
  alignas(64) float dots[16];
  for (int g0 = 0; g0 < a.n_heads; g0 += kHeads) {
    const int gc = a.n_heads - g0 < kHeads ? a.n_heads - g0 : kHeads;
    for (int64_t j0 = a.j_begin; j0 < a.j_end; j0 += 16) {
      const int cnt = a.j_end - j0 < 16 ? static_cast<int>(a.j_end - j0) : 16;
      for (int t = 0; t < 16; ++t) {
        if (t >= cnt) {
          for (int g = 0; g < gc; ++g) c[g][t] = _mm512_setzero_ps();
          continue;
        }
        __m512 k[2 * NB];
        dq_head<KT, NB>(a.kv.k_row(j0 + t), k);
        for (int g = 0; g < gc; ++g) {
          const float* q = a.q + (g0 + g) * hd;
          __m512 s0 = _mm512_mul_ps(k[0], _mm512_loadu_ps(q)), s1 = _mm512_mul_ps(k[1], _mm512_loadu_ps(q + 16));
#pragma GCC unroll 8
          for (int b = 1; b < NB; ++b) {
            s0 = _mm512_fmadd_ps(k[2 * b], _mm512_loadu_ps(q + 32 * b), s0);
            s1 = _mm512_fmadd_ps(k[2 * b + 1], _mm512_loadu_ps(q + 32 * b + 16), s1);
          }
          c[g][t] = _mm512_add_ps(s0, s1);
        }
      }
      for (int g = 0; g < gc; ++g) {
        reduce16x16(c[g], dots);
        float* out = a.scores + (g0 + g) * n + (j0 - a.j_begin);
        for (int t = 0; t < cnt; ++t) {
          float x = dots[t] * a.scale;
          if (a.softcap > 0.0f) x = a.softcap * std::tanh(x / a.softcap);
          out[t] = x;
        }
      }
    }
  }
}

// s[0, n) = softmax(s): max subtracted, exp, sum in double per 16 keys.
inline void softmax(float* s, int64_t n) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += 16) {
    const auto m = static_cast<__mmask16>(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
    vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, s + j));
  }
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  double sum = 0.0;
  for (int64_t j = 0; j < n; j += 16) {
    const auto m = static_cast<__mmask16>(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_ggml512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), mx)));
    _mm512_mask_storeu_ps(s + j, m, e);
    sum += static_cast<double>(_mm512_reduce_add_ps(e));
  }
  const __m512 inv = _mm512_set1_ps(static_cast<float>(1.0 / sum));
  for (int64_t j = 0; j < n; j += 16) {
    const auto m = static_cast<__mmask16>(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
    _mm512_mask_storeu_ps(s + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), inv));
  }
}

// out[g] = sum_j p_gj v_j for the heads [g0, g0 + gc), gc <= GC, their
// accumulators in registers; each V row dequantized once per GC heads.
template <DType VT, int NB, int GC>
void pv_heads(const QuantAttendArgs& a, int64_t n, int g0, int gc) {
  constexpr int64_t hd = 32 * NB;
  __m512 acc[GC][2 * NB];
#pragma GCC unroll 4
  for (int g = 0; g < GC; ++g)
#pragma GCC unroll 16
    for (int i = 0; i < 2 * NB; ++i) acc[g][i] = _mm512_setzero_ps();
  const float* p = a.scores + g0 * n - a.j_begin;
  for (int64_t j = a.j_begin; j < a.j_end; ++j) {
    __m512 v[2 * NB];
    dq_head<VT, NB>(a.kv.v_row(j), v);
#pragma GCC unroll 4
    for (int g = 0; g < GC; ++g) {
      if (g >= gc) break;
      const __m512 pg = _mm512_set1_ps(p[g * n + j]);
#pragma GCC unroll 16
      for (int i = 0; i < 2 * NB; ++i) acc[g][i] = _mm512_fmadd_ps(v[i], pg, acc[g][i]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < GC; ++g) {
    if (g >= gc) break;
#pragma GCC unroll 16
    for (int i = 0; i < 2 * NB; ++i) _mm512_storeu_ps(a.out + (g0 + g) * hd + 16 * i, acc[g][i]);
  }
}

template <DType KT, DType VT, int NB>
void attend(const QuantAttendArgs& a) {
  // Heads per V pass: their accumulators (2 * NB zmm each) in at most 16 registers.
  constexpr int GC = NB >= 8 ? 1 : (8 / NB > 4 ? 4 : 8 / NB);
  const int64_t n = a.j_end - a.j_begin;
  k_scores<KT, NB>(a, n);
  for (int g = 0; g < a.n_heads; ++g) softmax(a.scores + g * n, n);
  for (int g0 = 0; g0 < a.n_heads; g0 += GC) {
    pv_heads<VT, NB, GC>(a, n, g0, a.n_heads - g0 < GC ? a.n_heads - g0 : GC);
  }
}

template <DType KT, DType VT>
QuantAttend for_head(int64_t head_dim) {
  switch (head_dim) {
    case 32:
      return attend<KT, VT, 1>;
    case 64:
      return attend<KT, VT, 2>;
    case 96:
      return attend<KT, VT, 3>;
    case 128:
      return attend<KT, VT, 4>;
    case 256:
      return attend<KT, VT, 8>;
    default:
      return nullptr;
  }
}

template <DType KT>
QuantAttend for_v(DType v, int64_t head_dim) {
  switch (v) {
    case DType::kF32:
      return for_head<KT, DType::kF32>(head_dim);
    case DType::kF16:
      return for_head<KT, DType::kF16>(head_dim);
    case DType::kBF16:
      return for_head<KT, DType::kBF16>(head_dim);
    case DType::kQ8_0:
      return for_head<KT, DType::kQ8_0>(head_dim);
    case DType::kQ4_0:
      return for_head<KT, DType::kQ4_0>(head_dim);
    case DType::kQ4_1:
      return for_head<KT, DType::kQ4_1>(head_dim);
    case DType::kQ5_0:
      return for_head<KT, DType::kQ5_0>(head_dim);
    case DType::kQ5_1:
      return for_head<KT, DType::kQ5_1>(head_dim);
    default:
      return nullptr;
  }
}

}  // namespace

QuantAttend attend_quant_avx512_for(DType k, DType v, int64_t head_dim) {
  switch (k) {
    case DType::kF32:
      return for_v<DType::kF32>(v, head_dim);
    case DType::kF16:
      return for_v<DType::kF16>(v, head_dim);
    case DType::kBF16:
      return for_v<DType::kBF16>(v, head_dim);
    case DType::kQ8_0:
      return for_v<DType::kQ8_0>(v, head_dim);
    case DType::kQ4_0:
      return for_v<DType::kQ4_0>(v, head_dim);
    case DType::kQ4_1:
      return for_v<DType::kQ4_1>(v, head_dim);
    case DType::kQ5_0:
      return for_v<DType::kQ5_0>(v, head_dim);
    case DType::kQ5_1:
      return for_v<DType::kQ5_1>(v, head_dim);
    default:
      return nullptr;
  }
}

}  // namespace rill::cpu::detail
