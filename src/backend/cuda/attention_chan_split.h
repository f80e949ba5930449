#pragma once
// The split plan of the fast k4c / k4a attention (attention_chan.h
// chan_attention_fast): how one query's keys are cut into key splits, each
// a thread block that runs an online softmax over whole KV blocks of 32
// tokens, the splits then combined in split order. Pure functions, built
// for the host and the device alike (the kernel computes its own plan from
// the query's position on the device: a decode graph's key counts are not
// known on the host), so tests/backend checks them without a GPU.
//
// Batch invariance: the plan depends on the query's own key range alone
// (its position and the window), never on the batch or on max_keys, so a
// (sequence, head) is computed the same way whatever else is in the batch.
#include <cstdint>

#if defined(__CUDACC__)
#define RILL_CHAN_SPLIT_HD __host__ __device__
#else
#define RILL_CHAN_SPLIT_HD
#endif

namespace rill::cuda {

// At most kChanMaxSplits splits a query, each at least kChanMinSplitBlocks
// KV blocks (64 keys) unless the query has fewer: a B=1 decode after 1,024
// tokens runs 16 splits for each of Llama-3.1-8B's 8 KV heads (128 thread
// blocks, about one per H100 SM); after 4,096 tokens 32 splits of 4 blocks.
inline constexpr int32_t kChanMaxSplits = 32;
inline constexpr int32_t kChanMinSplitBlocks = 2;
inline constexpr int32_t kChanSplitTokens = 32;  // cpu::kKvChanTokens: a KV block

struct ChanSplit {
  int32_t n_splits = 0;      // 0: no keys
  int32_t split_blocks = 0;  // blocks a split (the last may have fewer)
  int64_t first_block = 0;   // the query's first block (absolute: position / 32)
  int64_t n_blocks = 0;      // blocks [first_block, first_block + n_blocks)
};

// The split plan of a query whose keys are positions [j_begin, j_end).
RILL_CHAN_SPLIT_HD inline ChanSplit chan_split_plan(int64_t j_begin, int64_t j_end) {
  ChanSplit s;
  if (j_end <= j_begin || j_begin < 0) return s;
  s.first_block = j_begin / kChanSplitTokens;
  s.n_blocks = (j_end - 1) / kChanSplitTokens - s.first_block + 1;
  int64_t per = (s.n_blocks + kChanMaxSplits - 1) / kChanMaxSplits;
  if (per < kChanMinSplitBlocks) per = kChanMinSplitBlocks;
  s.split_blocks = static_cast<int32_t>(per);
  s.n_splits = static_cast<int32_t>((s.n_blocks + per - 1) / per);
  return s;
}

// Split `split`'s blocks [*lo, *hi) (absolute block indices); split <
// n_splits.
RILL_CHAN_SPLIT_HD inline void chan_split_blocks(const ChanSplit& s, int32_t split, int64_t* lo, int64_t* hi) {
  const int64_t end = s.first_block + s.n_blocks;
  *lo = s.first_block + int64_t{split} * s.split_blocks;
  *hi = *lo + s.split_blocks < end ? *lo + s.split_blocks : end;
}

// The query's keys [j_begin, j_end) at position pos (window > 0: the last
// `window` positions), as the reference computes them.
RILL_CHAN_SPLIT_HD inline void chan_key_range(int64_t pos, int32_t window, int64_t* j_begin, int64_t* j_end) {
  *j_end = pos + 1;
  *j_begin = window > 0 ? (pos - window + 1 > 0 ? pos - window + 1 : 0) : 0;
}

// The launch's split dimension for queries of at most max_keys keys: no
// query's plan has more splits (a window's range may start mid-block, so
// max_keys keys span up to max_keys / 32 + 2 blocks).
RILL_CHAN_SPLIT_HD inline int32_t chan_split_grid(int64_t max_keys) {
  if (max_keys <= 0) return 1;
  const int64_t blocks = max_keys / kChanSplitTokens + 2;
  const int64_t n = (blocks + kChanMinSplitBlocks - 1) / kChanMinSplitBlocks;
  return static_cast<int32_t>(n < kChanMaxSplits ? n : kChanMaxSplits);
}

// chan_attention_flash's tiles (attention_chan_flash.cu): a thread block
// takes 64 rows, a tile's tokens times the group's query heads, so a tile
// holds chan_flash_tile_tokens(group) tokens: a power of two dividing 32,
// at most 64 / group (group <= 64).
RILL_CHAN_SPLIT_HD inline int32_t chan_flash_tile_tokens(int32_t group) {
  int32_t tt = 32;
  while (tt > 1 && tt * group > 64) tt >>= 1;
  return tt;
}

// The tile token t starts, as its token count; 0 when t starts none. A
// tile starts at a sequence's first token of the batch or at a position
// that is a multiple of tt, and runs over the sequence's next tokens up to
// the next multiple (a step's tokens of a sequence are consecutive, at
// consecutive positions). So a tile lies inside one KV block of 32
// positions, and a token's tile depends on its sequence's positions alone.
RILL_CHAN_SPLIT_HD inline int32_t chan_flash_tile_at(const int32_t* pos, const int32_t* seq_of, int32_t n_tokens,
                                                     int32_t t, int32_t tt) {
  const int32_t seq = seq_of[t];
  if (t > 0 && seq_of[t - 1] == seq && pos[t] % tt != 0) return 0;
  int32_t n = 1;
  while (n < tt && t + n < n_tokens && seq_of[t + n] == seq && pos[t + n] % tt != 0) ++n;
  return n;
}

}  // namespace rill::cuda
