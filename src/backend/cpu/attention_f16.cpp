#include "backend/cpu/attention_f16.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "core/half.h"

namespace rill::cpu {
namespace detail {

// The scalar kernel's softmax (attention_f16.h).
void softmax_to_f16(float* s, uint16_t* p16, int64_t n) {
  float max = -INFINITY;
  for (int64_t j = 0; j < n; ++j) max = std::max(max, s[j]);
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const float e = std::exp(s[j] - max);
    s[j] = e;
    sum += e;
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) p16[j] = f32_to_f16(s[j] * inv);
}

void attend_f16_rounded_scalar(const F16AttendArgs& a) {
  const int64_t n = a.j_end - a.j_begin;
  for_each_row(a.kv, a.kv.k, a.j_begin, a.j_end, [&](int64_t j, const uint8_t* row) {
    const auto* kr = reinterpret_cast<const uint16_t*>(row);
    float dot = 0.0f;
    for (int64_t d = 0; d < a.head_dim; ++d) dot += f16_to_f32(a.q16[d]) * f16_to_f32(kr[d]);
    float x = dot * a.scale;
    if (a.softcap > 0.0f) x = a.softcap * std::tanh(x / a.softcap);
    a.scores[j - a.j_begin] = x;
  });
  softmax_to_f16(a.scores, a.probs16, n);
  for (int64_t d = 0; d < a.head_dim; ++d) a.out[d] = 0.0f;
  for_each_row(a.kv, a.kv.v, a.j_begin, a.j_end, [&](int64_t j, const uint8_t* row) {
    const float p = f16_to_f32(a.probs16[j - a.j_begin]);
    const auto* vr = reinterpret_cast<const uint16_t*>(row);
    for (int64_t d = 0; d < a.head_dim; ++d) a.out[d] += p * f16_to_f32(vr[d]);
  });
}

}  // namespace detail

void attention_f16_rounded(const float* q, const int32_t* q_pos, int64_t n_q, const PagedKv& kv, int64_t n_kv,
                           const AttentionParams& p, float* out, ThreadPool& pool) {
  const AttentionSeq seq{q, q_pos, n_q, kv, n_kv, out};
  attention_f16_rounded_batch(&seq, 1, p, pool);
}

void attention_f16_rounded_batch(const AttentionSeq* seqs, int n_seqs, const AttentionParams& p, ThreadPool& pool) {
  // Floats from one query row (output row) of a sequence to the next.
  auto q_stride = [&](const AttentionSeq& seq) { return seq.q_stride > 0 ? seq.q_stride : p.n_head * p.head_dim; };
  auto out_stride = [&](const AttentionSeq& seq) {
    return seq.out_stride > 0 ? seq.out_stride : p.n_head * p.head_dim;
  };
  constexpr int64_t kMaxQ16 = 1024;  // f16 query elements one unit converts
  assert(p.kv_dtype == DType::kF16 && p.n_head % p.n_head_kv == 0 && p.head_dim <= 1024);
  const bool avx2 = best_isa() != Isa::kScalar;
  const bool avx512 = best_isa() == Isa::kAvx512 && detail::attend_f16_exact_supported(p.head_dim);
  const int64_t group = p.n_head / p.n_head_kv;
  // A single-query sequence (decode) on AVX-512 is cut by KV head instead:
  // one unit is up to gmax query heads sharing a KV head, so each K/V row
  // is read once for them (attend_f16_rounded_group_avx512).
  const int gmax = avx512 ? detail::attend_f16_group_max_heads(p.head_dim) : 0;
  const int64_t parts = gmax > 0 ? (group + gmax - 1) / gmax : 0;  // units per KV head
  // Whether query i of seq takes the single-query (decode) form: by its
  // position when the caller says where decoding starts, so that a token's
  // arithmetic does not depend on the step it is in (a recomputed output
  // token after preemption, a one-token prompt chunk), else by n_q.
  auto decode_form = [](const AttentionSeq& seq, int64_t i) {
    return seq.decode_from >= 0 ? seq.q_pos[i] >= seq.decode_from : seq.n_q == 1;
  };
  auto by_kv_head = [&](const AttentionSeq& seq) { return gmax > 0 && seq.n_q == 1 && decode_form(seq, 0); };
  // With enough decoding sequences, one thread takes all of a sequence's KV
  // heads: their K/V rows interleave in memory (a row holds every KV head),
  // so a sequence read by one core comes from DRAM once; split across cores
  // each core would fetch the same lines. Where one call can take them all
  // (parts == 1), it does, reading each row whole and in order.
  // Prefill on AVX-512: a unit is a tile of up to tile_q
  // queries times one KV head's query heads (attend_f16_rounded_tile_avx512),
  // which reads each K and V row once for all of them instead of once per
  // (query, head); queries in the decode form inside a tile go one by one.
  // On AVX2 (and AVX-512 at head_dims its exact kernel does not take) the
  // tiles are attend_f16_rounded_tile_avx2's, over the AVX2 per-row
  // arithmetic.
  const bool tile_avx2 = !avx512 && avx2 && detail::attend_f16_tile_avx2_supported(p.head_dim);
  const int64_t tile_q = (avx512 || tile_avx2) && group <= detail::kMaxTileRows ? detail::kMaxTileRows / group : 0;
  auto by_tile = [&](const AttentionSeq& seq) { return tile_q > 0 && !by_kv_head(seq); };
  bool all_by_kv_head = gmax > 0;
  for (int s = 0; s < n_seqs && all_by_kv_head; ++s) all_by_kv_head = by_kv_head(seqs[s]);
  const bool seq_per_thread = all_by_kv_head && n_seqs >= 2 * pool.n_threads();
  const bool fused =
      seq_per_thread && parts == 1 && p.n_head_kv <= detail::kMaxFusedKvHeads && p.n_head * p.head_dim <= kMaxQ16;
  const int64_t units_per_kv_seq = fused ? 1 : p.n_head_kv * parts;
  // first_unit[s]: the first unit of sequence s; grows only.
  thread_local std::vector<int64_t> first_unit;
  first_unit.resize(static_cast<size_t>(n_seqs) + 1);
  int64_t max_kv = 0;
  first_unit[0] = 0;
  for (int s = 0; s < n_seqs; ++s) {
    assert(seqs[s].kv.row_bytes == static_cast<size_t>(p.n_head_kv * p.head_dim) * 2);
    const int64_t units = by_kv_head(seqs[s]) ? units_per_kv_seq
                          : by_tile(seqs[s])  ? (seqs[s].n_q + tile_q - 1) / tile_q * p.n_head_kv
                                              : seqs[s].n_q * p.n_head;
    first_unit[static_cast<size_t>(s) + 1] = first_unit[static_cast<size_t>(s)] + units;
    max_kv = std::max(max_kv, seqs[s].n_kv);
  }
  const int64_t n_units = first_unit[static_cast<size_t>(n_seqs)];
  const int64_t* starts = first_unit.data();
  int64_t grain = std::max<int64_t>(1, n_units / (pool.n_threads() * 8));
  if (seq_per_thread) grain = units_per_kv_seq;
  // seq's K/V at KV head kvh; the keys a query at pos reads: [key_begin, key_end).
  auto kv_at_head = [&](const AttentionSeq& seq, int64_t kvh) {
    PagedKv kv = seq.kv;
    const size_t head_off = static_cast<size_t>(kvh * p.head_dim) * 2;  // bytes of f16
    kv.k += head_off;
    kv.v += head_off;
    return kv;
  };
  auto key_begin = [&](int64_t pos) { return p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0; };
  auto key_end = [&](const AttentionSeq& seq, int64_t pos) { return std::min<int64_t>(pos + 1, seq.n_kv); };
  pool.parallel_for(n_units, grain, [&](int64_t begin, int64_t end) {
    // Per-thread scratch, grown to the longest context seen (not per step).
    thread_local std::vector<float> scores;
    thread_local std::vector<uint16_t> probs16;
    const size_t scratch = static_cast<size_t>(max_kv) *
                           (fused ? static_cast<size_t>(p.n_head)
                                  : static_cast<size_t>(tile_q > 0 ? detail::kMaxTileRows : detail::kMaxGroupHeads));
    if (scores.size() < scratch) {
      scores.resize(scratch);
      probs16.resize(scratch);
    }
    uint16_t q16[kMaxQ16];
    // Query i's head h alone (the per-row kernels).
    auto attend_one = [&](const AttentionSeq& seq, int64_t i, int64_t h) {
      const float* qr = seq.q + i * q_stride(seq) + h * p.head_dim;
      for (int64_t d = 0; d < p.head_dim; ++d) q16[d] = f32_to_f16(qr[d]);
      const int64_t pos = seq.q_pos[i];
      detail::F16AttendArgs a;
      a.q16 = q16;
      a.kv = kv_at_head(seq, h / group);
      a.head_dim = p.head_dim;
      a.j_end = key_end(seq, pos);
      a.j_begin = key_begin(pos);
      a.scale = p.scale;
      a.softcap = p.softcap;
      a.scores = scores.data();
      a.probs16 = probs16.data();
      a.out = seq.out + i * out_stride(seq) + h * p.head_dim;
      a.single_query = decode_form(seq, i);
      if (avx512) {
        detail::attend_f16_rounded_avx512(a);
      } else if (avx2) {
        detail::attend_f16_rounded_avx2(a);
      } else {
        detail::attend_f16_rounded_scalar(a);
      }
    };
    // Unit `local` of a tiled sequence: queries [i0, i1) of KV head kvh,
    // query-major (a query's heads adjacent: the same j_end).
    auto attend_tile = [&](const AttentionSeq& seq, int64_t local) {
      const int64_t kvh = local % p.n_head_kv, i0 = local / p.n_head_kv * tile_q;
      const int64_t i1 = std::min(seq.n_q, i0 + tile_q);
      uint16_t tq16[detail::kMaxTileRows * 256];
      int64_t j_begin[detail::kMaxTileRows], j_end[detail::kMaxTileRows];
      float* outs[detail::kMaxTileRows];
      int rows = 0;
      for (int64_t i = i0; i < i1; ++i) {
        // AVX-512's decode form is llama.cpp's single-query arithmetic, not
        // the tile's; the AVX2 kernel has one form, so its tiles take
        // decode queries too (a KV head's query heads then share each row).
        if (!tile_avx2 && decode_form(seq, i)) {
          for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) attend_one(seq, i, h);
          continue;
        }
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h, ++rows) {
          const float* qr = seq.q + i * q_stride(seq) + h * p.head_dim;
          for (int64_t d = 0; d < p.head_dim; ++d) tq16[rows * p.head_dim + d] = f32_to_f16(qr[d]);
          j_end[rows] = key_end(seq, seq.q_pos[i]);
          j_begin[rows] = key_begin(seq.q_pos[i]);
          outs[rows] = seq.out + i * out_stride(seq) + h * p.head_dim;
        }
      }
      if (rows == 0) return;
      detail::F16TileArgs t;
      t.q16 = tq16;
      t.j_end = j_end;
      t.j_begin = j_begin;
      t.kv = kv_at_head(seq, kvh);
      t.head_dim = p.head_dim;
      t.n_rows = rows;
      t.scale = p.scale;
      t.softcap = p.softcap;
      t.scores = scores.data();
      t.probs16 = probs16.data();
      t.scratch_stride = max_kv;
      t.out = outs;
      if (tile_avx2) {
        detail::attend_f16_rounded_tile_avx2(t);
      } else {
        detail::attend_f16_rounded_tile_avx512(t);
      }
    };
    int s = static_cast<int>(std::upper_bound(starts, starts + n_seqs + 1, begin) - starts) - 1;
    for (int64_t u = begin; u < end; ++u) {
      while (u >= starts[s + 1]) ++s;
      const AttentionSeq& seq = seqs[s];
      const int64_t local = u - starts[s];  // the unit within the sequence
      if (by_kv_head(seq)) {
        const int64_t kvh = fused ? 0 : local / parts, h0 = fused ? 0 : kvh * group + (local % parts) * gmax;
        const int nh = static_cast<int>(fused ? group : std::min<int64_t>(gmax, (kvh + 1) * group - h0));
        const int n_kvh = fused ? static_cast<int>(p.n_head_kv) : 1;
        const float* qr = seq.q + h0 * p.head_dim;
        for (int64_t d = 0; d < n_kvh * nh * p.head_dim; ++d) q16[d] = f32_to_f16(qr[d]);
        const int64_t pos = seq.q_pos[0];
        detail::F16GroupArgs g;
        g.q16 = q16;
        g.kv = kv_at_head(seq, kvh);
        g.head_dim = p.head_dim;
        g.j_end = key_end(seq, pos);
        g.j_begin = key_begin(pos);
        g.n_heads = nh;
        g.scale = p.scale;
        g.softcap = p.softcap;
        g.scores = scores.data();
        g.probs16 = probs16.data();
        g.scratch_stride = max_kv;
        g.out = seq.out + h0 * p.head_dim;
        g.n_kv_heads = n_kvh;
        detail::attend_f16_rounded_group_avx512(g);
        continue;
      }
      if (by_tile(seq)) {
        attend_tile(seq, local);
        continue;
      }
      // (query, head) within the sequence, head fastest
      attend_one(seq, local / p.n_head, local % p.n_head);
    }
  });
}

}  // namespace rill::cpu
