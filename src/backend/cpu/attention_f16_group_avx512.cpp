// The single-query (decode) form of attend_f16_rounded_avx512 for the G
// query heads that share one KV head (grouped-query attention). Each head's
// arithmetic is exactly that of the per-head kernel (same operations, same
// order, so the same bits); what changes is that every K and V row is loaded
// and converted from f16 once for the G heads instead of once per head. In
// decode at several streams K/V come from memory, so this also takes G - 1
// passes over each KV head out of the step.
#include <algorithm>
#include <cstdlib>
#include <memory>

#include "backend/cpu/attention_f16_avx512_impl.h"

// GCC 12 reports _mm512_cvtph_ps's deliberately undefined pass-through
// operand as used uninitialized once load16 is inlined into these loops; the
// instruction has no mask here, so nothing undefined is ever read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace rill::cpu::detail {
namespace {

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};

// Raw single-query q.k of 16 consecutive keys for G heads: per key the NV
// vectors of its K row are converted once; per head the 4 accumulators of
// ggml_vec_dot_f16 over 64-dim steps, combined (x0 + x2) + (x1 + x3), then
// reduce16x16 across the keys (as dot_qk16_single).
template <int G, int NV>
inline void qk16_group(const __m512 (&qf)[G][NV], const PagedKv& kv, int64_t j0, float* const* scores) {
  alignas(64) __m512 c[G][16];
  for_each_row(kv, kv.k, j0, j0 + 16, [&](int64_t j, const uint8_t* row) {
    const auto* kr = reinterpret_cast<const uint16_t*>(row);
    __m512 k[NV];
#pragma GCC unroll 16
    for (int i = 0; i < NV; ++i) k[i] = load16(kr + 16 * i);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      __m512 x0 = _mm512_setzero_ps(), x1 = x0, x2 = x0, x3 = x0;
#pragma GCC unroll 4
      for (int i = 0; i < NV; i += 4) {
        x0 = _mm512_fmadd_ps(k[i], qf[g][i], x0);
        x1 = _mm512_fmadd_ps(k[i + 1], qf[g][i + 1], x1);
        x2 = _mm512_fmadd_ps(k[i + 2], qf[g][i + 2], x2);
        x3 = _mm512_fmadd_ps(k[i + 3], qf[g][i + 3], x3);
      }
      c[g][j - j0] = _mm512_add_ps(_mm512_add_ps(x0, x2), _mm512_add_ps(x1, x3));
    }
  });
  for (int g = 0; g < G; ++g) reduce16x16(c[g], scores[g] + j0);
}

// p.v lanes (key % 64) for G query heads of each of H KV heads: each V row
// converted once, then one fma per query head per vector into that head's
// lane accumulators (as pv_lanes). Per lane each KV head's rows in turn, so
// the rows a lane visits are read whole (every KV head's part) before the
// next lane's. head_bytes: the offset of KV head h + 1 from head h in a row.
// acc: [H * G][64][hd] floats.
template <int G, int NV>
inline void pv_heads(const PagedKv& kv, int H, size_t head_bytes, int64_t j_begin, int64_t n,
                     const uint16_t* const* probs16, float* acc) {
  constexpr int64_t hd = 16 * NV;
  for (int l = 0; l < 64; ++l) {
    int64_t j0 = l;
    if (j0 < j_begin) j0 += (j_begin - l + 63) / 64 * 64;
    for (int h = 0; h < H; ++h) {
      __m512 r[G][NV];
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
        for (int i = 0; i < NV; ++i) r[g][i] = _mm512_setzero_ps();
      const uint16_t* const* ph = probs16 + h * G;
      for (int64_t j = j0; j < n; j += 64) {
        const auto* vr = reinterpret_cast<const uint16_t*>(kv.v_row(j) + h * head_bytes);
        __m512 v[NV];
#pragma GCC unroll 16
        for (int i = 0; i < NV; ++i) v[i] = load16(vr + 16 * i);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          const __m512 p = _mm512_set1_ps(_cvtsh_ss(ph[g][j]));
#pragma GCC unroll 16
          for (int i = 0; i < NV; ++i) r[g][i] = _mm512_fmadd_ps(v[i], p, r[g][i]);
        }
      }
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
        for (int i = 0; i < NV; ++i) _mm512_store_ps(acc + ((h * G + g) * 64 + l) * hd + 16 * i, r[g][i]);
    }
  }
}

// One KV head (H = 1), its V rows prefetched first: the p.v rows are 64
// keys apart, which the hardware prefetcher does not follow.
template <int G, int NV>
inline void pv_group(const PagedKv& kv, int64_t j_begin, int64_t n, const uint16_t* const* probs16, float* acc) {
  if (j_begin < n) prefetch_rows(kv, kv.v, j_begin, n, 16 * NV);
  pv_heads<G, NV>(kv, 1, 0, j_begin, n, probs16, acc);
}

// F16GroupArgs::n_kv_heads > 1: attend_group's steps for every KV head,
// interleaved per 16-key block (q.k) and per lane (p.v).
template <int G, int NV>
void attend_heads(const F16GroupArgs& a) {
  constexpr int64_t hd = 16 * NV;
  const int H = a.n_kv_heads;
  const size_t head_bytes = static_cast<size_t>(hd) * 2;
  const int64_t n = a.j_end;
  float* scores[kMaxFusedKvHeads * G];
  const uint16_t* probs[kMaxFusedKvHeads * G];
  for (int g = 0; g < H * G; ++g) {
    scores[g] = a.scores + g * a.scratch_stride;
    probs[g] = a.probs16 + g * a.scratch_stride;
    for (int64_t j = a.j_begin / 16 * 16; j < a.j_begin; ++j) scores[g][j] = -INFINITY;  // softmax_probs16's
  }
  auto head_kv = [&](int h) {
    PagedKv kv = a.kv;
    kv.k += h * head_bytes;
    kv.v += h * head_bytes;
    return kv;
  };
  int64_t j = a.j_begin;
  {
    alignas(64) __m512 qf[kMaxFusedKvHeads][G][NV];
    for (int h = 0; h < H; ++h)
      for (int g = 0; g < G; ++g)
        for (int i = 0; i < NV; ++i) qf[h][g][i] = load16(a.q16 + (h * G + g) * hd + 16 * i);
    const int64_t row_elems = H * hd;  // prefetch whole rows: every head's part
    prefetch_rows(a.kv, a.kv.k, j, std::min(j + 32, n), row_elems);
    for (; j + 16 <= n; j += 16) {
      if (j + 32 < n) prefetch_rows(a.kv, a.kv.k, j + 32, std::min(j + 48, n), row_elems);
      for (int h = 0; h < H; ++h) qk16_group<G, NV>(qf[h], head_kv(h), j, scores + h * G);
    }
  }
  for (int h = 0; h < H; ++h) {
    const PagedKv kv = head_kv(h);
    for (int g = 0; g < G; ++g) {
      const int hg = h * G + g;
      const float max = finish_scores(a.q16 + hg * hd, kv, hd, a.j_begin, j, n, a.scale, a.softcap,
                                      /*single_query=*/true, scores[hg]);
      softmax_probs16(scores[hg], a.probs16 + hg * a.scratch_stride, a.j_begin, n, max);
    }
  }
  // Per-thread lane accumulators, grown to the largest call (not per step).
  thread_local std::unique_ptr<float[], AlignedFree> acc;
  thread_local size_t acc_floats = 0;
  const size_t need = static_cast<size_t>(H * G) * 64 * hd;
  if (acc_floats < need) {
    acc.reset(static_cast<float*>(std::aligned_alloc(64, need * sizeof(float))));
    acc_floats = need;
  }
  pv_heads<G, NV>(a.kv, H, head_bytes, a.j_begin, n, probs, acc.get());
  for (int hg = 0; hg < H * G; ++hg)
    reduce_lanes(acc.get() + hg * 64 * hd, hd, hd, /*single_query=*/true, a.out + hg * hd);
}

template <int G, int NV>
void attend_group(const F16GroupArgs& a) {
  if (a.n_kv_heads > 1) return attend_heads<G, NV>(a);
  constexpr int64_t hd = 16 * NV;
  const int64_t n = a.j_end;
  float* scores[G];
  const uint16_t* probs[G];
  for (int g = 0; g < G; ++g) {
    scores[g] = a.scores + g * a.scratch_stride;
    probs[g] = a.probs16 + g * a.scratch_stride;
    for (int64_t j = a.j_begin / 16 * 16; j < a.j_begin; ++j) scores[g][j] = -INFINITY;  // softmax_probs16's
  }
  int64_t j = a.j_begin;
  {
    __m512 qf[G][NV];
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < NV; ++i) qf[g][i] = load16(a.q16 + g * hd + 16 * i);
    // K rows stream from memory in decode: ask for them 32 keys ahead.
    prefetch_rows(a.kv, a.kv.k, j, std::min(j + 32, n), hd);
    for (; j + 16 <= n; j += 16) {
      if (j + 32 < n) prefetch_rows(a.kv, a.kv.k, j + 32, std::min(j + 48, n), hd);
      qk16_group<G, NV>(qf, a.kv, j, scores);
    }
  }
  for (int g = 0; g < G; ++g) {
    const float max = finish_scores(a.q16 + g * hd, a.kv, hd, a.j_begin, j, n, a.scale, a.softcap,
                                    /*single_query=*/true, scores[g]);
    softmax_probs16(scores[g], a.probs16 + g * a.scratch_stride, a.j_begin, n, max);
  }
  alignas(64) float acc[G * 64 * hd];
  pv_group<G, NV>(a.kv, a.j_begin, n, probs, acc);
  for (int g = 0; g < G; ++g) reduce_lanes(acc + g * 64 * hd, hd, hd, /*single_query=*/true, a.out + g * hd);
}

}  // namespace

int attend_f16_group_max_heads(int64_t head_dim) {
  if (head_dim % 64 != 0 || head_dim > 256) return 0;
  return static_cast<int>(std::min<int64_t>(kMaxGroupHeads, 256 / head_dim));
}

void attend_f16_rounded_group_avx512(const F16GroupArgs& a) {
  switch (a.head_dim / 16 * 8 + a.n_heads) {
    case 4 * 8 + 1:
      return attend_group<1, 4>(a);
    case 4 * 8 + 2:
      return attend_group<2, 4>(a);
    case 4 * 8 + 3:
      return attend_group<3, 4>(a);
    case 4 * 8 + 4:
      return attend_group<4, 4>(a);
    case 8 * 8 + 1:
      return attend_group<1, 8>(a);
    case 8 * 8 + 2:
      return attend_group<2, 8>(a);
    case 12 * 8 + 1:
      return attend_group<1, 12>(a);
    case 16 * 8 + 1:
      return attend_group<1, 16>(a);
    default:
      break;
  }
  // Shapes attend_f16_group_max_heads() never hands out.
  __builtin_trap();
}

}  // namespace rill::cpu::detail
