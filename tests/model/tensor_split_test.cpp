// TensorSplit: which heads, KV heads and vocabulary rows a rank holds, and
// the weight views that give it its share.
#include <gtest/gtest.h>

#include "model/tensor_split.h"

namespace rill {
namespace {

ModelConfig config(int64_t n_head, int64_t n_head_kv, int64_t n_vocab) {
  ModelConfig c;
  c.n_head = n_head;
  c.n_head_kv = n_head_kv;
  c.n_vocab = n_vocab;
  return c;
}

TEST(TensorSplit, KvHeadsSplitWhenTheRanksDivideThem) {
  const ModelConfig c = config(32, 8, 128256);
  for (int r = 0; r < 4; ++r) {
    auto s = plan_tensor_split(c, r, 4, "m");
    ASSERT_TRUE(s.ok()) << s.error().message;
    EXPECT_EQ(s->heads.begin, 8 * r);
    EXPECT_EQ(s->heads.n, 8);
    EXPECT_EQ(s->kv_heads.begin, 2 * r);
    EXPECT_EQ(s->kv_heads.n, 2);
    EXPECT_EQ(s->vocab.begin, 32064 * r);
    EXPECT_EQ(s->vocab.n, 32064);
  }
}

// 8 query heads over 2 KV heads (groups of 4) on 4 ranks: ranks 0, 1 read
// KV head 0, ranks 2, 3 KV head 1, each holding its own copy.
TEST(TensorSplit, KvHeadsReplicatedWhenRanksOutnumberThem) {
  const ModelConfig c = config(8, 2, 100);
  const int64_t expected_kv[4] = {0, 0, 1, 1};
  for (int r = 0; r < 4; ++r) {
    auto s = plan_tensor_split(c, r, 4, "m");
    ASSERT_TRUE(s.ok()) << s.error().message;
    EXPECT_EQ(s->heads.begin, 2 * r);
    EXPECT_EQ(s->kv_heads.begin, expected_kv[r]);
    EXPECT_EQ(s->kv_heads.n, 1);
  }
}

// Vp = ceil(100 / 8) = 13: ranks 0..6 hold 13 rows, rank 7 the last 9.
TEST(TensorSplit, UnevenVocabularyPadsTheStride) {
  const ModelConfig c = config(8, 8, 100);
  int64_t total = 0;
  for (int r = 0; r < 8; ++r) {
    auto s = plan_tensor_split(c, r, 8, "m");
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->vocab_stride, 13);
    EXPECT_EQ(s->vocab.begin, 13 * r);
    EXPECT_EQ(s->vocab.n, r < 7 ? 13 : 9);
    total += s->vocab.n;
  }
  EXPECT_EQ(total, 100);
}

TEST(TensorSplit, RefusesWhatDoesNotDivide) {
  auto heads = plan_tensor_split(config(6, 6, 64), 0, 4, "models/x");
  ASSERT_FALSE(heads.ok());
  EXPECT_EQ(
      heads.error().message,
      "models/x: num_attention_heads 6 does not divide over 4 tensor-parallel ranks; use a rank count that divides it");
  auto kv = plan_tensor_split(config(12, 3, 64), 0, 2, "models/x");
  ASSERT_FALSE(kv.ok());
  EXPECT_NE(kv.error().message.find("num_key_value_heads 3 and 2 tensor-parallel ranks"), std::string::npos);
  auto ff = split_evenly(100, 1, 8, "intermediate_size", "models/x");
  ASSERT_FALSE(ff.ok());
  EXPECT_NE(ff.error().message.find("intermediate_size 100 does not divide over 8"), std::string::npos);
}

TEST(TensorSplit, SlicesAreViewsIntoTheSameWeight) {
  std::vector<float> w(6 * 8);  // [6, 8]
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  Linear l;
  l.w = {DType::kF32, 6, 8, w.data(), 8 * sizeof(float)};
  l.bias = {0, 1, 2, 3, 4, 5};
  const Linear rows = slice_rows(l, {2, 3});
  EXPECT_EQ(rows.w.n_rows, 3);
  EXPECT_EQ(rows.w.n_cols, 8);
  EXPECT_EQ(static_cast<const float*>(rows.w.data)[0], 16.0f);
  EXPECT_EQ(rows.bias, (std::vector<float>{2, 3, 4}));
  auto cols = slice_cols(l, {4, 4}, "o_proj");
  ASSERT_TRUE(cols.ok());
  EXPECT_EQ(cols->w.n_rows, 6);
  EXPECT_EQ(cols->w.n_cols, 4);
  EXPECT_EQ(cols->w.row_stride, 8 * sizeof(float));  // still the full row
  EXPECT_EQ(static_cast<const float*>(cols->w.data)[0], 4.0f);
  EXPECT_TRUE(cols->bias.empty());  // added after the all-reduce by the caller
}

TEST(TensorSplit, ColumnSlicesKeepQuantBlocksWhole) {
  std::vector<uint8_t> q(4 * row_bytes(DType::kQ4_0, 128));
  Linear l;
  l.w = {DType::kQ4_0, 4, 128, q.data(), row_bytes(DType::kQ4_0, 128)};
  EXPECT_TRUE(slice_cols(l, {64, 64}, "down").ok());
  auto bad = slice_cols(l, {48, 16}, "down");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("do not fall on its blocks of 32"), std::string::npos) << bad.error().message;
}

}  // namespace
}  // namespace rill
