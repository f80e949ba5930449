#pragma once
// The AVX-512 primitives of the llama.cpp-exact f16 attention (see
// attention_f16_avx512.cpp for the arithmetic they reproduce), shared by the
// per-head kernel and the GQA-group kernel. Include only from *_avx512.cpp;
// internal linkage.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "backend/cpu/attention_f16.h"
#include "backend/cpu/exp_ggml_avx512.h"
#include "core/half.h"

namespace rill::cpu::detail {
namespace {

// Prefetches rows [j_begin, j_end) of one head (head_dim f16 each) toward
// L1: decode attention at several streams reads K/V that no cache holds,
// and the p.v lanes visit keys 64 apart, which the hardware prefetcher does
// not follow.
inline void prefetch_rows(const PagedKv& kv, const uint8_t* base, int64_t j_begin, int64_t j_end, int64_t hd) {
  for_each_row(kv, base, j_begin, j_end, [&](int64_t, const uint8_t* row) {
    for (int64_t b = 0; b < hd * 2; b += 64) _mm_prefetch(reinterpret_cast<const char*>(row + b), _MM_HINT_T0);
  });
}

inline float reduce16(__m512 v) {
  const __m256 t3 = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
  const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
  const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
}

inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// q.k for one key (head_dim % 64 == 0 for the single-query form, % 16 otherwise).
inline float dot_qk(const uint16_t* q, const uint16_t* k, int64_t hd, bool single_query) {
  if (!single_query) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d += 16) acc = _mm512_fmadd_ps(load16(k + d), load16(q + d), acc);
    return reduce16(acc);
  }
  __m512 x[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t d = 0; d < hd; d += 64)
    for (int r = 0; r < 4; ++r) x[r] = _mm512_fmadd_ps(load16(k + d + 16 * r), load16(q + d + 16 * r), x[r]);
  return reduce16(_mm512_add_ps(_mm512_add_ps(x[0], x[2]), _mm512_add_ps(x[1], x[3])));
}

// out[t] = reduce16(c[t]) for 16 vectors at once: reduce16's tree (hi8 +
// lo8, hi4 + lo4, the two pair sums, their sum) run vertically across the
// vectors with 128-bit-lane shuffles, each result bit-identical.
inline void reduce16x16(const __m512* c, float* out) {
  // t3 = hi8 + lo8, two keys per vector: [t3_a(0..7), t3_b(0..7)].
  __m512 u[8];
  for (int i = 0; i < 8; ++i) {
    const __m512 lo = _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 hi = _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2));
    u[i] = _mm512_add_ps(hi, lo);
  }
  // t6 = hi4 + lo4, one key per 128-bit lane: v[i] holds keys 4i..4i+3.
  __m512 v[4];
  for (int i = 0; i < 4; ++i) {
    const __m512 e = _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 o = _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1));
    v[i] = _mm512_add_ps(o, e);
  }
  // t8 = (t6[0] + t6[2], t6[1] + t6[3]), then t8[0] + t8[1].
  const __m512 w01 = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 w23 = _mm512_add_ps(_mm512_shuffle_ps(v[2], v[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_ps(v[2], v[3], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
  // r[4m + e] is key 4e + m (m: 128-bit lane, e: element); put keys in order.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, r));
}

// The single-query q.k of 16 consecutive keys, each bit-identical to
// dot_qk(q, k_j, hd, true): the per-key vectors are built as there, then the
// 16 horizontal adds (reduce16's tree) run vertically across keys with
// 128-bit-lane shuffles, instead of a serial shuffle chain per key.
// out[t] = q . k_(j0 + t), each key's row found through the block table.
inline void dot_qk16_single(const __m512* qf, const F16AttendArgs& a, int64_t j0, int64_t hd, float* out) {
  __m512 c[16];
  for_each_row(a.kv, a.kv.k, j0, j0 + 16, [&](int64_t j, const uint8_t* row) {
    const auto* kr = reinterpret_cast<const uint16_t*>(row);
    __m512 x0 = _mm512_setzero_ps(), x1 = x0, x2 = x0, x3 = x0;
    for (int64_t d = 0, i = 0; d < hd; d += 64, i += 4) {
      x0 = _mm512_fmadd_ps(load16(kr + d), qf[i], x0);
      x1 = _mm512_fmadd_ps(load16(kr + d + 16), qf[i + 1], x1);
      x2 = _mm512_fmadd_ps(load16(kr + d + 32), qf[i + 2], x2);
      x3 = _mm512_fmadd_ps(load16(kr + d + 48), qf[i + 3], x3);
    }
    c[j - j0] = _mm512_add_ps(_mm512_add_ps(x0, x2), _mm512_add_ps(x1, x3));
  });
  reduce16x16(c, out);
}

// p.v accumulators: lane l sums the keys j = l (mod n_lanes) in key order,
// acc_l = fma(v_j, p_j, acc_l), as llama.cpp's dot lanes do. Each lane's
// NV vectors stay in registers over its keys; only the result is stored.
template <int NV>
inline void pv_lanes(const F16AttendArgs& a, int n_lanes, int64_t n, float (*acc)[256]) {
  if (n_lanes == 64 && a.j_begin < n) prefetch_rows(a.kv, a.kv.v, a.j_begin, n, a.head_dim);
  for (int l = 0; l < n_lanes; ++l) {
    __m512 r[NV];  // fully unrolled so the accumulators live in registers
#pragma GCC unroll 16
    for (int i = 0; i < NV; ++i) r[i] = _mm512_setzero_ps();
    int64_t j = l;
    if (j < a.j_begin) j += (a.j_begin - l + n_lanes - 1) / n_lanes * n_lanes;
    for (; j < n; j += n_lanes) {
      const __m512 p = _mm512_set1_ps(_cvtsh_ss(a.probs16[j]));
      const auto* vr = reinterpret_cast<const uint16_t*>(a.kv.v_row(j));
#pragma GCC unroll 16
      for (int i = 0; i < NV; ++i) r[i] = _mm512_fmadd_ps(load16(vr + 16 * i), p, r[i]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < NV; ++i) _mm512_store_ps(acc[l] + 16 * i, r[i]);
  }
}

// The multi-query q.k of 16 consecutive keys, each bit-identical to
// dot_qk(q, k_j, hd, false): one 16-lane accumulator per key over 16-dim
// steps, then the 16 horizontal adds done vertically.
// The 16 keys' chains are interleaved (dims outer, keys inner) so they run
// in parallel instead of one 4-cycle fma latency after another; each key
// still adds its dims in order.
// rows: the 16 keys' K rows (at this head).
inline void qk16_multi_rows(const __m512* qf, const uint16_t* const* rows, int64_t hd, float* out) {
  __m512 c[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) c[t] = _mm512_setzero_ps();
  for (int64_t d = 0, i = 0; d < hd; d += 16, ++i) {
    const __m512 q = qf[i];
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) c[t] = _mm512_fmadd_ps(load16(rows[t] + d), q, c[t]);
  }
  reduce16x16(c, out);
}

// The 16 K rows of keys [j0, j0 + 16) of one head, found through the block table.
inline void k_rows16(const PagedKv& kv, int64_t j0, const uint16_t** rows) {
  for_each_row(kv, kv.k, j0, j0 + 16,
               [&](int64_t j, const uint8_t* row) { rows[j - j0] = reinterpret_cast<const uint16_t*>(row); });
}

inline void dot_qk16_multi(const __m512* qf, const F16AttendArgs& a, int64_t j0, int64_t hd, float* out) {
  const uint16_t* rows[16];
  k_rows16(a.kv, j0, rows);
  qk16_multi_rows(qf, rows, hd, out);
}

// Scores [j_begin, j_blocked) hold raw q.k dots (16-key blocks); this
// scales (and caps) them, computes the keys [j_blocked, n) one by one with
// q16, and returns the max. Keys before j_begin must already be -inf.
inline float finish_scores(const uint16_t* q16, const PagedKv& kv, int64_t hd, int64_t j_begin, int64_t j_blocked,
                           int64_t n, float scale, float softcap, bool single_query, float* scores) {
  float max = -INFINITY;
  int64_t t = j_begin;
  if (softcap <= 0.0f) {  // vector form: the same products, and max is exact in any order
    const __m512 vscale = _mm512_set1_ps(scale);
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (; t + 16 <= j_blocked; t += 16) {
      const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(scores + t), vscale);
      _mm512_storeu_ps(scores + t, v);
      vmax = _mm512_max_ps(vmax, v);
    }
    max = _mm512_reduce_max_ps(vmax);
  }
  for (; t < j_blocked; ++t) {
    float s = scores[t] * scale;
    if (softcap > 0.0f) s = softcap * std::tanh(s / softcap);
    scores[t] = s;
    max = s > max ? s : max;
  }
  for_each_row(kv, kv.k, j_blocked, n, [&](int64_t jj, const uint8_t* row) {
    float s = dot_qk(q16, reinterpret_cast<const uint16_t*>(row), hd, single_query) * scale;
    if (softcap > 0.0f) s = softcap * std::tanh(s / softcap);
    scores[jj] = s;
    max = s > max ? s : max;
  });
  return max;
}

// Softmax of scores [0, n) (masked keys -inf) with llama.cpp's chunking:
// exp in 16-key chunks aligned at key 0, chunk sums added in double,
// probabilities * (float)(1 / sum) rounded to f16 into probs16. Keys before
// j_begin are masked (a sliding window): the chunks wholly before it are
// skipped, since their exps are 0 and add exactly 0 to the sum, and their
// scores and probabilities are neither read nor written; the chunk that
// holds j_begin needs -inf below it.
inline void softmax_probs16(float* scores, uint16_t* probs16, int64_t j_begin, int64_t n, float max) {
  double sum = 0.0;
  const __m512 vmax = _mm512_set1_ps(max);
  const int64_t first = j_begin / 16 * 16;
  for (int64_t j0 = first; j0 < n; j0 += 16) {
    const __mmask16 m = n - j0 >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - j0)) - 1);
    const __m512 s = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, scores + j0);
    const __m512 e = exp_ggml512(_mm512_sub_ps(s, vmax));
    _mm512_mask_storeu_ps(scores + j0, m, e);
    sum += static_cast<double>(reduce16(e));
  }
  const float inv = static_cast<float>(1.0 / sum);
  // Rounded to f16 16 at a time: the conversion rounds to nearest even, as
  // f32_to_f16 does (probabilities are finite, so NaN payloads never matter).
  const __m512 vinv = _mm512_set1_ps(inv);
  int64_t jp = first;
  for (; jp + 16 <= n; jp += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_mul_ps(_mm512_loadu_ps(scores + jp), vinv),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(probs16 + jp), h);
  }
  for (; jp < n; ++jp) probs16[jp] = f32_to_f16(scores[jp] * inv);
}

// out[d] = the p.v lanes summed as llama.cpp's dot does: lane_l = acc row l
// (for a single query, (x0 + x2) + (x1 + x3) of the 4 accumulators 16 keys
// apart), then reduce16 across the 16 lanes, vectorised over 16 dims.
// acc: [n_lanes][acc_stride] floats.
inline void reduce_lanes(const float* acc, int64_t acc_stride, int64_t hd, bool single_query, float* out) {
  for (int64_t d = 0; d < hd; d += 16) {
    __m512 lane[16];
    for (int l = 0; l < 16; ++l) {
      lane[l] = _mm512_load_ps(acc + l * acc_stride + d);
      if (single_query) {
        const __m512 x0 = lane[l], x1 = _mm512_load_ps(acc + (16 + l) * acc_stride + d);
        const __m512 x2 = _mm512_load_ps(acc + (32 + l) * acc_stride + d);
        const __m512 x3 = _mm512_load_ps(acc + (48 + l) * acc_stride + d);
        lane[l] = _mm512_add_ps(_mm512_add_ps(x0, x2), _mm512_add_ps(x1, x3));
      }
    }
    __m512 t3[8], t6[4];
    for (int l = 0; l < 8; ++l) t3[l] = _mm512_add_ps(lane[l + 8], lane[l]);
    for (int l = 0; l < 4; ++l) t6[l] = _mm512_add_ps(t3[l + 4], t3[l]);
    const __m512 t8_0 = _mm512_add_ps(t6[0], t6[2]), t8_1 = _mm512_add_ps(t6[1], t6[3]);
    _mm512_storeu_ps(out + d, _mm512_add_ps(t8_0, t8_1));
  }
}

}  // namespace
}  // namespace rill::cpu::detail
