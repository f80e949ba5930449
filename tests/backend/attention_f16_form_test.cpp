// attention_f16_rounded_batch picks a query's arithmetic (llama.cpp's
// decode or prefill form, which round differently on AVX-512) by its
// position against AttentionSeq::decode_from, not by the size of the call:
// every (query, head) row of a many-query call is bit-identical to the same
// query computed alone, before and after decode_from, for the default
// model's shape (9 query heads over 3 KV heads, head_dim 64). Before, the
// rows at or after decode_from of a many-query call (a prefill recomputing
// output tokens after preemption) differed from their one-query calls.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/cpu/attention_f16.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "quant_test_util.h"

namespace rill::cpu {
namespace {

using testing::random_floats;

TEST(AttentionF16Form, RowsDoNotDependOnHowManyQueriesShareTheCall) {
  constexpr int64_t kHeads = 9, kKvHeads = 3, kHd = 64, kN = 150, kDecodeFrom = 70;
  const int64_t row = kKvHeads * kHd;
  const int64_t n_blocks = (kN + 15) / 16;
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>((b * 7) % n_blocks);
  std::vector<uint16_t> k(static_cast<size_t>(n_blocks * 16 * row)), v(k.size());
  const auto kf = random_floats(static_cast<int64_t>(k.size()), 11, -2.0f, 2.0f);
  const auto vf = random_floats(static_cast<int64_t>(v.size()), 12);
  for (size_t i = 0; i < k.size(); ++i) k[i] = f32_to_f16(kf[i]);
  for (size_t i = 0; i < v.size(); ++i) v[i] = f32_to_f16(vf[i]);
  PagedKv kv;
  kv.k = reinterpret_cast<const uint8_t*>(k.data());
  kv.v = reinterpret_cast<const uint8_t*>(v.data());
  kv.table = table.data();
  kv.block_shift = 4;
  kv.row_bytes = static_cast<size_t>(row) * 2;
  kv.block_bytes = 16 * kv.row_bytes;
  AttentionParams p;
  p.n_head = kHeads;
  p.n_head_kv = kKvHeads;
  p.head_dim = kHd;
  p.scale = 0.125f;
  p.kv_dtype = DType::kF16;

  const auto q = random_floats(kN * kHeads * kHd, 13, -2.0f, 2.0f);
  std::vector<int32_t> pos(static_cast<size_t>(kN));
  for (int64_t i = 0; i < kN; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  ThreadPool pool(2);
  // Every position in one call (a prefill of prompt + output so far).
  std::vector<float> all(q.size(), -9.0f);
  AttentionSeq whole{q.data(), pos.data(), kN, kv, kN, all.data(), kDecodeFrom};
  attention_f16_rounded_batch(&whole, 1, p, pool);
  // Each position alone (decode steps; before kDecodeFrom one-token prompt
  // chunks), also batched with other sequences as a decode step is.
  const size_t per_q = static_cast<size_t>(kHeads * kHd);
  for (int64_t i = 0; i < kN; ++i) {
    std::vector<float> one(per_q, -9.0f), other(4 * per_q);
    std::vector<AttentionSeq> seqs;
    seqs.push_back({q.data() + i * kHeads * kHd, pos.data() + i, 1, kv, i + 1, one.data(), kDecodeFrom});
    for (int s = 0; s < 4; ++s) {  // enough sequences for the one-thread-per-sequence form
      seqs.push_back(
          {q.data() + s * kHeads * kHd, pos.data() + kN - 1, 1, kv, kN, other.data() + s * per_q, kDecodeFrom});
    }
    for (int n_seqs : {1, 5}) {
      std::fill(one.begin(), one.end(), -9.0f);
      attention_f16_rounded_batch(seqs.data(), n_seqs, p, pool);
      EXPECT_EQ(std::memcmp(one.data(), all.data() + static_cast<size_t>(i) * per_q, per_q * sizeof(float)), 0)
          << "position " << i << " (" << (i >= kDecodeFrom ? "output" : "prompt") << " token) with " << n_seqs
          << " sequences in the call";
    }
  }
}

}  // namespace
}  // namespace rill::cpu
