// The AVX-512 form of attention_quant_impl.h's attend for heads of whole
// 32-element blocks (head_dim 32, 64, 96, 128 or 256; 64, 128 or 256 with
// q8_0h64's blocks of 64): each K/V row's
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
#include <limits>

#include "backend/cpu/attention_f16_avx512_impl.h"  // reduce16x16
#include "backend/cpu/attention_quant.h"
#include "backend/cpu/attention_quant_tile_dispatch.h"
#include "backend/cpu/exp_ggml_avx512.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/quants.h"
#include "core/e4m3.h"
#include "core/half.h"

// GCC 12 reports the deliberately undefined pass-through operands of its
// unmasked AVX-512 intrinsics (_mm512_max_ps, _mm512_scalef_ps, the
// reductions) as used uninitialized once inlined into these loops; with no
// mask nothing undefined is ever read (as attention_f16_group_avx512.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace rill::cpu::detail {
namespace {

// f16 to f32 is exact, so F16C's conversion is f16_to_f32's value.
inline __m512 splat_f16(uint16_t h) {
  return _mm512_set1_ps(_cvtsh_ss(h));
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

// 16 e4m3 bytes as f32, e4m3_to_f32's arithmetic in lanes: the magnitude's
// bits moved to an f32's exponent and mantissa with the bias moved from 7 to
// 127 (normal codes), m * 2^-9 (subnormal codes), NaN for 0x7f, the sign
// bit copied.
inline __m512 fp8x16(__m128i bytes) {
  const __m512i u = _mm512_cvtepu8_epi32(bytes);
  const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7F));
  __m512 v = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23)));
  const __m512 sub =
      _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(mag, _mm512_set1_epi32(7))), _mm512_set1_ps(1.0f / 512.0f));
  v = _mm512_mask_mov_ps(v, _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8)), sub);
  v = _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F)),
                         _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(u, _mm512_set1_epi32(0x80)), 24);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
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
  } else if constexpr (T == DType::kIQ4_NL) {
    const auto* blk = reinterpret_cast<const BlockIQ4_NL*>(p) + b;
    const __m512 d = splat_f16(blk->d);
    __m512i l, h;
    nibbles(blk->qs, l, h);
    const __m512 levels =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues))));
    lo = _mm512_mul_ps(_mm512_permutexvar_ps(l, levels), d);
    hi = _mm512_mul_ps(_mm512_permutexvar_ps(h, levels), d);
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
  } else if constexpr (T == kF8E4M3) {
    const auto* q = reinterpret_cast<const __m128i*>(p + 32 * b);
    lo = fp8x16(_mm_loadu_si128(q));
    hi = fp8x16(_mm_loadu_si128(q + 1));
  } else if constexpr (T == kKvQ8_0x64) {
    // q8_0h64: 32-element block b is half b % 2 of the 64-value block b / 2.
    const uint8_t* blk = p + kQ8_0x64Bytes * (b / 2);
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    const __m512 d = splat_f16(dh);
    const auto* q = reinterpret_cast<const __m128i*>(blk + 2 + 32 * (b % 2));
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))), d);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))), d);
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

// The cache lines of a head of `bytes` bytes at p.
inline void prefetch_head(const uint8_t* p, size_t bytes) {
  const auto first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  for (uintptr_t l = first; l < reinterpret_cast<uintptr_t>(p) + bytes; l += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(l), _MM_HINT_T0);
  }
}

template <DType T, int NB>
inline void dq_head(const uint8_t* p, __m512 (&x)[2 * NB]) {
#pragma GCC unroll 8
  for (int b = 0; b < NB; ++b) dq32<T>(p, b, x[2 * b], x[2 * b + 1]);
}

// scores(h)[j - begin(h)] = scale * q_h.k_j (softcapped) for the heads
// [h0, h0 + hc), hc <= kHeads, 16 keys at a time over the union of their
// ranges: each K row dequantized once for all of them; per (key, head) one
// fma chain per 16-dim half of each block pair, the two added, then the 16
// keys' lane sums at once (reduce16x16, where each key's sum reads only its
// own vector). A head whose range meets a block scores all of the block's
// keys (rows of the union, so valid to read) and stores those in its range;
// the others are never stored, and no key's arithmetic depends on another's,
// so each score is the same wherever its key falls and whatever the tile
// holds.
constexpr int kHeads = 16;
template <DType KT, int NB>
void k_scores(const QuantTileArgs& a, const TileHeads& th, int h0, int hc, int64_t lo, int64_t hi) {
  constexpr int64_t hd = 32 * NB;
  alignas(64) __m512 c[kHeads][16];
  alignas(64) float dots[16];
  int64_t hb[kHeads], he[kHeads];
  const size_t k_bytes = row_bytes(KT, hd);
  for (int h = 0; h < hc; ++h) {
    hb[h] = th.begin(h0 + h);
    he[h] = th.end(h0 + h);
  }
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int64_t j0 = lo; j0 < hi; j0 += 16) {
    const int cnt = hi - j0 < 16 ? static_cast<int>(hi - j0) : 16;
    // The heads whose range meets keys [j0, j0 + cnt).
    int live[kHeads], n_live = 0;
    for (int h = 0; h < hc; ++h) {
      if (he[h] > j0 && hb[h] < j0 + cnt) live[n_live++] = h;
    }
    if (n_live == 0) continue;
    // Deep contexts stream K from memory: ask for the rows 32 keys ahead.
    for (int64_t j = j0 + 32; j < j0 + 48 && j < hi; ++j) prefetch_head(a.kv.k_row(j), k_bytes);
    for (int t = 0; t < 16; ++t) {
      if (t >= cnt) {
        for (int i = 0; i < n_live; ++i) c[live[i]][t] = _mm512_setzero_ps();
        continue;
      }
      __m512 k[2 * NB];
      dq_head<KT, NB>(a.kv.k_row(j0 + t), k);
      for (int i = 0; i < n_live; ++i) {
        const int h = live[i];
        const float* q = a.q + (h0 + h) * hd;
        __m512 s0 = _mm512_mul_ps(k[0], _mm512_loadu_ps(q)), s1 = _mm512_mul_ps(k[1], _mm512_loadu_ps(q + 16));
#pragma GCC unroll 8
        for (int b = 1; b < NB; ++b) {
          s0 = _mm512_fmadd_ps(k[2 * b], _mm512_loadu_ps(q + 32 * b), s0);
          s1 = _mm512_fmadd_ps(k[2 * b + 1], _mm512_loadu_ps(q + 32 * b + 16), s1);
        }
        c[h][t] = _mm512_add_ps(s0, s1);
      }
    }
    for (int i = 0; i < n_live; ++i) {
      const int h = live[i];
      const int64_t b = hb[h], e = he[h];
      reduce16x16(c[h], dots);
      float* out = th.scores(h0 + h) - b;
      // Lanes t with j0 + t in [b, e): a run of the block.
      const int t0 = b > j0 ? static_cast<int>(b - j0) : 0;
      const int t1 = e < j0 + cnt ? static_cast<int>(e - j0) : cnt;
      if (a.softcap > 0.0f) {
        for (int t = t0; t < t1; ++t) {
          const float x = dots[t] * a.scale;
          out[j0 + t] = a.softcap * std::tanh(x / a.softcap);
        }
      } else {
        const auto m = static_cast<__mmask16>(((1u << t1) - 1) & ~((1u << t0) - 1));
        _mm512_mask_storeu_ps(out + j0, m, _mm512_mul_ps(_mm512_load_ps(dots), scale));
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

// out(h) = sum_j p_hj v_j for the heads [h0, h0 + hc), hc <= kHeads. The
// V heads of a chunk of keys of the union of their ranges are dequantized
// once into an L1 buffer (about 16 KB), then each group of GC heads adds
// its keys of it with its accumulators in registers (kept in memory
// between chunks). A head adds its own keys in key order, whatever the
// other heads' ranges are.
template <DType VT, int NB, int GC>
void pv_heads(const QuantTileArgs& a, const TileHeads& th, int h0, int hc) {
  constexpr int kChunk = NB <= 1 ? 128 : NB <= 2 ? 64 : NB <= 4 ? 32 : 16;  // keys a buffer
  alignas(64) __m512 vbuf[kChunk][2 * NB];
  alignas(64) __m512 acc[kHeads][2 * NB];
  int64_t b[kHeads], e[kHeads];
  const float* p[kHeads];
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  const size_t v_bytes = row_bytes(VT, 32 * NB);
  for (int g = 0; g < hc; ++g) {
    b[g] = th.begin(h0 + g);
    e[g] = th.end(h0 + g);
    p[g] = th.scores(h0 + g) - b[g];
    for (int i = 0; i < 2 * NB; ++i) acc[g][i] = _mm512_setzero_ps();
    if (e[g] > b[g]) {
      lo = b[g] < lo ? b[g] : lo;
      hi = e[g] > hi ? e[g] : hi;
    }
  }
  for (int64_t j0 = lo; j0 < hi; j0 += kChunk) {
    const int64_t j1 = hi - j0 < kChunk ? hi : j0 + kChunk;
    for (int64_t j = j0; j < j1; ++j) {
      if (j + 16 < hi) prefetch_head(a.kv.v_row(j + 16), v_bytes);
      dq_head<VT, NB>(a.kv.v_row(j), vbuf[j - j0]);
    }
    for (int g0 = 0; g0 < hc; g0 += GC) {
      const int n = hc - g0 < GC ? hc - g0 : GC;
      __m512 r[GC][2 * NB];
#pragma GCC unroll 4
      for (int g = 0; g < GC; ++g) {
        if (g >= n) break;
#pragma GCC unroll 16
        for (int i = 0; i < 2 * NB; ++i) r[g][i] = acc[g0 + g][i];
      }
      for (int64_t j = j0; j < j1; ++j) {
        const __m512* v = vbuf[j - j0];
#pragma GCC unroll 4
        for (int g = 0; g < GC; ++g) {
          if (g >= n) break;
          if (j < b[g0 + g] || j >= e[g0 + g]) continue;
          const __m512 pg = _mm512_set1_ps(p[g0 + g][j]);
#pragma GCC unroll 16
          for (int i = 0; i < 2 * NB; ++i) r[g][i] = _mm512_fmadd_ps(v[i], pg, r[g][i]);
        }
      }
#pragma GCC unroll 4
      for (int g = 0; g < GC; ++g) {
        if (g >= n) break;
#pragma GCC unroll 16
        for (int i = 0; i < 2 * NB; ++i) acc[g0 + g][i] = r[g][i];
      }
    }
  }
  for (int g = 0; g < hc; ++g) {
    for (int i = 0; i < 2 * NB; ++i) _mm512_storeu_ps(th.out(h0 + g) + 16 * i, acc[g][i]);
  }
}

template <DType KT, DType VT, int NB>
void attend(const QuantTileArgs& a) {
  // Heads per V pass: their accumulators (2 * NB zmm each) in at most 16 registers.
  constexpr int GC = NB >= 8 ? 1 : (8 / NB > 4 ? 4 : 8 / NB);
  const TileHeads th{a};
  const int n_h = a.n_q * a.n_heads;
  for (int h0 = 0; h0 < n_h; h0 += kHeads) {
    const int hc = n_h - h0 < kHeads ? n_h - h0 : kHeads;
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int h = h0; h < h0 + hc; ++h) {
      if (th.end(h) <= th.begin(h)) continue;
      lo = th.begin(h) < lo ? th.begin(h) : lo;
      hi = th.end(h) > hi ? th.end(h) : hi;
    }
    k_scores<KT, NB>(a, th, h0, hc, lo, hi);
  }
  for (int h = 0; h < n_h; ++h) {
    if (th.end(h) > th.begin(h)) softmax(th.scores(h), th.end(h) - th.begin(h));
  }
  for (int h0 = 0; h0 < n_h; h0 += kHeads) pv_heads<VT, NB, GC>(a, th, h0, n_h - h0 < kHeads ? n_h - h0 : kHeads);
  for (int h = 0; h < n_h; ++h) {  // no keys: zeros, as the baseline
    if (th.end(h) <= th.begin(h)) std::memset(th.out(h), 0, static_cast<size_t>(a.head_dim) * sizeof(float));
  }
}

template <DType KT, DType VT, int NB>
struct Attend {
  static void run(const QuantTileArgs& a) { attend<KT, VT, NB>(a); }
};

}  // namespace

QuantTileAttend attend_quant_avx512_for(DType k, DType v, int64_t head_dim) {
  return tile_for<Attend>(k, v, head_dim);
}

}  // namespace rill::cpu::detail
