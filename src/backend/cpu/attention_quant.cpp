// attention_quant_impl.h for the baseline ISA, and the batched driver.
#define RILL_QUANT_ISA scalar
#include "backend/cpu/attention_quant_impl.h"

#include <algorithm>
#include <cassert>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_quant.h"
#include "core/thread_pool.h"

namespace rill::cpu {
namespace detail {

KvDequant kv_dequant_scalar(DType t) {
  return scalar::dequant_for(t);
}
void attend_quant_scalar(const QuantAttendArgs& a) {
  scalar::attend(a);
}

}  // namespace detail

void attention_quant_batch(const AttentionSeq* seqs, int n_seqs, const AttentionParams& p, const KvSideTypes& t,
                           ThreadPool& pool) {
  assert(p.n_head % p.n_head_kv == 0 && p.head_dim <= 1024);
  const bool avx2 = best_isa() != Isa::kScalar;
  const detail::KvDequant k_dq = avx2 ? detail::kv_dequant_avx2(t.k) : detail::kv_dequant_scalar(t.k);
  const detail::KvDequant v_dq = avx2 ? detail::kv_dequant_avx2(t.v) : detail::kv_dequant_scalar(t.v);
  assert(k_dq && v_dq);
  const int64_t group = p.n_head / p.n_head_kv, hd = p.head_dim;
  // A head of whole blocks is read alone; smaller heads share blocks, so
  // their whole rows are dequantized (tiny models only: width <= 4096).
  const int64_t width = p.n_head_kv * hd;
  const bool k_whole = hd % dtype_info(t.k).block_size == 0, v_whole = hd % dtype_info(t.v).block_size == 0;
  assert((k_whole && v_whole) || width <= 4096);
  // Tiles (AVX-512, else AVX2) where the shape allows, chosen once per call
  // from the ISA, types and shape only, so every row of every batch takes
  // the same kernel.
  detail::QuantTileAttend fast = nullptr;
  if (k_whole && v_whole) {
    if (best_isa() == Isa::kAvx512) fast = detail::attend_quant_avx512_for(t.k, t.v, hd);
    if (best_isa() == Isa::kAvx2) fast = detail::attend_quant_tile_avx2_for(t.k, t.v, hd);
  }
  const size_t k_head_bytes = k_whole ? row_bytes(t.k, hd) : 0, v_head_bytes = v_whole ? row_bytes(t.v, hd) : 0;
  // Queries per unit: the tile kernels dequantize a row once for a tile of
  // consecutive queries of a sequence (up to 16 query heads in all); the
  // others take one query. A query's bits do not depend on its tile.
  const int64_t tile = fast ? std::max<int64_t>(1, 16 / group) : 1;
  // One unit per (tile of queries, KV head); first_unit[s]: the first of sequence s.
  thread_local std::vector<int64_t> first_unit;
  first_unit.resize(static_cast<size_t>(n_seqs) + 1);
  first_unit[0] = 0;
  int64_t max_kv = 0;
  for (int s = 0; s < n_seqs; ++s) {
    assert(seqs[s].kv.row_bytes == row_bytes(t.k, p.n_head_kv * hd));
    assert((seqs[s].kv.v_row_bytes ? seqs[s].kv.v_row_bytes : seqs[s].kv.row_bytes) ==
           row_bytes(t.v, p.n_head_kv * hd));
    const int64_t tiles = (seqs[s].n_q + tile - 1) / tile;
    first_unit[static_cast<size_t>(s) + 1] = first_unit[static_cast<size_t>(s)] + tiles * p.n_head_kv;
    max_kv = std::max(max_kv, seqs[s].n_kv);
  }
  const int64_t n_units = first_unit[static_cast<size_t>(n_seqs)];
  const int64_t* starts = first_unit.data();
  const int64_t grain = std::max<int64_t>(1, n_units / (pool.n_threads() * 8));
  pool.parallel_for(n_units, grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores, q;
    const size_t scratch = static_cast<size_t>(max_kv * group * tile);
    if (scores.size() < scratch) scores.resize(scratch);
    q.resize(static_cast<size_t>(group * hd * tile));
    int s = static_cast<int>(std::upper_bound(starts, starts + n_seqs + 1, begin) - starts) - 1;
    for (int64_t u = begin; u < end; ++u) {
      while (u >= starts[s + 1]) ++s;
      const AttentionSeq& seq = seqs[s];
      const int64_t local = u - starts[s];
      const int64_t i = local / p.n_head_kv * tile, kvh = local % p.n_head_kv;
      const int64_t q_stride = seq.q_stride > 0 ? seq.q_stride : p.n_head * hd;
      const int64_t out_stride = seq.out_stride > 0 ? seq.out_stride : p.n_head * hd;
      auto j_end = [&](int64_t qi) { return std::min<int64_t>(seq.q_pos[qi] + 1, seq.n_kv); };
      auto j_begin = [&](int64_t qi) { return p.window > 0 ? std::max<int64_t>(0, seq.q_pos[qi] - p.window + 1) : 0; };
      if (fast) {
        const int nq = static_cast<int>(std::min(tile, seq.n_q - i));
        int64_t jb[16], je[16];
        for (int k = 0; k < nq; ++k) {
          const float* qr = seq.q + (i + k) * q_stride + kvh * group * hd;
          float* qd = q.data() + k * group * hd;
          std::copy(qr, qr + group * hd, qd);
          if (t.k_rotated) {
            for (int64_t g = 0; g < group; ++g) hadamard_rotate(qd + g * hd, hd);
          }
          jb[k] = j_begin(i + k);
          je[k] = j_end(i + k);
        }
        detail::QuantTileArgs a;
        a.q = q.data();
        a.kv = seq.kv;
        a.kv.k += static_cast<size_t>(kvh) * k_head_bytes;
        a.kv.v += static_cast<size_t>(kvh) * v_head_bytes;
        a.head_dim = hd;
        a.j_begin = jb;
        a.j_end = je;
        a.n_q = nq;
        a.n_heads = static_cast<int>(group);
        a.scale = p.scale;
        a.softcap = p.softcap;
        a.scores = scores.data();
        a.score_stride = max_kv;
        a.out = seq.out + i * out_stride + kvh * group * hd;
        a.out_stride = out_stride;
        fast(a);
        if (t.v_rotated) {
          for (int k = 0; k < nq; ++k)
            for (int64_t g = 0; g < group; ++g) hadamard_rotate(a.out + k * out_stride + g * hd, hd);
        }
        continue;
      }
      const float* qr = seq.q + i * q_stride + kvh * group * hd;
      std::copy(qr, qr + group * hd, q.data());
      if (t.k_rotated) {
        for (int64_t g = 0; g < group; ++g) hadamard_rotate(q.data() + g * hd, hd);
      }
      float* out = seq.out + i * out_stride + kvh * group * hd;
      detail::QuantAttendArgs a;
      a.q = q.data();
      a.kv = seq.kv;
      a.kv.k += static_cast<size_t>(kvh) * k_head_bytes;
      a.kv.v += static_cast<size_t>(kvh) * v_head_bytes;
      a.k_dequant = k_dq;
      a.v_dequant = v_dq;
      a.head_dim = hd;
      a.j_end = j_end(i);
      a.j_begin = j_begin(i);
      a.n_heads = static_cast<int>(group);
      a.scale = p.scale;
      a.softcap = p.softcap;
      a.scores = scores.data();
      a.out = out;
      a.k_row_elems = k_whole ? 0 : width;
      a.v_row_elems = v_whole ? 0 : width;
      a.k_head_elem = k_whole ? 0 : kvh * hd;
      a.v_head_elem = v_whole ? 0 : kvh * hd;
      if (a.j_end <= a.j_begin) {
        std::fill(out, out + group * hd, 0.0f);
        continue;
      }
      if (avx2) {
        detail::attend_quant_avx2(a);
      } else {
        detail::attend_quant_scalar(a);
      }
      if (t.v_rotated) {
        for (int64_t g = 0; g < group; ++g) hadamard_rotate(out + g * hd, hd);
      }
    }
  });
}

}  // namespace rill::cpu
