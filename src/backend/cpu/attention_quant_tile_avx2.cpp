// The AVX2 form of attention_quant_avx512.cpp's tile kernel
// (attention_quant.h, QuantTileArgs) for CPUs without AVX-512 (AMD Zen 2/3,
// Intel client cores), where attend_quant_avx2 took one query at a time,
// dequantizing every K/V row once per query through a call per row.
// Here each K/V row is dequantized once for a tile of up to 16 query heads,
// as on AVX-512, with eight lanes:
// - Q K^T: a K row is dequantized into an L1 buffer (a 128-wide row is 16
//   registers, AVX2's whole file), then each head's dot runs as two fma
//   chains over its 8-lane vectors, added; 8 keys' vectors reduce at once
//   (hadd), each key's sum reading only its own vector.
// - softmax: max subtracted, exp_nonpositive (Cephes' polynomial), the sum
//   in double per 8 keys.
// - P V: 32 dims (one block) at a time, 64 keys' V blocks dequantized once
//   into L1 for up to 16 heads, two heads' accumulators in registers, each
//   head adding its own keys in key order.
// A (query, head)'s arithmetic depends only on its keys and the head_dim,
// never on what else the tile holds, so results stay batch invariant.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "backend/cpu/attention_f16_avx2_impl.h"  // exp_nonpositive, hsum8
#include "backend/cpu/attention_quant.h"
#include "backend/cpu/attention_quant_tile_dispatch.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/quants.h"
#include "core/e4m3.h"

namespace rill::cpu::detail {
namespace {

inline __m256 splat_f16(uint16_t h) {
  return _mm256_set1_ps(_cvtsh_ss(h));  // exact, as f16_to_f32
}
inline __m128i load8(const void* p) {
  return _mm_loadl_epi64(static_cast<const __m128i*>(p));
}

// The 4-bit codes of one block (16 bytes) as int32: n[0], n[1] elements
// 0..7, 8..15 (low nibbles), n[2], n[3] elements 16..23, 24..31 (high).
inline void nibbles(const uint8_t* qs, __m256i (&n)[4]) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(x, mask), hi = _mm_and_si128(_mm_srli_epi16(x, 4), mask);
  n[0] = _mm256_cvtepu8_epi32(lo);
  n[1] = _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8));
  n[2] = _mm256_cvtepu8_epi32(hi);
  n[3] = _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8));
}
// Adds 16 to the elements whose bit is set in the block's qh (bit j: element j).
inline void high_bits(const uint8_t* qh, __m256i (&n)[4]) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128), sixteen = _mm256_set1_epi32(16);
  for (int i = 0; i < 4; ++i) {
    const __m256i b = _mm256_and_si256(_mm256_set1_epi32(static_cast<int>((h >> (8 * i)) & 0xFF)), bit);
    n[i] = _mm256_add_epi32(n[i], _mm256_and_si256(_mm256_cmpeq_epi32(b, bit), sixteen));
  }
}

// 8 e4m3 bytes as f32: attention_quant_avx512.cpp's fp8x16 in eight lanes
// (normal codes by moving the bits and the bias, m * 2^-9 for subnormal
// ones, NaN for 0x7f, the sign copied).
inline __m256 fp8x8(const uint8_t* p) {
  const __m256i u = _mm256_cvtepu8_epi32(load8(p));
  const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7F));
  __m256 v = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23)));
  const __m256 sub =
      _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(mag, _mm256_set1_epi32(7))), _mm256_set1_ps(1.0f / 512.0f));
  v = _mm256_blendv_ps(v, sub, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag)));
  v = _mm256_blendv_ps(v, _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()),
                       _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F))));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x80)), 24);
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign));
}

// Block b (32 elements) of a head of type T at p into x[0..3] (elements
// 8i .. 8i + 7 in x[i]); the values of attention_quant_impl.h's dequantizers.
template <DType T>
inline void dq32(const uint8_t* p, int b, __m256 (&x)[4]) {
  if constexpr (T == DType::kF32) {
    const auto* f = reinterpret_cast<const float*>(p) + 32 * b;
    for (int i = 0; i < 4; ++i) x[i] = _mm256_loadu_ps(f + 8 * i);
  } else if constexpr (T == DType::kF16) {
    const auto* h = reinterpret_cast<const __m128i*>(p + 64 * b);
    for (int i = 0; i < 4; ++i) x[i] = _mm256_cvtph_ps(_mm_loadu_si128(h + i));
  } else if constexpr (T == DType::kBF16) {
    const auto* h = reinterpret_cast<const __m128i*>(p + 64 * b);
    for (int i = 0; i < 4; ++i) {
      x[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h + i)), 16));
    }
  } else if constexpr (T == DType::kQ8_0) {
    const auto* blk = reinterpret_cast<const BlockQ8_0*>(p) + b;
    const __m256 d = splat_f16(blk->d);
    for (int i = 0; i < 4; ++i)
      x[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8(blk->qs + 8 * i))), d);
  } else if constexpr (T == kKvQ8_0x64) {
    // q8_0h64: 32-element block b is half b % 2 of the 64-value block b / 2.
    const uint8_t* blk = p + kQ8_0x64Bytes * (b / 2);
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    const __m256 d = splat_f16(dh);
    const uint8_t* q = blk + 2 + 32 * (b % 2);
    for (int i = 0; i < 4; ++i) x[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8(q + 8 * i))), d);
  } else if constexpr (T == DType::kQ4_0) {
    const auto* blk = reinterpret_cast<const BlockQ4_0*>(p) + b;
    const __m256 d = splat_f16(blk->d);
    __m256i n[4];
    nibbles(blk->qs, n);
    for (int i = 0; i < 4; ++i)
      x[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(n[i], _mm256_set1_epi32(8))), d);
  } else if constexpr (T == DType::kIQ4_NL) {
    const auto* blk = reinterpret_cast<const BlockIQ4_NL*>(p) + b;
    const __m256 d = splat_f16(blk->d);
    // The levels of 16 codes at once: a byte shuffle of the int8 table.
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs)), mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(qs, mask));
    const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(qs, 4), mask));
    x[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d);
    x[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d);
    x[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d);
    x[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d);
  } else if constexpr (T == DType::kQ4_1) {
    const auto* blk = reinterpret_cast<const BlockQ4_1*>(p) + b;
    const __m256 d = splat_f16(blk->d), m = splat_f16(blk->m);
    __m256i n[4];
    nibbles(blk->qs, n);
    for (int i = 0; i < 4; ++i) x[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(n[i]), d, m);
  } else if constexpr (T == DType::kQ5_0) {
    const auto* blk = reinterpret_cast<const BlockQ5_0*>(p) + b;
    const __m256 d = splat_f16(blk->d);
    __m256i n[4];
    nibbles(blk->qs, n);
    high_bits(blk->qh, n);
    for (int i = 0; i < 4; ++i) {
      x[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(n[i], _mm256_set1_epi32(16))), d);
    }
  } else if constexpr (T == DType::kQ5_1) {
    const auto* blk = reinterpret_cast<const BlockQ5_1*>(p) + b;
    const __m256 d = splat_f16(blk->d), m = splat_f16(blk->m);
    __m256i n[4];
    nibbles(blk->qs, n);
    high_bits(blk->qh, n);
    for (int i = 0; i < 4; ++i) x[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(n[i]), d, m);
  } else {
    static_assert(T == kF8E4M3);
    for (int i = 0; i < 4; ++i) x[i] = fp8x8(p + 32 * b + 8 * i);
  }
}

// The cache lines of a head of `bytes` bytes at p.
inline void prefetch_head(const uint8_t* p, size_t bytes) {
  const auto first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  for (uintptr_t l = first; l < reinterpret_cast<uintptr_t>(p) + bytes; l += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(l), _MM_HINT_T0);
  }
}

// The 8 keys' lane sums of c[0..7] in key order; key t's sum reads c[t] only.
inline __m256 reduce8x8(const __m256 (&c)[8]) {
  const __m256 h01 = _mm256_hadd_ps(c[0], c[1]), h23 = _mm256_hadd_ps(c[2], c[3]);
  const __m256 h45 = _mm256_hadd_ps(c[4], c[5]), h67 = _mm256_hadd_ps(c[6], c[7]);
  const __m256 g0 = _mm256_hadd_ps(h01, h23), g1 = _mm256_hadd_ps(h45, h67);
  // g0: keys 0..3's low-half sums, then their high-half sums; g1: keys 4..7.
  return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

// Lanes [t0, t1) of 8 as a maskstore mask.
inline __m256i lane_mask(int t0, int t1) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_and_si256(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(t0 - 1)),
                          _mm256_cmpgt_epi32(_mm256_set1_epi32(t1), idx));
}

// scores(h)[j - begin(h)] = scale * q_h.k_j (softcapped) for the heads
// [h0, h0 + hc), hc <= kHeads, 8 keys at a time over the union of their
// ranges (the AVX-512 kernel's k_scores with eight lanes): a head whose
// range meets a block scores all of its keys and stores those in range.
constexpr int kHeads = 16;
template <DType KT, int NB>
void k_scores(const QuantTileArgs& a, const TileHeads& th, int h0, int hc, int64_t lo, int64_t hi) {
  constexpr int hd = 32 * NB;
  alignas(32) __m256 c[kHeads][8];
  alignas(32) float krow[hd];
  alignas(32) float dots[8];
  int64_t hb[kHeads], he[kHeads];
  const size_t k_bytes = row_bytes(KT, hd);
  for (int h = 0; h < hc; ++h) {
    hb[h] = th.begin(h0 + h);
    he[h] = th.end(h0 + h);
  }
  const __m256 scale = _mm256_set1_ps(a.scale);
  for (int64_t j0 = lo; j0 < hi; j0 += 8) {
    const int cnt = hi - j0 < 8 ? static_cast<int>(hi - j0) : 8;
    int live[kHeads], n_live = 0;
    for (int h = 0; h < hc; ++h) {
      if (he[h] > j0 && hb[h] < j0 + cnt) live[n_live++] = h;
    }
    if (n_live == 0) continue;
    for (int64_t j = j0 + 16; j < j0 + 24 && j < hi; ++j) prefetch_head(a.kv.k_row(j), k_bytes);
    for (int t = 0; t < 8; ++t) {
      if (t >= cnt) {
        for (int i = 0; i < n_live; ++i) c[live[i]][t] = _mm256_setzero_ps();
        continue;
      }
      const uint8_t* row = a.kv.k_row(j0 + t);
      for (int b = 0; b < NB; ++b) {
        __m256 x[4];
        dq32<KT>(row, b, x);
        for (int i = 0; i < 4; ++i) _mm256_store_ps(krow + 32 * b + 8 * i, x[i]);
      }
      for (int i = 0; i < n_live; ++i) {
        const int h = live[i];
        const float* q = a.q + (h0 + h) * hd;
        __m256 s0 = _mm256_mul_ps(_mm256_load_ps(krow), _mm256_loadu_ps(q));
        __m256 s1 = _mm256_mul_ps(_mm256_load_ps(krow + 8), _mm256_loadu_ps(q + 8));
#pragma GCC unroll 16
        for (int e = 16; e < hd; e += 16) {
          s0 = _mm256_fmadd_ps(_mm256_load_ps(krow + e), _mm256_loadu_ps(q + e), s0);
          s1 = _mm256_fmadd_ps(_mm256_load_ps(krow + e + 8), _mm256_loadu_ps(q + e + 8), s1);
        }
        c[h][t] = _mm256_add_ps(s0, s1);
      }
    }
    for (int i = 0; i < n_live; ++i) {
      const int h = live[i];
      const int64_t b = hb[h], e = he[h];
      _mm256_store_ps(dots, reduce8x8(c[h]));
      float* out = th.scores(h0 + h) - b;
      const int t0 = b > j0 ? static_cast<int>(b - j0) : 0;
      const int t1 = e < j0 + cnt ? static_cast<int>(e - j0) : cnt;
      if (a.softcap > 0.0f) {
        for (int t = t0; t < t1; ++t) {
          const float x = dots[t] * a.scale;
          out[j0 + t] = a.softcap * std::tanh(x / a.softcap);
        }
      } else {
        _mm256_maskstore_ps(out + j0, lane_mask(t0, t1), _mm256_mul_ps(_mm256_load_ps(dots), scale));
      }
    }
  }
}

// s[0, n) = softmax(s): max subtracted, exp, the sum in double per 8 keys.
inline void softmax(float* s, int64_t n) {
  const int64_t n8 = n / 8 * 8;
  const __m256i tail = lane_mask(0, static_cast<int>(n - n8));
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 vmax = ninf;
  for (int64_t j = 0; j < n8; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + j));
  if (n8 < n)
    vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + n8, tail), _mm256_castsi256_ps(tail)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float mx = lanes[0];
  for (int i = 1; i < 8; ++i) mx = mx < lanes[i] ? lanes[i] : mx;
  const __m256 m = _mm256_set1_ps(mx);
  double sum = 0.0;
  for (int64_t j = 0; j < n8; j += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
    _mm256_storeu_ps(s + j, e);
    sum += static_cast<double>(hsum8(e));
  }
  if (n8 < n) {
    const __m256 x = _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + n8, tail), _mm256_castsi256_ps(tail));
    const __m256 e = exp_nonpositive(_mm256_sub_ps(x, m));  // exp(-inf) = 0 in the padding
    _mm256_maskstore_ps(s + n8, tail, e);
    sum += static_cast<double>(hsum8(e));
  }
  const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
  for (int64_t j = 0; j < n8; j += 8) _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), inv));
  if (n8 < n) _mm256_maskstore_ps(s + n8, tail, _mm256_mul_ps(_mm256_maskload_ps(s + n8, tail), inv));
}

// out(h) = sum_j p_hj v_j for the heads [h0, h0 + hc), hc <= kHeads, one
// 32-dim block at a time: the block of kPvKeys V rows of the union of their
// ranges is dequantized once into an L1 buffer, then each pair of heads
// adds its keys of it with its accumulators in registers (kept in memory
// between chunks). Each head adds its own keys in key order, whatever the
// others' ranges are.
constexpr int kPvKeys = 64;
template <DType VT, int NB>
void pv_heads(const QuantTileArgs& a, const TileHeads& th, int h0, int hc) {
  alignas(32) float vbuf[kPvKeys][32];
  alignas(32) __m256 acc[kHeads][4];
  int64_t b[kHeads], e[kHeads];
  const float* p[kHeads];
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  const size_t v_bytes = row_bytes(VT, 32 * NB);
  for (int g = 0; g < hc; ++g) {
    b[g] = th.begin(h0 + g);
    e[g] = th.end(h0 + g);
    p[g] = th.scores(h0 + g) - b[g];
    if (e[g] > b[g]) {
      lo = b[g] < lo ? b[g] : lo;
      hi = e[g] > hi ? e[g] : hi;
    }
  }
  for (int blk = 0; blk < NB; ++blk) {
    for (int g = 0; g < hc; ++g) {
      for (int i = 0; i < 4; ++i) acc[g][i] = _mm256_setzero_ps();
    }
    for (int64_t j0 = lo; j0 < hi; j0 += kPvKeys) {
      const int64_t j1 = hi - j0 < kPvKeys ? hi : j0 + kPvKeys;
      for (int64_t j = j0; j < j1; ++j) {
        if (blk == 0 && j + 16 < hi) prefetch_head(a.kv.v_row(j + 16), v_bytes);
        __m256 v[4];
        dq32<VT>(a.kv.v_row(j), blk, v);
        for (int i = 0; i < 4; ++i) _mm256_store_ps(vbuf[j - j0] + 8 * i, v[i]);
      }
      for (int g0 = 0; g0 < hc; g0 += 2) {
        const int n = hc - g0 < 2 ? 1 : 2;
        __m256 r[2][4];
        for (int g = 0; g < n; ++g) {
          for (int i = 0; i < 4; ++i) r[g][i] = acc[g0 + g][i];
        }
        for (int64_t j = j0; j < j1; ++j) {
          const float* vr = vbuf[j - j0];
          for (int g = 0; g < n; ++g) {
            if (j < b[g0 + g] || j >= e[g0 + g]) continue;
            const __m256 pg = _mm256_set1_ps(p[g0 + g][j]);
            for (int i = 0; i < 4; ++i) r[g][i] = _mm256_fmadd_ps(_mm256_load_ps(vr + 8 * i), pg, r[g][i]);
          }
        }
        for (int g = 0; g < n; ++g) {
          for (int i = 0; i < 4; ++i) acc[g0 + g][i] = r[g][i];
        }
      }
    }
    for (int g = 0; g < hc; ++g) {
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(th.out(h0 + g) + 32 * blk + 8 * i, acc[g][i]);
    }
  }
}

template <DType KT, DType VT, int NB>
void attend(const QuantTileArgs& a) {
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
  for (int h0 = 0; h0 < n_h; h0 += kHeads) pv_heads<VT, NB>(a, th, h0, n_h - h0 < kHeads ? n_h - h0 : kHeads);
  for (int h = 0; h < n_h; ++h) {  // no keys: zeros, as the baseline
    if (th.end(h) <= th.begin(h)) std::memset(th.out(h), 0, static_cast<size_t>(a.head_dim) * sizeof(float));
  }
}

template <DType KT, DType VT, int NB>
struct Attend {
  static void run(const QuantTileArgs& a) { attend<KT, VT, NB>(a); }
};

}  // namespace

QuantTileAttend attend_quant_tile_avx2_for(DType k, DType v, int64_t head_dim) {
  return tile_for<Attend>(k, v, head_dim);
}

}  // namespace rill::cpu::detail
