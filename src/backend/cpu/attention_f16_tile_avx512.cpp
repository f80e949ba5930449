// The batched (prefill) form of attend_f16_rounded_avx512 for a tile of
// (query, head) rows that share one KV head (attention_f16.h states the
// contract). Every row's arithmetic is the per-row kernel's: the same q.k
// blocks of 16 keys (qk16_multi_rows), the same scores, softmax and
// probabilities, and p.v lanes that sum keys l, l + 16, .. in key order
// with the same fmas. Only the loop nest changes: a block of K rows is
// found and loaded into L1 once and serves every row of the tile, and each
// V row, once loaded and converted, feeds the accumulators of up to four
// rows held in registers.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "backend/cpu/attention_f16_avx512_impl.h"

// GCC 12 reports _mm512_cvtph_ps's deliberately undefined pass-through
// operand as used uninitialized once load16 is inlined into these loops; the
// instruction has no mask here, so nothing undefined is ever read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace rill::cpu::detail {
namespace {

// The p.v lanes (key % 16) of S rows at once: per lane, the keys every row
// sees are loaded once for all S; each row then goes on alone to its own
// j_end. acc[s]: row s's [16][256] lane accumulators.
// Row s reads keys [jb[s], n[s]); a lane's keys before the rows' common
// start go row by row first, so each row still adds its keys in order.
template <int S, int NV, bool kWindow>
void pv_rows(const PagedKv& kv, const int64_t* jb, const int64_t* n, const uint16_t* const* probs16,
             float (*const* acc)[256]) {
  int64_t n_min = n[0];
  for (int s = 1; s < S; ++s) n_min = std::min(n_min, n[s]);
  for (int l = 0; l < 16; ++l) {
    __m512 r[S][NV];
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
      for (int i = 0; i < NV; ++i) r[s][i] = _mm512_setzero_ps();
    int64_t j = l;
    if constexpr (kWindow) {
      // Row s's first key of lane l (the per-row kernel's), and the latest of them.
      int64_t first[S];
      for (int s = 0; s < S; ++s) {
        first[s] = l < jb[s] ? l + (jb[s] - l + 15) / 16 * 16 : l;
        j = std::max(j, first[s]);
      }
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s) {
        for (int64_t js = first[s]; js < j && js < n[s]; js += 16) {
          const auto* vr = reinterpret_cast<const uint16_t*>(kv.v_row(js));
          const __m512 p = _mm512_set1_ps(_cvtsh_ss(probs16[s][js]));
#pragma GCC unroll 16
          for (int i = 0; i < NV; ++i) r[s][i] = _mm512_fmadd_ps(load16(vr + 16 * i), p, r[s][i]);
        }
      }
    }
    for (; j < n_min; j += 16) {
      const auto* vr = reinterpret_cast<const uint16_t*>(kv.v_row(j));
      __m512 v[NV];
#pragma GCC unroll 16
      for (int i = 0; i < NV; ++i) v[i] = load16(vr + 16 * i);
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s) {
        const __m512 p = _mm512_set1_ps(_cvtsh_ss(probs16[s][j]));
#pragma GCC unroll 16
        for (int i = 0; i < NV; ++i) r[s][i] = _mm512_fmadd_ps(v[i], p, r[s][i]);
      }
    }
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) {
      for (int64_t js = j; js < n[s]; js += 16) {
        const auto* vr = reinterpret_cast<const uint16_t*>(kv.v_row(js));
        const __m512 p = _mm512_set1_ps(_cvtsh_ss(probs16[s][js]));
#pragma GCC unroll 16
        for (int i = 0; i < NV; ++i) r[s][i] = _mm512_fmadd_ps(load16(vr + 16 * i), p, r[s][i]);
      }
#pragma GCC unroll 16
      for (int i = 0; i < NV; ++i) _mm512_store_ps(acc[s][l] + 16 * i, r[s][i]);
    }
  }
}

// Rows that keep their accumulators in registers together: S * NV
// accumulators, NV converted V vectors and a broadcast within 32 zmm.
template <int NV>
constexpr int kRowsTogether = NV == 4   ? 4
                              : NV == 8 ? 2
                                        : 1;

// qk16_multi_rows with the 16 keys' rows already in f32: the same fmas in
// the same order (f16 to f32 is exact), so the same bits.
template <int NV>
inline void qk16_f32_rows(const __m512* qf, const float (*kf)[16 * NV], float* out) {
  __m512 c[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) c[t] = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int i = 0; i < NV; ++i) {
    const __m512 q = qf[i];
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) c[t] = _mm512_fmadd_ps(_mm512_load_ps(kf[t] + 16 * i), q, c[t]);
  }
  reduce16x16(c, out);
}

template <int NV>
void attend_tile(const F16TileArgs& a) {
  constexpr int64_t hd = 16 * NV;
  constexpr int S = kRowsTogether<NV>;
  const int R = a.n_rows;
  // Row r's keys [jb[r], j_end[r]); its 16-key blocks (aligned at key 0)
  // [lo[r], hi[r]) come from the shared pass, its other keys one by one.
  int64_t jb[kMaxTileRows], lo[kMaxTileRows], hi[kMaxTileRows];
  int64_t n_max = 0, lo_min = std::numeric_limits<int64_t>::max();
  for (int r = 0; r < R; ++r) {
    jb[r] = a.j_begin ? a.j_begin[r] : 0;
    lo[r] = (jb[r] + 15) / 16 * 16;
    hi[r] = a.j_end[r] / 16 * 16;
    n_max = std::max(n_max, a.j_end[r]);
    if (lo[r] >= hi[r]) {  // no whole block: every key one by one
      lo[r] = hi[r] = jb[r];
    } else {
      lo_min = std::min(lo_min, lo[r]);  // a multiple of 16
    }
  }
  // q.k: each block of 16 keys serves every row that sees all of it.
  alignas(64) __m512 qf[kMaxTileRows][NV];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < NV; ++i) qf[r][i] = load16(a.q16 + r * hd + 16 * i);
  alignas(64) float kf[16][hd];  // the block's K rows in f32 (exact), converted once for every row
  for (int64_t j0 = lo_min; j0 <= n_max - 16; j0 += 16) {  // none when no row has a whole block
    const uint16_t* rows[16];
    k_rows16(a.kv, j0, rows);
    for (int t = 0; t < 16; ++t)
      for (int i = 0; i < NV; ++i) _mm512_store_ps(kf[t] + 16 * i, load16(rows[t] + 16 * i));
    for (int r = 0; r < R; ++r) {
      if (lo[r] <= j0 && j0 + 16 <= hi[r]) qk16_f32_rows<NV>(qf[r], kf, a.scores + r * a.scratch_stride + j0);
    }
  }
  for (int r = 0; r < R; ++r) {
    const int64_t n = a.j_end[r];
    float* scores = a.scores + r * a.scratch_stride;
    for (int64_t j = jb[r] / 16 * 16; j < jb[r]; ++j) scores[j] = -INFINITY;  // softmax_probs16's first chunk
    // Keys before the first whole block: raw dots, as the blocks leave them
    // (each key's dot is its own chain, whatever block it is in).
    for_each_row(a.kv, a.kv.k, jb[r], lo[r], [&](int64_t j, const uint8_t* row) {
      scores[j] = dot_qk(a.q16 + r * hd, reinterpret_cast<const uint16_t*>(row), hd, /*single_query=*/false);
    });
    const float max = finish_scores(a.q16 + r * hd, a.kv, hd, jb[r], hi[r], n, a.scale, a.softcap,
                                    /*single_query=*/false, scores);
    softmax_probs16(scores, a.probs16 + r * a.scratch_stride, jb[r], n, max);
  }
  // p.v, S rows at a time (a tail of fewer rows one at a time).
  alignas(64) float acc[S][16][256];
  float(*acc_rows[S])[256];
  for (int s = 0; s < S; ++s) acc_rows[s] = acc[s];
  for (int r0 = 0; r0 < R;) {
    const int take = R - r0 >= S ? S : 1;
    const uint16_t* probs[S];
    for (int s = 0; s < take; ++s) probs[s] = a.probs16 + (r0 + s) * a.scratch_stride;
    const bool window = a.j_begin != nullptr;
    if (take == S) {
      (window ? pv_rows<S, NV, true> : pv_rows<S, NV, false>)(a.kv, jb + r0, a.j_end + r0, probs, acc_rows);
    } else {
      (window ? pv_rows<1, NV, true> : pv_rows<1, NV, false>)(a.kv, jb + r0, a.j_end + r0, probs, acc_rows);
    }
    for (int s = 0; s < take; ++s) reduce_lanes(&acc[s][0][0], 256, hd, /*single_query=*/false, a.out[r0 + s]);
    r0 += take;
  }
}

}  // namespace

void attend_f16_rounded_tile_avx512(const F16TileArgs& a) {
  switch (a.head_dim) {
    case 64:
      return attend_tile<4>(a);
    case 128:
      return attend_tile<8>(a);
    case 192:
      return attend_tile<12>(a);
    case 256:
      return attend_tile<16>(a);
    default:
      break;
  }
  // Head sizes attend_f16_exact_supported() refuses.
  __builtin_trap();
}

}  // namespace rill::cpu::detail
