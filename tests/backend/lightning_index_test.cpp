// The CPU Backend's lightning_index (DeepSeek sparse attention's indexer,
// GLM-5) against its contract written out naively: the key rotated and
// stored at its columns of the latent row (and nothing else of the row
// touched), q's heads rotated; per token the scores sum_h w_h relu(s q_h .
// k_j) over its keys, the topk best by (score, then the later key) in
// ascending positions. Two indexer heads over small integer-valued vectors
// make exact ties, so the tie rule is what gets tested. A token's selection
// does not depend on its step (other sequences, or its own earlier tokens
// stored by an earlier step); latent_attention over a selection equals the
// softmax over those keys alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/rope_table.h"
#include "core/half.h"
#include "model/kv_spec.h"

namespace rill {
namespace {

constexpr int32_t kLora = 6, kRope = 4, kIndex = 8, kHeads = 2, kTopK = 5;
constexpr int32_t kBlock = 4, kShift = 2, kBlocksPerSeq = 8;
const LatentKvRow kRow{kLora, kRope, kIndex};

// Small integers: many dot products tie exactly, and f16 keeps them exact.
std::vector<float> integers(size_t n, uint32_t seed, int lo, int hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(d(rng));
  return v;
}

// Sequence s owns blocks [s * kBlocksPerSeq, +kBlocksPerSeq); its tokens
// [from, from + n) are new in the step.
struct Step {
  std::vector<int32_t> pos, seq_of, q_start, q_len, kv_len, table_start, slots, table;
  StepMetadata md;
  Step(const std::vector<int32_t>& seqs, const std::vector<int32_t>& from, const std::vector<int32_t>& n) {
    int32_t t0 = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int32_t s = seqs[i];
      q_start.push_back(t0);
      q_len.push_back(n[i]);
      kv_len.push_back(from[i] + n[i]);
      table_start.push_back(static_cast<int32_t>(table.size()));
      for (int32_t b = 0; b < kBlocksPerSeq; ++b) table.push_back(s * kBlocksPerSeq + b);
      for (int32_t p = from[i]; p < from[i] + n[i]; ++p) {
        pos.push_back(p);
        seq_of.push_back(static_cast<int32_t>(i));
        slots.push_back(((s * kBlocksPerSeq + (p >> kShift)) << kShift) + (p & (kBlock - 1)));
      }
      t0 += n[i];
    }
    md.n_tokens = t0;
    md.n_seqs = static_cast<int32_t>(seqs.size());
    md.pos = pos.data();
    md.seq_of = seq_of.data();
    md.q_start = q_start.data();
    md.q_len = q_len.data();
    md.kv_len = kv_len.data();
    md.table_start = table_start.data();
    md.slots[0] = slots.data();
    md.block_tables[0] = table.data();
  }
};

struct Cache {
  DType dtype;
  size_t elem;
  std::vector<uint8_t> k, v;
  KvCacheView view;
  Cache(DType t, int32_t n_seqs) : dtype(t), elem(t == DType::kF32 ? 4 : 2) {
    view.row_bytes = static_cast<size_t>(kRow.plane_width()) * elem;
    view.block_shift = kShift;
    view.block_stride = view.row_bytes << kShift;
    view.dtype = t;
    k.assign(view.block_stride * static_cast<size_t>(n_seqs * kBlocksPerSeq), 0);
    v.assign(k.size(), 0);
    view.k = k.data();
    view.v = v.data();
  }
  float at(int32_t slot, int32_t col) const {
    const int32_t plane = kRow.plane_width();
    const uint8_t* p = (col < plane ? k : v).data() + static_cast<size_t>(slot) * view.row_bytes +
                       static_cast<size_t>(col % plane) * elem;
    if (elem == 4) {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    return f16_to_f32(h);
  }
};

void rope_ref(float* x, int32_t pos, const RopeTable& t) {  // pairs (2i, 2i+1)
  for (int64_t i = 0; i < t.rot_dim / 2; ++i) {
    const float a = static_cast<float>(pos) * t.inv_freq[static_cast<size_t>(i)];
    const float c = std::cos(a), s = std::sin(a), x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * c - x1 * s;
    x[2 * i + 1] = x0 * s + x1 * c;
  }
}

struct IndexRun {
  std::vector<float> q, k, w;
  std::vector<int32_t> selected, n_selected;
};

// One lightning_index call over `step` with rows [t0, t0 + n_tokens) of
// the shared inputs (q, k, w from the same seeds whatever the split).
IndexRun index(Backend& b, Rope rope, Cache& cache, const Step& step, int32_t t0, const IndexRun& inputs) {
  const int32_t T = step.md.n_tokens;
  IndexRun r;
  r.q.assign(inputs.q.begin() + t0 * kHeads * kIndex, inputs.q.begin() + (t0 + T) * kHeads * kIndex);
  r.k.assign(inputs.k.begin() + t0 * kIndex, inputs.k.begin() + (t0 + T) * kIndex);
  r.w.assign(inputs.w.begin() + t0 * kHeads, inputs.w.begin() + (t0 + T) * kHeads);
  r.selected.assign(static_cast<size_t>(T * kTopK), -1);
  r.n_selected.assign(static_cast<size_t>(T), -1);
  LightningIndexOp op;
  op.q = Tensor::dense(r.q.data(), DType::kF32, T, kHeads * kIndex);
  op.k = Tensor::dense(r.k.data(), DType::kF32, T, kIndex);
  op.w = Tensor::dense(r.w.data(), DType::kF32, T, kHeads);
  op.n_head = kHeads;
  op.head_dim = kIndex;
  op.rope_dim = kRope;
  op.score_scale = 0.5f;
  op.weight_scale = 0.25f;
  op.rope = rope;
  op.key_col = kRow.index_col();
  op.topk = kTopK;
  op.selected = r.selected.data();
  op.n_selected = r.n_selected.data();
  op.kv = cache.view;
  b.lightning_index(op, step.md);
  return r;
}

class LightningIndex : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    b_ = make_cpu_backend(2);
    ASSERT_TRUE(b_->has_mla_ops());
    table_ = cpu::make_rope_table(10000.0f, kRope, /*interleaved=*/true);
    auto r = b_->place_rope(table_);
    ASSERT_TRUE(r.ok());
    rope_ = *r;
    const size_t T = 64;
    in_.q = integers(T * kHeads * kIndex, 1, -2, 2);
    in_.k = integers(T * kIndex, 2, -2, 2);
    in_.w = integers(T * kHeads, 3, -3, 3);
  }
  std::unique_ptr<Backend> b_;
  RopeTable table_;
  Rope rope_;
  IndexRun in_;
};

TEST_P(LightningIndex, StoresKeysAndSelectsTheTopKByScoreThenTheLaterKey) {
  const Step step({0, 1}, {0, 0}, {13, 3});
  Cache cache(GetParam(), 2);
  const IndexRun r = index(*b_, rope_, cache, step, 0, in_);
  const int32_t T = step.md.n_tokens;
  // Reference keys and queries (rotated), read back from the cache.
  std::vector<std::vector<float>> keys(static_cast<size_t>(T));
  int ties_at_the_cut = 0;
  for (int32_t t = 0; t < T; ++t) {
    std::vector<float> key(in_.k.begin() + t * kIndex, in_.k.begin() + (t + 1) * kIndex);
    rope_ref(key.data(), step.pos[t], table_);
    const int32_t slot = step.slots[static_cast<size_t>(t)];
    for (int32_t c = 0; c < kRow.row_width(); ++c) {
      const float want = c < kRow.index_col() ? 0.0f : key[static_cast<size_t>(c - kRow.index_col())];
      ASSERT_NEAR(cache.at(slot, c), want, GetParam() == DType::kF32 ? 1e-6f : 2e-3f) << "token " << t << " col " << c;
    }
    keys[static_cast<size_t>(t)].resize(kIndex);
    for (int32_t c = 0; c < kIndex; ++c) keys[static_cast<size_t>(t)][c] = cache.at(slot, kRow.index_col() + c);
    for (int32_t h = 0; h < kHeads; ++h) {
      std::vector<float> q(in_.q.begin() + (t * kHeads + h) * kIndex, in_.q.begin() + (t * kHeads + h + 1) * kIndex);
      rope_ref(q.data(), step.pos[t], table_);
      for (int32_t c = 0; c < kIndex; ++c) ASSERT_NEAR(r.q[(t * kHeads + h) * kIndex + c], q[c], 1e-5f);
    }
  }
  for (int32_t t = 0; t < T; ++t) {
    const int32_t s = step.seq_of[t], j0 = step.q_start[s], n_kv = step.pos[t] + 1;
    std::vector<std::pair<float, int32_t>> scored;
    for (int32_t j = 0; j < n_kv; ++j) {
      float total = 0;
      for (int32_t h = 0; h < kHeads; ++h) {
        float dot = 0;
        for (int32_t c = 0; c < kIndex; ++c) dot += r.q[(t * kHeads + h) * kIndex + c] * keys[j0 + j][c];
        total += 0.25f * in_.w[t * kHeads + h] * std::max(0.0f, 0.5f * dot);
      }
      scored.emplace_back(total, j);
    }
    std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second > b.second);
    });
    const int32_t n = std::min(kTopK, n_kv);
    if (n < n_kv && scored[n - 1].first == scored[n].first) ++ties_at_the_cut;
    std::vector<int32_t> want;
    for (int32_t i = 0; i < n; ++i) want.push_back(scored[i].second);
    std::sort(want.begin(), want.end());
    ASSERT_EQ(r.n_selected[t], n) << "token " << t;
    const std::vector<int32_t> got(r.selected.begin() + t * kTopK, r.selected.begin() + t * kTopK + n);
    EXPECT_EQ(got, want) << "token " << t;
  }
  EXPECT_GT(ties_at_the_cut, 0) << "the data must exercise the tie rule";
}

// A sequence's selections do not depend on the other sequences of its step
// nor on whether its earlier tokens were stored by an earlier step.
TEST_P(LightningIndex, SelectionDoesNotDependOnTheStep) {
  Cache together(GetParam(), 2), split(GetParam(), 2);
  const Step both({0, 1}, {0, 0}, {4, 11});
  const IndexRun all = index(*b_, rope_, together, both, 0, in_);
  // Sequence 1 alone, in two steps of 6 and 5 tokens.
  const Step first({1}, {0}, {6}), second({1}, {6}, {5});
  const IndexRun a = index(*b_, rope_, split, first, 4, in_);
  const IndexRun b = index(*b_, rope_, split, second, 10, in_);
  for (int32_t i = 0; i < 11; ++i) {
    const IndexRun& r = i < 6 ? a : b;
    const int32_t ti = i < 6 ? i : i - 6;
    ASSERT_EQ(r.n_selected[ti], all.n_selected[4 + i]) << i;
    for (int32_t j = 0; j < r.n_selected[ti]; ++j)
      EXPECT_EQ(r.selected[ti * kTopK + j], all.selected[(4 + i) * kTopK + j]);
  }
}

// latent_attention over a selection equals the softmax over those keys
// alone; an all-keys selection gives the unselected op's bits.
TEST_P(LightningIndex, LatentAttentionReadsOnlyTheSelectedKeys) {
  const Step step({0}, {0}, {9});
  Cache cache(GetParam(), 1);
  const std::vector<float> rows = integers(cache.k.size() / cache.elem, 7, -3, 3);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (std::vector<uint8_t>* p : {&cache.k, &cache.v}) {
      const float x = rows[i] * (p == &cache.k ? 0.25f : -0.125f);
      if (cache.elem == 4) {
        std::memcpy(p->data() + 4 * i, &x, 4);
      } else {
        const uint16_t h = f32_to_f16(x);
        std::memcpy(p->data() + 2 * i, &h, 2);
      }
    }
  }
  const int32_t T = 9;
  std::vector<float> q_lat = integers(static_cast<size_t>(T * kHeads * kLora), 8, -2, 2);
  std::vector<float> q_rope = integers(static_cast<size_t>(T * kHeads * kRope), 9, -2, 2);
  std::vector<float> plain(q_lat.size()), all(q_lat.size()), some(q_lat.size());
  LatentAttentionOp at;
  at.q_latent = Tensor::dense(q_lat.data(), DType::kF32, T, kHeads * kLora);
  at.q_rope = Tensor::dense(q_rope.data(), DType::kF32, T, kHeads * kRope);
  at.q_rope_step = kRope;
  at.n_head = kHeads;
  at.kv_lora_rank = kLora;
  at.rope_dim = kRope;
  at.scale = 0.5f;
  at.kv = cache.view;
  at.out = Tensor::dense(plain.data(), DType::kF32, T, kHeads * kLora);
  b_->latent_attention(at, step.md);
  std::vector<int32_t> sel(static_cast<size_t>(T * T)), n_sel(static_cast<size_t>(T));
  for (int32_t t = 0; t < T; ++t) {
    n_sel[t] = t + 1;
    for (int32_t j = 0; j <= t; ++j) sel[t * T + j] = j;
  }
  at.selected = sel.data();
  at.n_selected = n_sel.data();
  at.selected_stride = T;
  at.out = Tensor::dense(all.data(), DType::kF32, T, kHeads * kLora);
  b_->latent_attention(at, step.md);
  EXPECT_EQ(all, plain);
  for (int32_t t = 0; t < T; ++t) {  // every other key, the token itself included
    n_sel[t] = 0;
    for (int32_t j = t % 2; j <= t; j += 2) sel[t * T + n_sel[t]++] = j;
  }
  at.out = Tensor::dense(some.data(), DType::kF32, T, kHeads * kLora);
  b_->latent_attention(at, step.md);
  for (int32_t t = 0; t < T; ++t) {
    for (int32_t h = 0; h < kHeads; ++h) {
      std::vector<double> p;
      for (int32_t i = 0; i < n_sel[t]; ++i) {
        const int32_t slot = step.slots[static_cast<size_t>(sel[t * T + i])];
        double dot = 0;
        for (int32_t c = 0; c < kLora; ++c) dot += double(q_lat[(t * kHeads + h) * kLora + c]) * cache.at(slot, c);
        for (int32_t c = 0; c < kRope; ++c)
          dot += double(q_rope[(t * kHeads + h) * kRope + c]) * cache.at(slot, kLora + c);
        p.push_back(0.5 * dot);
      }
      const double m = *std::max_element(p.begin(), p.end());
      double total = 0;
      for (double& x : p) total += (x = std::exp(x - m));
      for (int32_t c = 0; c < kLora; ++c) {
        double o = 0;
        for (int32_t i = 0; i < n_sel[t]; ++i) o += p[i] / total * cache.at(step.slots[sel[t * T + i]], c);
        EXPECT_NEAR(some[(t * kHeads + h) * kLora + c], o, 1e-5) << "token " << t << " head " << h;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, LightningIndex, ::testing::Values(DType::kF32, DType::kF16),
                         [](const auto& info) { return info.param == DType::kF32 ? "f32_kv" : "f16_kv"; });

}  // namespace
}  // namespace rill
