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
template <int S, int NV>
void pv_rows(const PagedKv& kv, const int64_t* n, const uint16_t* const* probs16, float (*const* acc)[256]) {
  int64_t n_min = n[0];
  for (int s = 1; s < S; ++s) n_min = std::min(n_min, n[s]);
  for (int l = 0; l < 16; ++l) {
    __m512 r[S][NV];
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 16
      for (int i = 0; i < NV; ++i) r[s][i] = _mm512_setzero_ps();
    int64_t j = l;
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
  int64_t n_max = 0;
  for (int r = 0; r < R; ++r) n_max = std::max(n_max, a.j_end[r]);
  // q.k: each block of 16 keys serves every row that sees all of it.
  alignas(64) __m512 qf[kMaxTileRows][NV];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < NV; ++i) qf[r][i] = load16(a.q16 + r * hd + 16 * i);
  alignas(64) float kf[16][hd];  // the block's K rows in f32 (exact), converted once for every row
  for (int64_t j0 = 0; j0 + 16 <= n_max; j0 += 16) {
    const uint16_t* rows[16];
    k_rows16(a.kv, j0, rows);
    for (int t = 0; t < 16; ++t)
      for (int i = 0; i < NV; ++i) _mm512_store_ps(kf[t] + 16 * i, load16(rows[t] + 16 * i));
    for (int r = 0; r < R; ++r) {
      if (j0 + 16 <= a.j_end[r]) qk16_f32_rows<NV>(qf[r], kf, a.scores + r * a.scratch_stride + j0);
    }
  }
  for (int r = 0; r < R; ++r) {
    const int64_t n = a.j_end[r], blocked = n / 16 * 16;
    float* scores = a.scores + r * a.scratch_stride;
    const float max =
        finish_scores(a.q16 + r * hd, a.kv, hd, 0, blocked, n, a.scale, a.softcap, /*single_query=*/false, scores);
    softmax_probs16(scores, a.probs16 + r * a.scratch_stride, n, max);
  }
  // p.v, S rows at a time (a tail of fewer rows one at a time).
  alignas(64) float acc[S][16][256];
  float(*acc_rows[S])[256];
  for (int s = 0; s < S; ++s) acc_rows[s] = acc[s];
  for (int r0 = 0; r0 < R;) {
    const int take = R - r0 >= S ? S : 1;
    const uint16_t* probs[S];
    for (int s = 0; s < take; ++s) probs[s] = a.probs16 + (r0 + s) * a.scratch_stride;
    if (take == S) {
      pv_rows<S, NV>(a.kv, a.j_end + r0, probs, acc_rows);
    } else {
      pv_rows<1, NV>(a.kv, a.j_end + r0, probs, acc_rows);
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
