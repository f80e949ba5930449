#include "backend/backend.h"

#include <algorithm>

namespace rill {

RoutedAttention route_attention(const AttentionRouting& r, int32_t n_seqs, const int32_t* q_start, const int32_t* q_len,
                                const int32_t* kv_len, int32_t* decode_tokens, AttentionTile* tiles) {
  RoutedAttention out;
  if (!r.needed) return out;
  for (int32_t s = 0; s < n_seqs; ++s) {
    if (q_len[s] <= r.decode_max_q) {
      for (int32_t i = 0; i < q_len[s]; ++i) decode_tokens[out.n_decode++] = q_start[s] + i;
      out.max_decode_len = std::max(out.max_decode_len, kv_len[s]);
      continue;
    }
    for (int32_t i = 0; i < q_len[s]; i += r.tile_q) {
      tiles[out.n_tiles++] = {s, q_start[s] + i, std::min(r.tile_q, q_len[s] - i)};
    }
  }
  return out;
}

}  // namespace rill
