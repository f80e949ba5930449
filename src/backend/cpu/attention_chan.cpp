// attention_chan_impl.h for the baseline ISA, and the batched driver.
#define RILL_CHAN_ISA scalar
#include "backend/cpu/attention_chan_impl.h"

#include <algorithm>
#include <cassert>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_quant.h"
#include "core/thread_pool.h"

namespace rill::cpu {
namespace detail {

void attend_chan_scalar(const ChanAttendArgs& a) {
  scalar::attend(a);
}

void attend_chan_tile_scalar(const ChanTileArgs& a) {
  scalar::attend_tile(a);
}

}  // namespace detail

void attention_chan_batch(const AttentionSeq* seqs, const ChanTail* tails, int n_seqs, const AttentionParams& p,
                          const KvSideTypes& t, ThreadPool& pool, const uint8_t* k_widths) {
  assert(p.n_head % p.n_head_kv == 0 && p.head_dim <= 1024 && p.head_dim % 16 == 0 && p.n_head / p.n_head_kv <= 64 &&
         p.n_head_kv * p.head_dim % 32 == 0);
  assert(kv_chan_k(t.k) && !t.k_rotated && (t.k == kKvQ4Alloc) == (k_widths != nullptr));
  // The kernel is chosen once per call from the machine alone, so every
  // row of every batch takes the same arithmetic.
  const auto attend = best_isa() == Isa::kAvx512 ? detail::attend_chan_avx512
                      : best_isa() == Isa::kAvx2 ? detail::attend_chan_avx2
                                                 : detail::attend_chan_scalar;
  const detail::KvDequant v_dq =
      best_isa() != Isa::kScalar ? detail::kv_dequant_avx2(t.v) : detail::kv_dequant_scalar(t.v);
  assert(v_dq && p.head_dim % dtype_info(t.v).block_size == 0);
  const auto attend_tile = best_isa() == Isa::kAvx512 ? detail::attend_chan_tile_avx512
                           : best_isa() == Isa::kAvx2 ? detail::attend_chan_tile_avx2
                                                      : detail::attend_chan_tile_scalar;
  const int64_t group = p.n_head / p.n_head_kv, hd = p.head_dim, width = p.n_head_kv * hd;
  const size_t v_head_bytes = row_bytes(t.v, hd);
  // q4a: each KV head's first plane in a block (one sum per call).
  thread_local std::vector<int64_t> plane_offsets;
  plane_offsets.assign(static_cast<size_t>(p.n_head_kv), 0);
  for (int64_t h = 1; k_widths && h < p.n_head_kv; ++h) {
    int64_t bits = 0;
    for (int64_t c = (h - 1) * hd; c < h * hd; ++c) bits += k_widths[c];
    plane_offsets[static_cast<size_t>(h)] = plane_offsets[static_cast<size_t>(h - 1)] + 4 * bits;
  }
  for (int64_t h = 0; k_widths && h < p.n_head_kv; ++h) plane_offsets[static_cast<size_t>(h)] += 3 * width;
  const int64_t* plane_off = plane_offsets.data();
  int64_t max_kv = 0;
  for (int s = 0; s < n_seqs; ++s) max_kv = std::max(max_kv, seqs[s].n_kv);
  // Up to kChanTile queries a tile, fewer where a tile's scores (tile x
  // group x max_kv floats, per thread) would pass 16 MiB: long contexts
  // with large GQA groups. A query's bits do not depend on the tile size.
  constexpr int64_t kTileScoreBytes = int64_t{16} << 20;
  const int64_t tile =
      std::clamp<int64_t>(kTileScoreBytes / (4 * group * std::max<int64_t>(max_kv, 1)), 1, detail::kChanTile);
  // One unit per (tile of up to `tile` queries, KV head): a sequence's only
  // query (decode) alone, a prefill's in tiles. first_unit[s]: the first
  // of sequence s.
  thread_local std::vector<int64_t> first_unit;
  first_unit.resize(static_cast<size_t>(n_seqs) + 1);
  first_unit[0] = 0;
  for (int s = 0; s < n_seqs; ++s) {
    assert(seqs[s].kv.block_shift == 5 && seqs[s].kv.row_bytes == row_bytes(t.k, width));
    const int64_t n_tiles = (seqs[s].n_q + tile - 1) / tile;
    first_unit[static_cast<size_t>(s) + 1] = first_unit[static_cast<size_t>(s)] + n_tiles * p.n_head_kv;
  }
  const int64_t n_units = first_unit[static_cast<size_t>(n_seqs)];
  const int64_t* starts = first_unit.data();
  const int64_t grain = std::max<int64_t>(1, n_units / (pool.n_threads() * 8));
  pool.parallel_for(n_units, grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    const size_t scratch = static_cast<size_t>(max_kv * group);
    if (scores.size() < scratch) scores.resize(scratch);
    int s = static_cast<int>(std::upper_bound(starts, starts + n_seqs + 1, begin) - starts) - 1;
    for (int64_t u = begin; u < end; ++u) {
      while (u >= starts[s + 1]) ++s;
      const AttentionSeq& seq = seqs[s];
      const int64_t local = u - starts[s];
      const int64_t i0 = local / p.n_head_kv * tile, kvh = local % p.n_head_kv;
      const int n_q = static_cast<int>(std::min<int64_t>(tile, seq.n_q - i0));
      const int64_t q_stride = seq.q_stride > 0 ? seq.q_stride : p.n_head * hd;
      const int64_t out_stride = seq.out_stride > 0 ? seq.out_stride : p.n_head * hd;
      for (int k = 0; k < n_q; ++k) assert(seq.q_pos[i0 + k] == tails[s].c0 + i0 + k);
      const int64_t pos = seq.q_pos[i0];
      float* out = seq.out + i0 * out_stride + kvh * group * hd;
      detail::ChanTileArgs a;
      a.q = seq.q + i0 * q_stride + kvh * group * hd;
      a.kv = seq.kv;
      a.kv.v += static_cast<size_t>(kvh) * v_head_bytes;
      a.k_blocks = seq.kv.k;
      a.k_widths = k_widths ? k_widths + kvh * hd : nullptr;
      a.k_plane_offset = plane_off[kvh];
      a.width = width;
      a.head = kvh;
      a.head_dim = hd;
      a.tail_row_bytes = row_bytes(kKvChanTailType, width);
      a.pos = pos;
      a.j_end = std::min<int64_t>(pos + 1, seq.n_kv);
      a.j_begin = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
      a.tail = tails[s];
      a.v_dequant = v_dq;
      a.v_type = t.v;
      a.n_heads = static_cast<int>(group);
      a.scale = p.scale;
      a.softcap = p.softcap;
      a.scores = scores.data();
      a.out = out;
      if (n_q > 1) {
        a.n_q = n_q;
        a.q_stride = q_stride;
        a.out_stride = out_stride;
        a.window = p.window;
        a.n_kv = seq.n_kv;
        attend_tile(a);
      } else if (a.j_end > a.j_begin) {
        attend(a);
      } else {
        std::fill(out, out + group * hd, 0.0f);
        continue;
      }
      if (t.v_rotated) {
        for (int k = 0; k < n_q; ++k) {
          const int64_t pk = pos + k;
          // A query that reads no key keeps its zeros, as alone.
          if (std::min<int64_t>(pk + 1, seq.n_kv) <= (p.window > 0 ? std::max<int64_t>(0, pk - p.window + 1) : 0))
            continue;
          for (int64_t g = 0; g < group; ++g) hadamard_rotate(out + k * out_stride + g * hd, hd);
        }
      }
    }
  });
}

}  // namespace rill::cpu
