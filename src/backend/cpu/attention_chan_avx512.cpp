// attention_chan_impl.h compiled for AVX-512, its group sums in
// intrinsics: a channel's 32 codes widened to two zmm of floats once for
// every query head of the group, one FMA each (the same sums in the same
// channel order as the baseline build, within FMA rounding); the softmax
// in 16 lanes with ggml's vector exp.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "backend/cpu/attention_chan.h"
#include "backend/cpu/exp_ggml_avx512.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/quants.h"
#include "core/e4m3.h"

#define RILL_CHAN_ISA avx512
#define RILL_CHAN_GROUP_SUMS
#define RILL_CHAN_GROUP_SUMS_PLANES
#define RILL_CHAN_ACCUMULATE_V
#define RILL_CHAN_ACCUMULATE_V_RUN
#define RILL_CHAN_ACCUMULATE_V_TILE
#define RILL_CHAN_GROUP_SCALES
#define RILL_CHAN_GROUP_SCALES_TILE
#define RILL_CHAN_SOFTMAX

namespace rill::cpu::detail::avx512 {

// NG rows' sums over one chunk, the accumulators in registers (NG a
// constant, so the compiler keeps the arrays in zmm).
template <int NG>
inline void group_sums_rows(const uint8_t* qs, const float* qd, int64_t hd, float* acc) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  __m512 lo[NG], hi[NG];
  for (int g = 0; g < NG; ++g) lo[g] = hi[g] = _mm512_setzero_ps();
  for (int64_t c = 0; c < hd; ++c) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + c * 16));
    const __m512 flo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, mask)));
    const __m512 fhi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), mask)));
    for (int g = 0; g < NG; ++g) {
      const __m512 w = _mm512_set1_ps(qd[g * hd + c]);
      lo[g] = _mm512_fmadd_ps(w, flo, lo[g]);
      hi[g] = _mm512_fmadd_ps(w, fhi, hi[g]);
    }
  }
  for (int g = 0; g < NG; ++g) {
    _mm512_storeu_ps(acc + g * 32, lo[g]);
    _mm512_storeu_ps(acc + g * 32 + 16, hi[g]);
  }
}

// acc[g][j] for n_heads rows (a query's heads, or a tile's (query, head)
// rows): each row's FMAs in channel order, whatever chunk of 8 it is in.
inline void group_sums(const uint8_t* qs, const float* qd, int64_t hd, int n_heads, float* acc) {
  constexpr int kMaxHeads = 12;  // accumulators in registers: 2 per row (24 of the 32 zmm)
  for (int g0 = 0; g0 < n_heads; g0 += kMaxHeads) {
    const float* q = qd + g0 * hd;
    float* out = acc + g0 * 32;
    switch (n_heads - g0 < kMaxHeads ? n_heads - g0 : kMaxHeads) {
      case 1:
        group_sums_rows<1>(qs, q, hd, out);
        break;
      case 2:
        group_sums_rows<2>(qs, q, hd, out);
        break;
      case 3:
        group_sums_rows<3>(qs, q, hd, out);
        break;
      case 4:
        group_sums_rows<4>(qs, q, hd, out);
        break;
      case 5:
        group_sums_rows<5>(qs, q, hd, out);
        break;
      case 6:
        group_sums_rows<6>(qs, q, hd, out);
        break;
      case 7:
        group_sums_rows<7>(qs, q, hd, out);
        break;
      case 8:
        group_sums_rows<8>(qs, q, hd, out);
        break;
      case 9:
        group_sums_rows<9>(qs, q, hd, out);
        break;
      case 10:
        group_sums_rows<10>(qs, q, hd, out);
        break;
      case 11:
        group_sums_rows<11>(qs, q, hd, out);
        break;
      default:
        group_sums_rows<12>(qs, q, hd, out);
        break;
    }
  }
}

// q4a: NG rows' sums over one chunk, as group_sums_rows with each
// channel's 32 codes assembled from its planes (one masked byte add of 2^k
// per plane k: the stage-1 "widened" form, backend/cpu/kv_alloc.h
// alloc_block_scores_widen_avx512), widened to two zmm of floats once for
// the chunk's rows; channels of 0 bits skipped.
template <int NG>
inline void group_sums_planes_rows(const uint8_t* planes, const uint8_t* widths, const float* qd, int64_t hd,
                                   float* acc) {
  __m512 lo[NG], hi[NG];
  for (int g = 0; g < NG; ++g) lo[g] = hi[g] = _mm512_setzero_ps();
  const uint8_t* p = planes;
  for (int64_t c = 0; c < hd; ++c) {
    const int b = widths[c];
    if (b == 0) continue;
    __m256i codes = _mm256_setzero_si256();
    for (int k = 0; k < b; ++k, p += 4) {
      uint32_t plane;
      __builtin_memcpy(&plane, p, 4);  // little-endian, as stored
      codes = _mm256_mask_add_epi8(codes, static_cast<__mmask32>(plane), codes,
                                   _mm256_set1_epi8(static_cast<char>(1 << k)));
    }
    const __m512 flo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(codes)));
    const __m512 fhi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(codes, 1)));
    for (int g = 0; g < NG; ++g) {
      const __m512 w = _mm512_set1_ps(qd[g * hd + c]);
      lo[g] = _mm512_fmadd_ps(w, flo, lo[g]);
      hi[g] = _mm512_fmadd_ps(w, fhi, hi[g]);
    }
  }
  for (int g = 0; g < NG; ++g) {
    _mm512_storeu_ps(acc + g * 32, lo[g]);
    _mm512_storeu_ps(acc + g * 32 + 16, hi[g]);
  }
}

inline void group_sums_planes(const uint8_t* planes, const uint8_t* widths, const float* qd, int64_t hd, int n_rows,
                              float* acc) {
  constexpr int kMaxRows = 12;  // as group_sums
  for (int g0 = 0; g0 < n_rows; g0 += kMaxRows) {
    const float* q = qd + g0 * hd;
    float* out = acc + g0 * 32;
    switch (n_rows - g0 < kMaxRows ? n_rows - g0 : kMaxRows) {
      case 1:
        group_sums_planes_rows<1>(planes, widths, q, hd, out);
        break;
      case 2:
        group_sums_planes_rows<2>(planes, widths, q, hd, out);
        break;
      case 3:
        group_sums_planes_rows<3>(planes, widths, q, hd, out);
        break;
      case 4:
        group_sums_planes_rows<4>(planes, widths, q, hd, out);
        break;
      case 5:
        group_sums_planes_rows<5>(planes, widths, q, hd, out);
        break;
      case 6:
        group_sums_planes_rows<6>(planes, widths, q, hd, out);
        break;
      case 7:
        group_sums_planes_rows<7>(planes, widths, q, hd, out);
        break;
      case 8:
        group_sums_planes_rows<8>(planes, widths, q, hd, out);
        break;
      case 9:
        group_sums_planes_rows<9>(planes, widths, q, hd, out);
        break;
      case 10:
        group_sums_planes_rows<10>(planes, widths, q, hd, out);
        break;
      case 11:
        group_sums_planes_rows<11>(planes, widths, q, hd, out);
        break;
      default:
        group_sums_planes_rows<12>(planes, widths, q, hd, out);
        break;
    }
  }
}

// qz and qd as the baseline's group_scales, 16 channels at a time (F16C
// zeros, the e4m3 steps gathered from their table); q.z summed in 16 lanes
// then reduced, not in channel order.
inline void group_scales(const float* q, const uint16_t* z, const uint8_t* d, int64_t hd, int n_heads, float* qd,
                         float* qz) {
  const float* table = e4m3_values();
  const __m512 sixteenth = _mm512_set1_ps(1.0f / 16.0f);
  for (int g = 0; g < n_heads; ++g) {
    const float* qg = q + g * hd;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < hd; c += 16) {
      const __m512 zf = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(z + c)));
      const __m512i di = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + c)));
      const __m512 df = _mm512_mul_ps(_mm512_i32gather_ps(di, table, 4), sixteenth);
      const __m512 qc = _mm512_loadu_ps(qg + c);
      acc = _mm512_fmadd_ps(qc, zf, acc);
      _mm512_storeu_ps(qd + g * hd + c, _mm512_mul_ps(qc, df));
    }
    qz[g] = _mm512_reduce_add_ps(acc);
  }
}

// group_scales for a tile's queries (contract in attention_chan_impl.h):
// the group's zeros and steps converted once for every (query, head) row
// instead of once per row, each row's operations as group_scales's.
inline void group_scales_tile(const float* q, int64_t q_stride, int nq, const uint16_t* z, const uint8_t* d, int64_t hd,
                              int n_heads, float* qd, float* qz) {
  constexpr int64_t kMaxHd = 256;
  if (hd > kMaxHd) {
    for (int t = 0; t < nq; ++t) {
      group_scales(q + t * q_stride, z, d, hd, n_heads, qd + t * n_heads * hd, qz + t * n_heads);
    }
    return;
  }
  const float* table = e4m3_values();
  const __m512 sixteenth = _mm512_set1_ps(1.0f / 16.0f);
  __m512 zf[kMaxHd / 16], df[kMaxHd / 16];
  for (int64_t c = 0; c < hd; c += 16) {
    zf[c / 16] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(z + c)));
    const __m512i di = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + c)));
    df[c / 16] = _mm512_mul_ps(_mm512_i32gather_ps(di, table, 4), sixteenth);
  }
  for (int t = 0; t < nq; ++t) {
    for (int g = 0; g < n_heads; ++g) {
      const float* qg = q + t * q_stride + g * hd;
      float* qdg = qd + (t * n_heads + g) * hd;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t c = 0; c < hd; c += 16) {
        const __m512 qc = _mm512_loadu_ps(qg + c);
        acc = _mm512_fmadd_ps(qc, zf[c / 16], acc);
        _mm512_storeu_ps(qdg + c, _mm512_mul_ps(qc, df[c / 16]));
      }
      qz[t * n_heads + g] = _mm512_reduce_add_ps(acc);
    }
  }
}

// s[0, n) to probabilities, 16 keys a vector from s[0] (the last one
// masked): the max, exp_ggml512(s - max) in f32, the sum in two 8-lane
// double accumulators (the vector's low and high halves, keys in order
// within each lane) added and reduced in a fixed order, one f32
// reciprocal. The same n values in give the same bits out, wherever s
// sits: a query alone and in a tile agree.
inline void softmax_in_place(float* s, int64_t n) {
  auto mask = [n](int64_t j) { return static_cast<__mmask16>(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1); };
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += 16) {
    vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), mask(j), s + j));
  }
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = mask(j);
    const __m512 e = _mm512_maskz_mov_ps(m, exp_ggml512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), mx)));
    _mm512_mask_storeu_ps(s + j, m, e);
    lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  const __m512 inv = _mm512_set1_ps(static_cast<float>(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(lo, hi))));
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = mask(j);
    _mm512_mask_storeu_ps(s + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), inv));
  }
}

// out[g] += p[g] * row (g < n_rows, out rows head_dim apart), one FMA per
// 16 elements and row.
inline void accumulate_row(const ChanAttendArgs& a, const float* row, const float* p, float* out, int n_rows) {
  const int64_t hd = a.head_dim;
  for (int g = 0; g < n_rows; ++g) {
    float* o = out + g * hd;
    const __m512 pg = _mm512_set1_ps(p[g]);
    for (int64_t c = 0; c < hd; c += 16) {
      _mm512_storeu_ps(o + c, _mm512_fmadd_ps(pg, _mm512_loadu_ps(row + c), _mm512_loadu_ps(o + c)));
    }
  }
}

// out[g] += p[g] * v: iq4_nlh64 rows decoded in registers (the 16 levels
// in one zmm, vpermps by the nibbles, times the block's scale: the same
// f32 values as dq_iq4_nl64), other types through the dequantizer; one
// FMA per 16 elements and row.
inline void accumulate_v(const ChanAttendArgs& a, const uint8_t* v, const float* p, float* row, float* out,
                         int n_rows) {
  const int64_t hd = a.head_dim;
  if (a.v_type == kKvIq4Nl64) {
    alignas(64) static const float kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                  1,    13,   25,  38,  53,  69,  89,  113};
    const __m512 levels = _mm512_load_ps(kLevels);
    const __m128i mask = _mm_set1_epi8(0x0F);
    for (int64_t b = 0; b < hd / 64; ++b, v += 33) {
      const __m512 d = _mm512_set1_ps(e4m3_value_fast(v[0]) * (1.0f / 16.0f));
      const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 1));
      const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 17));
      const __m512 x[4] = {
          _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b0, mask)), levels), d),
          _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b1, mask)), levels), d),
          _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b0, 4), mask)), levels),
                        d),
          _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b1, 4), mask)), levels),
                        d)};
      for (int g = 0; g < n_rows; ++g) {
        float* o = out + g * hd + b * 64;
        const __m512 pg = _mm512_set1_ps(p[g]);
        for (int k = 0; k < 4; ++k)
          _mm512_storeu_ps(o + 16 * k, _mm512_fmadd_ps(pg, x[k], _mm512_loadu_ps(o + 16 * k)));
      }
    }
    return;
  }
  a.v_dequant(v, row, hd);
  accumulate_row(a, row, p, out, n_rows);
}

// accumulate_v over a query's pool keys [j0, j1) at once for G query
// heads of head_dim 64 in iq4_nlh64: the G x 64 sums stay in registers
// across the keys instead of a load and a store per key and 16 elements
// (a decode step's V pass spent most of its time there). Each element gets
// accumulate_v's FMAs with the same operands in the same key order, so the
// same bits; the tile path keeps accumulate_v.
template <int G>
inline void accumulate_v_run64(const ChanAttendArgs& a, const float* scores, int64_t n, int64_t j0, int64_t j1) {
  alignas(64) static const float kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                1,    13,   25,  38,  53,  69,  89,  113};
  const __m512 levels = _mm512_load_ps(kLevels);
  const __m128i mask = _mm_set1_epi8(0x0F);
  __m512 acc[G][4];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) acc[g][k] = _mm512_loadu_ps(a.out + g * 64 + 16 * k);
  }
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* v = a.kv.v_row(j);
    const __m512 d = _mm512_set1_ps(e4m3_value_fast(v[0]) * (1.0f / 16.0f));
    const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 1));
    const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 17));
    const __m512 x[4] = {
        _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b0, mask)), levels), d),
        _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b1, mask)), levels), d),
        _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b0, 4), mask)), levels),
                      d),
        _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b1, 4), mask)), levels),
                      d)};
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512 pg = _mm512_set1_ps(scores[g * n + (j - a.j_begin)]);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) acc[g][k] = _mm512_fmadd_ps(pg, x[k], acc[g][k]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) _mm512_storeu_ps(a.out + g * 64 + 16 * k, acc[g][k]);
  }
}

// attend's V pass over the pool's keys [j0, j1) (probabilities scores[g *
// n + j - j_begin]) in one call where it has a register form (iq4_nlh64,
// head_dim 64, up to 4 query heads); false: the caller goes key by key.
inline bool accumulate_v_run(const ChanAttendArgs& a, const float* scores, int64_t n, int64_t j0, int64_t j1) {
  if (a.v_type != kKvIq4Nl64 || a.head_dim != 64) return false;
  switch (a.n_heads) {
    case 1:
      accumulate_v_run64<1>(a, scores, n, j0, j1);
      return true;
    case 2:
      accumulate_v_run64<2>(a, scores, n, j0, j1);
      return true;
    case 3:
      accumulate_v_run64<3>(a, scores, n, j0, j1);
      return true;
    case 4:
      accumulate_v_run64<4>(a, scores, n, j0, j1);
      return true;
    default:
      return false;
  }
}

// One iq4_nlh64 V head (64 values) in f32, as accumulate_v decodes it.
inline void decode_iq4_nl64(const uint8_t* v, float* out) {
  alignas(64) static const float kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                1,    13,   25,  38,  53,  69,  89,  113};
  const __m512 levels = _mm512_load_ps(kLevels);
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m512 d = _mm512_set1_ps(e4m3_value_fast(v[0]) * (1.0f / 16.0f));
  const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 1));
  const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 17));
  _mm512_store_ps(out, _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b0, mask)), levels), d));
  _mm512_store_ps(out + 16,
                  _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b1, mask)), levels), d));
  _mm512_store_ps(out + 32, _mm512_mul_ps(_mm512_permutexvar_ps(
                                              _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b0, 4), mask)), levels),
                                          d));
  _mm512_store_ps(out + 48, _mm512_mul_ps(_mm512_permutexvar_ps(
                                              _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b1, 4), mask)), levels),
                                          d));
}

// N rows of accumulate_v_tile over keys [k0, k1) whose V heads sit in f32
// at vf[j - k0]: each row's 64 sums in registers, one masked fma per
// vector and key (rows skip the keys outside their range without touching
// their sums: the same fmas as accumulate_v, in key order).
template <int N>
inline void v_tile_rows(const float (*vf)[64], int64_t k0, int64_t k1, const int64_t* lo, const int64_t* hi,
                        const float* const* p, float* const* out) {
  __m512 acc[N][4];
#pragma GCC unroll 4
  for (int r = 0; r < N; ++r) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_loadu_ps(out[r] + 16 * k);
  }
  for (int64_t j = k0; j < k1; ++j) {
    __m512 x[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) x[k] = _mm512_load_ps(vf[j - k0] + 16 * k);
#pragma GCC unroll 4
    for (int r = 0; r < N; ++r) {
      const bool in = lo[r] <= j && j < hi[r];
      const __mmask16 m = in ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>(0);
      const __m512 pg = _mm512_set1_ps(p[r][in ? j : lo[r]]);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_mask3_fmadd_ps(pg, x[k], acc[r][k], m);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < N; ++r) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) _mm512_storeu_ps(out[r] + 16 * k, acc[r][k]);
  }
}

// attend_tile's pool V pass (contract in attention_chan_impl.h) for
// iq4_nlh64 at head_dim 64: per block of 32 keys the V heads are decoded
// to f32 once, then every 4 rows take the block with their sums in
// registers, where accumulate_v loaded and stored each row's sums for
// every key.
inline bool accumulate_v_tile(const ChanAttendArgs& a, const int64_t* jb, const int64_t* pe, int nq, const float* sc,
                              int64_t sc_stride, float* out) {
  if (a.v_type != kKvIq4Nl64 || a.head_dim != 64) return false;
  const int H = a.n_heads, R = nq * H;
  int64_t lo = jb[0], hi = pe[0];
  for (int t = 1; t < nq; ++t) {
    lo = jb[t] < lo ? jb[t] : lo;
    hi = pe[t] > hi ? pe[t] : hi;
  }
  // Row r's range, its probabilities indexed by key (sc's row shifted by
  // jb; only keys in range are read) and its output.
  int64_t rlo[kChanTile * 64], rhi[kChanTile * 64];
  const float* rp[kChanTile * 64];
  float* ro[kChanTile * 64];
  for (int r = 0; r < R; ++r) {
    const int t = r / H;
    rlo[r] = jb[t];
    rhi[r] = pe[t];
    rp[r] = sc + r * sc_stride - jb[t];
    ro[r] = out + r * 64;
  }
  constexpr int64_t kT = kKvChanTokens;  // a pool block's keys
  alignas(64) float vf[kT][64];
  for (int64_t k0 = lo; k0 < hi;) {
    const int64_t k1 = (k0 - k0 % kT + kT) < hi ? k0 - k0 % kT + kT : hi;
    for (int64_t j = k0; j < k1; ++j) decode_iq4_nl64(a.kv.v_row(j), vf[j - k0]);
    int r = 0;
    for (; r + 4 <= R; r += 4) v_tile_rows<4>(vf, k0, k1, rlo + r, rhi + r, rp + r, ro + r);
    switch (R - r) {
      case 3:
        v_tile_rows<3>(vf, k0, k1, rlo + r, rhi + r, rp + r, ro + r);
        break;
      case 2:
        v_tile_rows<2>(vf, k0, k1, rlo + r, rhi + r, rp + r, ro + r);
        break;
      case 1:
        v_tile_rows<1>(vf, k0, k1, rlo + r, rhi + r, rp + r, ro + r);
        break;
      default:
        break;
    }
    k0 = k1;
  }
  return true;
}

}  // namespace rill::cpu::detail::avx512

#include "backend/cpu/attention_chan_impl.h"

namespace rill::cpu::detail {

void attend_chan_avx512(const ChanAttendArgs& a) {
  avx512::attend(a);
}

void attend_chan_tile_avx512(const ChanTileArgs& a) {
  avx512::attend_tile(a);
}

}  // namespace rill::cpu::detail
