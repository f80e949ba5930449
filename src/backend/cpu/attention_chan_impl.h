// The per-(query, KV head) kernel of attention_chan.h, compiled once per
// ISA (attention_chan.cpp: the baseline; attention_chan_avx2.cpp,
// attention_chan_avx512.cpp) inside
// namespace RILL_CHAN_ISA. Plain loops over 32 tokens: the compiler
// vectorizes the group's token sums (two 16-lane accumulators on AVX-512).
#include <cmath>
#include <vector>

#include "backend/cpu/attention_chan.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/quants.h"
#include "core/e4m3.h"
#include "core/half.h"

namespace rill::cpu::detail::RILL_CHAN_ISA {

constexpr int kT = kKvChanTokens;

// 8 partial sums in a fixed order, as attention_quant's dot.
inline float dot8(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[d + k] * b[d + k];
  }
  for (; d < n; ++d) acc[d & 7] += a[d] * b[d];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

inline float capped(float x, float softcap) {
  return softcap > 0.0f ? softcap * std::tanh(x / softcap) : x;
}

#ifndef RILL_CHAN_GROUP_SUMS
// acc[g][j] = sum over channels c, in order, of qd[g][c] * q_cj (token j's
// code of channel c: qs[c * 16 + j % 16], low nibble for j < 16).
inline void group_sums(const uint8_t* qs, const float* qd, int64_t hd, int n_heads, float* acc) {
  for (int g = 0; g < n_heads; ++g) {
    float* ag = acc + g * kT;
    for (int j = 0; j < kT; ++j) ag[j] = 0.0f;
    for (int64_t c = 0; c < hd; ++c) {
      const float w = qd[g * hd + c];
      for (int j = 0; j < kT / 2; ++j) {
        ag[j] += w * static_cast<float>(qs[c * (kT / 2) + j] & 0xF);
        ag[j + kT / 2] += w * static_cast<float>(qs[c * (kT / 2) + j] >> 4);
      }
    }
  }
}
#endif

#ifndef RILL_CHAN_GROUP_SCALES
// Per query head g: qz[g] = sum_c q_c z_c (in channel order) and qd[g][c] =
// q_c d_c, z and d one group's zeros (f16) and steps (e4m3 x 1/16).
inline void group_scales(const float* q, const uint16_t* z, const uint8_t* d, int64_t hd, int n_heads, float* qd,
                         float* qz) {
  for (int g = 0; g < n_heads; ++g) {
    const float* qg = q + g * hd;
    float sum = 0.0f;
    for (int64_t c = 0; c < hd; ++c) {
      sum += qg[c] * f16_to_f32(z[c]);
      qd[g * hd + c] = qg[c] * (e4m3_value_fast(d[c]) * (1.0f / 16.0f));
    }
    qz[g] = sum;
  }
}
#endif

#ifndef RILL_CHAN_ACCUMULATE_V
// out[g] += p[g] * row for one key's V head in f32.
inline void accumulate_row(const ChanAttendArgs& a, const float* row, const float* p) {
  for (int g = 0; g < a.n_heads; ++g) {
    float* o = a.out + g * a.head_dim;
    for (int64_t c = 0; c < a.head_dim; ++c) o[c] += p[g] * row[c];
  }
}
// out[g] += p[g] * v for one key's V head (its row bytes at v), dequantized
// into row.
inline void accumulate_v(const ChanAttendArgs& a, const uint8_t* v, const float* p, float* row) {
  a.v_dequant(v, row, a.head_dim);
  accumulate_row(a, row, p);
}
#endif

// Head `head`'s hd elements of a q8_0 tail row (kKvChanTailType) into out:
// f16 d times the int8 code, exact in f32. A head may share a block with
// its neighbour (head_dim 16); the row is whole blocks.
inline void decode_tail_head(const uint8_t* row, int64_t head, int64_t hd, float* out) {
  static_assert(kKvChanTailType == DType::kQ8_0);
  const auto* blocks = reinterpret_cast<const BlockQ8_0*>(row);
  for (int64_t i = 0; i < hd;) {
    const int64_t e = head * hd + i, j0 = e % 32, n = 32 - j0 < hd - i ? 32 - j0 : hd - i;
    const BlockQ8_0& b = blocks[e / 32];
    const float d = f16_to_f32(b.d);
    for (int64_t j = 0; j < n; ++j) out[i + j] = d * static_cast<float>(b.qs[j0 + j]);
    i += n;
  }
}

// head_dim: a multiple of 16 (V's blocks of 64 make it one); width a
// multiple of 32 (the tail's q8_0 rows).
inline void attend(const ChanAttendArgs& a) {
  const int64_t n = a.j_end - a.j_begin, hd = a.head_dim, W = a.width;
  const int64_t own = a.pos - a.pos % kT;  // the query's own block: keys and values from the tail rows
  const int64_t tail_start = a.tail.c0 - a.tail.c0 % kT;
  thread_local std::vector<float> qd_buf, acc_buf, qz_buf;  // [n_heads, hd], [n_heads, 32], [n_heads]
  qd_buf.resize(static_cast<size_t>(a.n_heads * hd));
  acc_buf.resize(static_cast<size_t>(a.n_heads * kT));
  qz_buf.resize(static_cast<size_t>(a.n_heads));
  float *qd = qd_buf.data(), *acc = acc_buf.data(), *qzs = qz_buf.data();
  alignas(64) float row[1024];
  float pj[64];  // one key's probabilities, per query head (n_heads <= 64)
  // Quantized groups: keys [j_begin, min(own, j_end)).
  const int64_t q_end = own < a.j_end ? own : a.j_end;
  for (int64_t b0 = a.j_begin - a.j_begin % kT; b0 < q_end; b0 += kT) {
    const uint8_t* blk = a.k_blocks + static_cast<size_t>(a.kv.table[b0 / kT]) * a.kv.block_bytes;
    const auto* z = reinterpret_cast<const uint16_t*>(blk) + a.head * hd;
    const uint8_t* d = blk + 2 * W + a.head * hd;
    const uint8_t* qs = blk + 3 * W + a.head * hd * (kT / 2);
    const int64_t lo = a.j_begin > b0 ? a.j_begin : b0, hi = q_end < b0 + kT ? q_end : b0 + kT;
    // Per query head: q.z and q_c d_c, then each token's sum over channels.
    group_scales(a.q, z, d, hd, a.n_heads, qd, qzs);
    group_sums(qs, qd, hd, a.n_heads, acc);
    for (int g = 0; g < a.n_heads; ++g) {
      const float qz = qzs[g];
      const float* ag = acc + g * kT;
      float* s = a.scores + g * n;
      for (int64_t j = lo; j < hi; ++j) s[j - a.j_begin] = capped((qz + ag[j - b0]) * a.scale, a.softcap);
    }
  }
  // The own block's keys from their q8_0 rows.
  const size_t rb = a.tail_row_bytes;
  auto tail_row = [&](const uint8_t* tail, const uint8_t* step, int64_t j) {
    return j < a.tail.c0 ? tail + static_cast<size_t>(j - tail_start) * rb
                         : step + static_cast<size_t>(j - a.tail.c0) * rb;
  };
  const int64_t own_begin = own > a.j_begin ? own : a.j_begin;
  for (int64_t j = own_begin; j < a.j_end; ++j) {
    decode_tail_head(tail_row(a.tail.tail_k, a.tail.step_k, j), a.head, hd, row);
    for (int g = 0; g < a.n_heads; ++g) {
      a.scores[g * n + (j - a.j_begin)] = capped(dot8(a.q + g * hd, row, hd) * a.scale, a.softcap);
    }
  }
  for (int g = 0; g < a.n_heads; ++g) {
    float* s = a.scores + g * n;
    float max = -INFINITY;
    for (int64_t j = 0; j < n; ++j) max = s[j] > max ? s[j] : max;
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = std::exp(s[j] - max);
      sum += s[j];
    }
    const auto inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < n; ++j) s[j] *= inv;
    float* o = a.out + g * hd;
    for (int64_t c = 0; c < hd; ++c) o[c] = 0.0f;
  }
  for (int64_t j = a.j_begin; j < a.j_end; ++j) {
    for (int g = 0; g < a.n_heads; ++g) pj[g] = a.scores[g * n + (j - a.j_begin)];
    if (j < own_begin) {
      accumulate_v(a, a.kv.v_row(j), pj, row);
    } else {  // the own block's values from their q8_0 rows
      decode_tail_head(tail_row(a.tail.tail_v, a.tail.step_v, j), a.head, hd, row);
      accumulate_row(a, row, pj);
    }
  }
}

}  // namespace rill::cpu::detail::RILL_CHAN_ISA
