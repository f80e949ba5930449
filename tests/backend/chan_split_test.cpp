// The fast k4c / k4a CUDA attention's split plan (backend/cuda/
// attention_chan_split.h, pure host / device functions): the splits cover a
// query's KV blocks exactly once, in order, each non-empty; no plan has
// more splits than the launch's grid holds (chan_split_grid of any key
// count at least the query's); the plan is the query's own (a function of
// its key range only). The flash prefill kernel's tiles: every token in
// exactly one, inside one KV block, a sequence's tiles the same in any batch.
#include "backend/cuda/attention_chan_split.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace rill::cuda {
namespace {

TEST(ChanSplit, SplitsCoverTheBlocksOnceInOrder) {
  for (int64_t j_begin : {0, 1, 31, 32, 33, 100, 4000}) {
    for (int64_t n = 1; n <= 6000; n += (n < 300 ? 1 : 37)) {
      const int64_t j_end = j_begin + n;
      const ChanSplit s = chan_split_plan(j_begin, j_end);
      ASSERT_GE(s.n_splits, 1);
      ASSERT_LE(s.n_splits, kChanMaxSplits);
      EXPECT_EQ(s.first_block, j_begin / 32);
      EXPECT_EQ(s.first_block + s.n_blocks - 1, (j_end - 1) / 32);
      int64_t next = s.first_block;
      for (int32_t z = 0; z < s.n_splits; ++z) {
        int64_t lo = 0, hi = 0;
        chan_split_blocks(s, z, &lo, &hi);
        ASSERT_EQ(lo, next) << "keys [" << j_begin << ", " << j_end << ") split " << z;
        ASSERT_GT(hi, lo) << "an empty split";
        ASSERT_LE(hi - lo, s.split_blocks);
        // a split is at least kChanMinSplitBlocks blocks unless it is the last
        if (z + 1 < s.n_splits) {
          EXPECT_GE(hi - lo, kChanMinSplitBlocks);
        }
        next = hi;
      }
      EXPECT_EQ(next, s.first_block + s.n_blocks);
      // the launch's grid (sized from any key count >= the query's) holds it
      EXPECT_LE(s.n_splits, chan_split_grid(n));
      EXPECT_LE(s.n_splits, chan_split_grid(n + 1000));
    }
  }
}

TEST(ChanSplit, NoKeysNoSplits) {
  EXPECT_EQ(chan_split_plan(5, 5).n_splits, 0);
  EXPECT_EQ(chan_split_plan(7, 3).n_splits, 0);
  EXPECT_GE(chan_split_grid(0), 1);
}

TEST(ChanSplit, KeyRangeIsTheReferences) {
  int64_t b = 0, e = 0;
  chan_key_range(99, 0, &b, &e);
  EXPECT_EQ(b, 0);
  EXPECT_EQ(e, 100);
  chan_key_range(99, 40, &b, &e);
  EXPECT_EQ(b, 60);
  EXPECT_EQ(e, 100);
  chan_key_range(10, 40, &b, &e);
  EXPECT_EQ(b, 0);
  EXPECT_EQ(e, 11);
}

// The shapes the design aims at: a B=1 decode after 1,024 tokens fills
// about one H100 wave with 8 KV heads; long contexts stop at kChanMaxSplits.
TEST(ChanSplit, DecodeShapes) {
  EXPECT_EQ(chan_split_plan(0, 1025).n_splits, 17);  // 33 blocks, 2 a split
  EXPECT_EQ(chan_split_plan(0, 1024).n_splits, 16);
  EXPECT_EQ(chan_split_plan(0, 4097).n_splits, 26);  // 129 blocks, 5 a split
  EXPECT_EQ(chan_split_plan(0, 4096).n_splits, 32);  // 128 blocks, 4 a split
  EXPECT_EQ(chan_split_plan(0, 1).n_splits, 1);
  EXPECT_EQ(chan_split_plan(0, 64).n_splits, 1);
  EXPECT_EQ(chan_split_plan(0, 65).n_splits, 2);
}

TEST(ChanFlashTiles, TokensATileFillTheRowsInsideABlock) {
  for (int32_t g = 1; g <= 64; ++g) {
    const int32_t tt = chan_flash_tile_tokens(g);
    EXPECT_EQ(32 % tt, 0) << g;
    EXPECT_LE(tt * g, 64) << g;
    EXPECT_TRUE(tt == 32 || 2 * tt * g > 64) << g << ": a larger tile would fit";
  }
  EXPECT_EQ(chan_flash_tile_tokens(4), 16);  // Llama-3.1-8B: 16 tokens x 4 heads
  EXPECT_EQ(chan_flash_tile_tokens(3), 16);  // SmolLM2: 48 of the 64 rows
}

// Sequences (first position, token count) end to end as a step lays them.
struct FlashStep {
  std::vector<int32_t> pos, seq_of;
  std::vector<int32_t> first;  // each sequence's first token
};
FlashStep flash_step(const std::vector<std::pair<int32_t, int32_t>>& seqs) {
  FlashStep s;
  for (size_t i = 0; i < seqs.size(); ++i) {
    s.first.push_back(static_cast<int32_t>(s.pos.size()));
    for (int32_t k = 0; k < seqs[i].second; ++k) {
      s.pos.push_back(seqs[i].first + k);
      s.seq_of.push_back(static_cast<int32_t>(i));
    }
  }
  return s;
}

// Each sequence's tiles as (offset of the first token within the
// sequence's tokens, count), in order.
std::vector<std::vector<std::pair<int32_t, int32_t>>> tiles_of(const FlashStep& s, int32_t tt) {
  const auto n = static_cast<int32_t>(s.pos.size());
  std::vector<std::vector<std::pair<int32_t, int32_t>>> out(s.first.size());
  std::vector<int32_t> covered(static_cast<size_t>(n), 0);
  for (int32_t t = 0; t < n; ++t) {
    const int32_t c = chan_flash_tile_at(s.pos.data(), s.seq_of.data(), n, t, tt);
    if (c == 0) continue;
    const int32_t seq = s.seq_of[static_cast<size_t>(t)];
    for (int32_t k = 0; k < c; ++k) {
      EXPECT_LT(t + k, n);
      if (t + k >= n) break;
      ++covered[static_cast<size_t>(t + k)];
      EXPECT_EQ(s.seq_of[static_cast<size_t>(t + k)], seq) << "a tile spans two sequences";
      EXPECT_EQ(s.pos[static_cast<size_t>(t + k)] / 32, s.pos[static_cast<size_t>(t)] / 32)
          << "a tile spans two KV blocks";
    }
    out[static_cast<size_t>(seq)].push_back({t - s.first[static_cast<size_t>(seq)], c});
  }
  for (int32_t t = 0; t < n; ++t) EXPECT_EQ(covered[static_cast<size_t>(t)], 1) << "token " << t;
  return out;
}

TEST(ChanFlashTiles, EveryTokenOnceAndASequencesTilesItsOwn) {
  const std::vector<std::pair<int32_t, int32_t>> seqs = {{0, 1},   {1000, 1}, {5, 40}, {31, 2},
                                                         {64, 64}, {17, 300}, {96, 1}, {7, 9}};
  for (const int32_t g : {1, 3, 4, 8, 32, 64}) {
    const int32_t tt = chan_flash_tile_tokens(g);
    const FlashStep all = flash_step(seqs);
    const auto tiles = tiles_of(all, tt);
    for (size_t i = 0; i < seqs.size(); ++i) {
      // The sequence alone gives the same tiles (batch invariance).
      const auto alone = tiles_of(flash_step({seqs[i]}), tt);
      EXPECT_EQ(alone[0], tiles[i]) << "group " << g << " sequence " << i;
    }
  }
}

}  // namespace
}  // namespace rill::cuda
