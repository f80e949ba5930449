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

#ifndef RILL_CHAN_SOFTMAX
// s[0, n) to probabilities: max subtracted, exp in f32, the sum in double,
// one f32 reciprocal (the order every query of both kernels shares).
inline void softmax_in_place(float* s, int64_t n) {
  float max = -INFINITY;
  for (int64_t j = 0; j < n; ++j) max = s[j] > max ? s[j] : max;
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - max);
    sum += s[j];
  }
  const auto inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
}
#endif

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

#ifndef RILL_CHAN_GROUP_SUMS_PLANES
// q4a: acc[g][j] = sum over channels c of width > 0, in order, of
// qd[g][c] * code_{j,c}, the channel's codes assembled from its planes
// (planes: the head's first channel's first plane; widths [hd]).
inline void group_sums_planes(const uint8_t* planes, const uint8_t* widths, const float* qd, int64_t hd, int n_rows,
                              float* acc) {
  for (int g = 0; g < n_rows * kT; ++g) acc[g] = 0.0f;
  const uint8_t* p = planes;
  for (int64_t c = 0; c < hd; ++c) {
    const int b = widths[c];
    if (b == 0) continue;
    float code[kT] = {};
    for (int k = 0; k < b; ++k, p += 4) {
      const uint32_t plane = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
      for (int j = 0; j < kT; ++j) code[j] += static_cast<float>(((plane >> j) & 1u) << k);
    }
    for (int g = 0; g < n_rows; ++g) {
      const float w = qd[g * hd + c];
      float* ag = acc + g * kT;
      for (int j = 0; j < kT; ++j) ag[j] += w * code[j];
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

#ifndef RILL_CHAN_GROUP_SCALES_TILE
// group_scales for the queries [0, nq) of a tile that read one group
// (query t's heads at q + t * q_stride): query t's qd rows and qz at
// t * n_heads.
inline void group_scales_tile(const float* q, int64_t q_stride, int nq, const uint16_t* z, const uint8_t* d, int64_t hd,
                              int n_heads, float* qd, float* qz) {
  for (int t = 0; t < nq; ++t) {
    group_scales(q + t * q_stride, z, d, hd, n_heads, qd + t * n_heads * hd, qz + t * n_heads);
  }
}
#endif

#ifndef RILL_CHAN_ACCUMULATE_V
// out[g] += p[g] * row (g < n_rows, out rows head_dim apart) for one key's
// V head in f32.
inline void accumulate_row(const ChanAttendArgs& a, const float* row, const float* p, float* out, int n_rows) {
  for (int g = 0; g < n_rows; ++g) {
    float* o = out + g * a.head_dim;
    for (int64_t c = 0; c < a.head_dim; ++c) o[c] += p[g] * row[c];
  }
}
// out[g] += p[g] * v for one key's V head (its row bytes at v), dequantized
// into row.
inline void accumulate_v(const ChanAttendArgs& a, const uint8_t* v, const float* p, float* row, float* out,
                         int n_rows) {
  a.v_dequant(v, row, a.head_dim);
  accumulate_row(a, row, p, out, n_rows);
}
#endif

#ifndef RILL_CHAN_ACCUMULATE_V_RUN
// attend's V pass over the pool's keys [j0, j1) in one call, where an ISA
// has a form that keeps the sums in registers (the same bits as
// accumulate_v key by key); false: none here, the caller goes key by key.
inline bool accumulate_v_run(const ChanAttendArgs&, const float*, int64_t, int64_t, int64_t) {
  return false;
}
#endif

#ifndef RILL_CHAN_ACCUMULATE_V_TILE
// attend_tile's V pass over the pool's keys in one call, where an ISA has a
// form that keeps sums in registers: row r = t * n_heads + g (out + r *
// head_dim) gets p * v for its keys [jb[t], pe[t]) in key order, p at sc[r
// * sc_stride + j - jb[t]] (the same bits as accumulate_v key by key);
// false: none here, the caller goes key by key.
inline bool accumulate_v_tile(const ChanAttendArgs&, const int64_t*, const int64_t*, int, const float*, int64_t,
                              float*) {
  return false;
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
    const int64_t lo = a.j_begin > b0 ? a.j_begin : b0, hi = q_end < b0 + kT ? q_end : b0 + kT;
    // Per query head: q.z and q_c d_c, then each token's sum over channels.
    group_scales(a.q, z, d, hd, a.n_heads, qd, qzs);
    if (a.k_widths) {
      group_sums_planes(blk + a.k_plane_offset, a.k_widths, qd, hd, a.n_heads, acc);
    } else {
      group_sums(blk + 3 * W + a.head * hd * (kT / 2), qd, hd, a.n_heads, acc);
    }
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
    softmax_in_place(a.scores + g * n, n);
    float* o = a.out + g * hd;
    for (int64_t c = 0; c < hd; ++c) o[c] = 0.0f;
  }
  int64_t j = a.j_begin;
  if (own_begin > j && accumulate_v_run(a, a.scores, n, j, own_begin)) j = own_begin;
  for (; j < a.j_end; ++j) {
    for (int g = 0; g < a.n_heads; ++g) pj[g] = a.scores[g * n + (j - a.j_begin)];
    if (j < own_begin) {
      accumulate_v(a, a.kv.v_row(j), pj, row, a.out, a.n_heads);
    } else {  // the own block's values from their q8_0 rows
      decode_tail_head(tail_row(a.tail.tail_v, a.tail.step_v, j), a.head, hd, row);
      accumulate_row(a, row, pj, a.out, a.n_heads);
    }
  }
}

// attend for a tile of n_q consecutive queries: each query's keys split as
// attend's (the pool's before its own block, q8_0 rows from it on), its
// scores, softmax and sum in attend's order; what the queries share
// computed once: a K group's token sums for all the tile's (query, head)
// rows that read it (group_sums over rows, each row's sums as alone), a V
// row or own-block row decoded once for every query that reads it. The
// queries reading a key form a contiguous range of the tile (their key
// ranges' ends never decrease with the position).
inline void attend_tile(const ChanTileArgs& a) {
  const int nq = a.n_q, H = a.n_heads;
  const int64_t hd = a.head_dim, W = a.width;
  const int64_t tail_start = a.tail.c0 - a.tail.c0 % kT;
  // Query t's keys [jb, je): from the pool [jb, pe), from q8_0 rows [ob, je).
  int64_t jb[kChanTile], je[kChanTile], pe[kChanTile], ob[kChanTile];
  int64_t nmax = 1;
  for (int t = 0; t < nq; ++t) {
    const int64_t pos = a.pos + t, own = pos - pos % kT;
    jb[t] = a.window > 0 ? (pos - a.window + 1 > 0 ? pos - a.window + 1 : 0) : 0;
    je[t] = pos + 1 < a.n_kv ? pos + 1 : a.n_kv;
    if (je[t] < jb[t]) je[t] = jb[t];
    pe[t] = own < je[t] ? own : je[t];
    ob[t] = own > jb[t] ? own : jb[t];
    nmax = je[t] - jb[t] > nmax ? je[t] - jb[t] : nmax;
  }
  thread_local std::vector<float> qd_buf, acc_buf, qz_buf, sc_buf, out_buf;
  qd_buf.resize(static_cast<size_t>(nq * H * hd));
  acc_buf.resize(static_cast<size_t>(nq * H * kT));
  qz_buf.resize(static_cast<size_t>(nq * H));
  sc_buf.resize(static_cast<size_t>(nq * H * nmax));
  out_buf.resize(static_cast<size_t>(nq * H * hd));
  float *qd = qd_buf.data(), *acc = acc_buf.data(), *qzs = qz_buf.data(), *sc = sc_buf.data();
  float* out = out_buf.data();
  alignas(64) float row[1024];
  float pj[kChanTile * 64];  // one key's probabilities, per (query, head) row
  auto q_of = [&](int t) { return a.q + t * a.q_stride; };
  auto s_of = [&](int t, int g) { return sc + (static_cast<int64_t>(t) * H + g) * nmax; };
  // [t0, t1): the queries with lo[t] <= j < hi[t].
  auto range = [&](const int64_t* lo, const int64_t* hi, int64_t j, int& t0, int& t1) {
    t0 = 0;
    while (t0 < nq && !(lo[t0] <= j && j < hi[t0])) ++t0;
    t1 = t0;
    while (t1 < nq && lo[t1] <= j && j < hi[t1]) ++t1;
  };
  // Quantized groups: the blocks of keys [jb, pe) of any query.
  for (int64_t b0 = jb[0] - jb[0] % kT; b0 < pe[nq - 1]; b0 += kT) {
    int t0 = 0;
    while (t0 < nq && !(jb[t0] < b0 + kT && pe[t0] > b0)) ++t0;
    int t1 = t0;
    while (t1 < nq && jb[t1] < b0 + kT && pe[t1] > b0) ++t1;
    if (t0 == t1) continue;
    const uint8_t* blk = a.k_blocks + static_cast<size_t>(a.kv.table[b0 / kT]) * a.kv.block_bytes;
    const auto* z = reinterpret_cast<const uint16_t*>(blk) + a.head * hd;
    const uint8_t* d = blk + 2 * W + a.head * hd;
    group_scales_tile(q_of(t0), a.q_stride, t1 - t0, z, d, hd, H, qd + t0 * H * hd, qzs + t0 * H);
    if (a.k_widths) {
      group_sums_planes(blk + a.k_plane_offset, a.k_widths, qd + t0 * H * hd, hd, (t1 - t0) * H, acc + t0 * H * kT);
    } else {
      group_sums(blk + 3 * W + a.head * hd * (kT / 2), qd + t0 * H * hd, hd, (t1 - t0) * H, acc + t0 * H * kT);
    }
    for (int t = t0; t < t1; ++t) {
      const int64_t lo = jb[t] > b0 ? jb[t] : b0, hi = pe[t] < b0 + kT ? pe[t] : b0 + kT;
      for (int g = 0; g < H; ++g) {
        const float qz = qzs[t * H + g];
        const float* ag = acc + (t * H + g) * kT;
        float* s = s_of(t, g);
        const int64_t sj = jb[t], aj = b0;
        if (a.softcap > 0.0f) {
          for (int64_t j = lo; j < hi; ++j) s[j - sj] = capped((qz + ag[j - aj]) * a.scale, a.softcap);
        } else {  // capped's other branch, a loop the compiler vectorizes (s, ag and a never overlap)
          const float scale = a.scale;
#pragma GCC ivdep
          for (int64_t j = lo; j < hi; ++j) s[j - sj] = (qz + ag[j - aj]) * scale;
        }
      }
    }
  }
  const size_t rb = a.tail_row_bytes;
  auto tail_row = [&](const uint8_t* tail, const uint8_t* step, int64_t j) {
    return j < a.tail.c0 ? tail + static_cast<size_t>(j - tail_start) * rb
                         : step + static_cast<size_t>(j - a.tail.c0) * rb;
  };
  // The own blocks' keys from their q8_0 rows.
  for (int64_t j = ob[0]; j < je[nq - 1]; ++j) {
    int t0, t1;
    range(ob, je, j, t0, t1);
    if (t0 == t1) continue;
    decode_tail_head(tail_row(a.tail.tail_k, a.tail.step_k, j), a.head, hd, row);
    for (int t = t0; t < t1; ++t) {
      for (int g = 0; g < H; ++g) {
        s_of(t, g)[j - jb[t]] = capped(dot8(q_of(t) + g * hd, row, hd) * a.scale, a.softcap);
      }
    }
  }
  for (int t = 0; t < nq; ++t) {
    const int64_t n = je[t] - jb[t];
    for (int g = 0; g < H; ++g) {
      float* o = out + (t * H + g) * hd;
      for (int64_t c = 0; c < hd; ++c) o[c] = 0.0f;
      if (n == 0) continue;
      softmax_in_place(s_of(t, g), n);
    }
  }
  // Each row's pool keys in key order, then its own blocks' keys (pe[t] <=
  // ob[t]: the order of one query alone).
  if (!accumulate_v_tile(a, jb, pe, nq, sc, nmax, out)) {
    for (int64_t j = jb[0]; j < pe[nq - 1]; ++j) {
      int t0, t1;
      range(jb, pe, j, t0, t1);
      if (t0 == t1) continue;
      for (int t = t0; t < t1; ++t) {
        for (int g = 0; g < H; ++g) pj[(t - t0) * H + g] = s_of(t, g)[j - jb[t]];
      }
      accumulate_v(a, a.kv.v_row(j), pj, row, out + t0 * H * hd, (t1 - t0) * H);
    }
  }
  for (int64_t j = ob[0]; j < je[nq - 1]; ++j) {
    int t0, t1;
    range(ob, je, j, t0, t1);
    if (t0 < t1) {  // the own blocks' values from their q8_0 rows
      decode_tail_head(tail_row(a.tail.tail_v, a.tail.step_v, j), a.head, hd, row);
      for (int t = t0; t < t1; ++t) {
        for (int g = 0; g < H; ++g) pj[(t - t0) * H + g] = s_of(t, g)[j - jb[t]];
      }
      accumulate_row(a, row, pj, out + t0 * H * hd, (t1 - t0) * H);
    }
  }
  for (int t = 0; t < nq; ++t) {
    const float* src = out + t * H * hd;
    float* dst = a.out + t * a.out_stride;
    for (int64_t c = 0; c < H * hd; ++c) dst[c] = src[c];
  }
}

}  // namespace rill::cpu::detail::RILL_CHAN_ISA
