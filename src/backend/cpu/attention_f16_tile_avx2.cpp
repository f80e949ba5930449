// The batched (prefill) form of attend_f16_rounded_avx2 for a tile of
// (query, head) rows that share one KV head (attention_f16.h F16TileArgs;
// the AVX2 machines' prefill, and AVX-512's at head_dims its exact kernel
// does not take). Every row's arithmetic is the per-row kernel's: a score
// is the fma chain over the head's 8-element pieces in order, its lane sum
// (hsum8), then scale and softcap; the same softmax_to_f16_avx2; each 32-dim
// chunk of the output the fma chain over the row's keys in order. Only the
// loop nest changes: a K row is converted once for every row of the tile
// (its scores 4 rows at a time, the q pieces read from an f32 copy), and a
// V row's 32-dim chunk once for up to 3 rows whose accumulators stay in
// registers, so at long context K and V come from memory once a tile
// instead of once a (query, head).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cpu/attention_f16.h"
#include "backend/cpu/attention_f16_avx2_impl.h"
#include "backend/cpu/paged_kv.h"

namespace rill::cpu::detail {
namespace {

constexpr int kMaxHd = 256;
constexpr int kScoreRows = 4;  // rows scored together against one K row
constexpr int kValueRows = 3;  // rows whose 32-dim accumulators (4 registers each) share a V chunk

struct Rows {
  int64_t jb[kMaxTileRows], je[kMaxTileRows];
};

// Rows [r0, r0 + NR) scored against key j, whose f32 elements are kf.
template <int NR>
void score_rows(const F16TileArgs& a, const Rows& rows, const float* qf, const float* kf, int64_t j, int r0) {
  const int64_t hd = a.head_dim;
  __m256 acc[NR];
#pragma GCC unroll 4
  for (int i = 0; i < NR; ++i) acc[i] = _mm256_setzero_ps();
  const float* q0 = qf + r0 * hd;
  for (int64_t d = 0; d < hd; d += 8) {
    const __m256 k = _mm256_load_ps(kf + d);
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) acc[i] = _mm256_fmadd_ps(_mm256_load_ps(q0 + i * hd + d), k, acc[i]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < NR; ++i) {
    const int r = r0 + i;
    if (j < rows.jb[r] || j >= rows.je[r]) continue;
    float x = hsum8(acc[i]) * a.scale;
    if (a.softcap > 0.0f) x = a.softcap * std::tanh(x / a.softcap);
    a.scores[r * a.scratch_stride + (j - rows.jb[r])] = x;
  }
}

// Dims [d0, d0 + 8 NV) of rows [r0, r0 + NS)' outputs over their keys.
template <int NS, int NV>
void value_rows(const F16TileArgs& a, const Rows& rows, int r0, int64_t d0) {
  __m256 acc[NS][NV];
#pragma GCC unroll 4
  for (int s = 0; s < NS; ++s)
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) acc[s][i] = _mm256_setzero_ps();
  int64_t lo = rows.jb[r0], hi = rows.je[r0];
  for (int s = 1; s < NS; ++s) {
    lo = std::min(lo, rows.jb[r0 + s]);
    hi = std::max(hi, rows.je[r0 + s]);
  }
  for_each_row(a.kv, a.kv.v, lo, hi, [&](int64_t j, const uint8_t* row) {
    const uint16_t* vr = reinterpret_cast<const uint16_t*>(row) + d0;
    __m256 v[NV];
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) v[i] = load_f16x8(vr + 8 * i);
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) {
      const int r = r0 + s;
      if (j < rows.jb[r] || j >= rows.je[r]) continue;
      const __m256 p = _mm256_set1_ps(_cvtsh_ss(a.probs16[r * a.scratch_stride + (j - rows.jb[r])]));
#pragma GCC unroll 4
      for (int i = 0; i < NV; ++i) acc[s][i] = _mm256_fmadd_ps(p, v[i], acc[s][i]);
    }
  });
#pragma GCC unroll 4
  for (int s = 0; s < NS; ++s)
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) _mm256_storeu_ps(a.out[r0 + s] + d0 + 8 * i, acc[s][i]);
}

template <int NS>
void value_chunk(const F16TileArgs& a, const Rows& rows, int r0, int64_t d0) {
  switch ((a.head_dim - d0) >= 32 ? 4 : static_cast<int>(a.head_dim - d0) / 8) {
    case 4:
      return value_rows<NS, 4>(a, rows, r0, d0);
    case 3:
      return value_rows<NS, 3>(a, rows, r0, d0);
    case 2:
      return value_rows<NS, 2>(a, rows, r0, d0);
    default:
      return value_rows<NS, 1>(a, rows, r0, d0);
  }
}

}  // namespace

bool attend_f16_tile_avx2_supported(int64_t head_dim) {
  return head_dim % 8 == 0 && head_dim <= kMaxHd;
}

void attend_f16_rounded_tile_avx2(const F16TileArgs& a) {
  const int64_t hd = a.head_dim;
  const int n = a.n_rows;
  Rows rows;
  int64_t lo = INT64_MAX, hi = 0;
  for (int r = 0; r < n; ++r) {
    rows.jb[r] = a.j_begin ? a.j_begin[r] : 0;
    rows.je[r] = a.j_end[r];
    lo = std::min(lo, rows.jb[r]);
    hi = std::max(hi, rows.je[r]);
  }
  // The rows' q as f32 (the per-row kernel converts the same f16 values).
  alignas(32) float qf[kMaxTileRows * kMaxHd];
  for (int64_t i = 0; i < n * hd; i += 8) _mm256_store_ps(qf + i, load_f16x8(a.q16 + i));
  alignas(32) float kf[kMaxHd];
  for_each_row(a.kv, a.kv.k, lo, hi, [&](int64_t j, const uint8_t* row) {
    const auto* kr = reinterpret_cast<const uint16_t*>(row);
    for (int64_t d = 0; d < hd; d += 8) _mm256_store_ps(kf + d, load_f16x8(kr + d));
    int r0 = 0;
    for (; r0 + kScoreRows <= n; r0 += kScoreRows) score_rows<kScoreRows>(a, rows, qf, kf, j, r0);
    switch (n - r0) {
      case 3:
        score_rows<3>(a, rows, qf, kf, j, r0);
        break;
      case 2:
        score_rows<2>(a, rows, qf, kf, j, r0);
        break;
      case 1:
        score_rows<1>(a, rows, qf, kf, j, r0);
        break;
      default:
        break;
    }
  });
  for (int r = 0; r < n; ++r) {
    softmax_to_f16_avx2(a.scores + r * a.scratch_stride, a.probs16 + r * a.scratch_stride, rows.je[r] - rows.jb[r]);
  }
  for (int64_t d0 = 0; d0 < hd; d0 += 32) {
    int r0 = 0;
    for (; r0 + kValueRows <= n; r0 += kValueRows) value_chunk<kValueRows>(a, rows, r0, d0);
    if (n - r0 == 2) value_chunk<2>(a, rows, r0, d0);
    if (n - r0 == 1) value_chunk<1>(a, rows, r0, d0);
  }
}

}  // namespace rill::cpu::detail
