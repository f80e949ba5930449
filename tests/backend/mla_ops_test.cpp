// The CPU Backend's multi-head latent attention ops against the attention
// they stand for, written out naively: per head K = [W_uk c_j | r_j], V =
// W_uv c_j, q = [q_nope | q_rope], softmax(scale q.K) V. The absorbed form
// (matmul_heads through W_uk^T, latent_attention over the stored rows,
// matmul_heads through W_uv) must give the same per-head output, over f32
// KV (1e-5 relative) and f16 KV (the stored rows rounded: 2e-3);
// rope_store_latent must store [rms_norm(c) w | rope(r)] split over the K
// and V planes and rotate only q's rope dims; and a token's output must not
// depend on the other sequences of its step.
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

constexpr int32_t kHeads = 3, kNope = 6, kRope = 4, kLora = 10, kV = 5, kQk = kNope + kRope;
constexpr int32_t kBlock = 4, kShift = 2;

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Rotates x[0, n) at position pos as the table says (pairs (2i, 2i+1)).
void rope_ref(float* x, int32_t pos, const RopeTable& t) {
  for (int64_t i = 0; i < t.rot_dim / 2; ++i) {
    const float a = static_cast<float>(pos) * t.inv_freq[static_cast<size_t>(i)];
    const float c = std::cos(a), s = std::sin(a), x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * c - x1 * s;
    x[2 * i + 1] = x0 * s + x1 * c;
  }
}

// Sequences of the given lengths, every token new in this step (prefill
// from position 0), each with its own blocks in one table.
struct Step {
  std::vector<int32_t> pos, seq_of, q_start, q_len, kv_len, table_start, slots, table;
  StepMetadata md;

  explicit Step(const std::vector<int32_t>& lens) {
    int32_t t0 = 0, next_block = 0;
    for (size_t s = 0; s < lens.size(); ++s) {
      q_start.push_back(t0);
      q_len.push_back(lens[s]);
      kv_len.push_back(lens[s]);
      table_start.push_back(static_cast<int32_t>(table.size()));
      const int32_t first = next_block;
      for (int32_t b = 0; b < (lens[s] + kBlock - 1) / kBlock; ++b) table.push_back(next_block++);
      for (int32_t i = 0; i < lens[s]; ++i) {
        pos.push_back(i);
        seq_of.push_back(static_cast<int32_t>(s));
        slots.push_back(((first + (i >> kShift)) << kShift) + (i & (kBlock - 1)));
      }
      t0 += lens[s];
    }
    md.n_tokens = t0;
    md.n_seqs = static_cast<int32_t>(lens.size());
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
  LatentKvRow row{kLora, kRope};
  DType dtype;
  std::vector<uint8_t> k, v;
  KvCacheView view;
  Cache(DType t, int32_t n_blocks) : dtype(t) {
    const size_t elem = t == DType::kF32 ? 4 : 2;
    view.row_bytes = static_cast<size_t>(row.plane_width()) * elem;
    view.block_shift = kShift;
    view.block_stride = view.row_bytes << kShift;
    view.dtype = t;
    k.assign(view.block_stride * static_cast<size_t>(n_blocks), 0);
    v.assign(k.size(), 0);
    view.k = k.data();
    view.v = v.data();
  }
  // The stored row of a slot, as f32.
  std::vector<float> read(int32_t slot) const {
    const size_t elem = dtype == DType::kF32 ? 4 : 2, plane = view.row_bytes / elem;
    std::vector<float> out;
    for (const std::vector<uint8_t>* p : {&k, &v}) {
      const uint8_t* base = p->data() + static_cast<size_t>(slot) * view.row_bytes;
      for (size_t i = 0; i < plane; ++i) {
        if (elem == 4) {
          float x;
          std::memcpy(&x, base + 4 * i, 4);
          out.push_back(x);
        } else {
          uint16_t h;
          std::memcpy(&h, base + 2 * i, 2);
          out.push_back(f16_to_f32(h));
        }
      }
    }
    return out;
  }
};

class MlaOps : public ::testing::TestWithParam<DType> {};

TEST_P(MlaOps, AbsorbedAttentionMatchesTheExpandedForm) {
  const DType kv_dtype = GetParam();
  auto b = make_cpu_backend(2);
  ASSERT_TRUE(b->has_mla_ops());
  const Step step({5, 9, 1});
  const int32_t T = step.md.n_tokens;
  // kv_b [H (nope + v), lora] as the checkpoint holds it, and its two parts.
  const std::vector<float> kv_b = random_vec(static_cast<size_t>(kHeads * (kNope + kV) * kLora), 1, 0.5f);
  std::vector<float> wk_t(static_cast<size_t>(kHeads * kLora * kNope)), wv(static_cast<size_t>(kHeads * kV * kLora));
  auto kvb = [&](int32_t h, int32_t r, int32_t c) {
    return kv_b[static_cast<size_t>((h * (kNope + kV) + r) * kLora + c)];
  };
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int32_t c = 0; c < kLora; ++c)
      for (int32_t d = 0; d < kNope; ++d) wk_t[static_cast<size_t>((h * kLora + c) * kNope + d)] = kvb(h, d, c);
    for (int32_t d = 0; d < kV; ++d)
      for (int32_t c = 0; c < kLora; ++c) wv[static_cast<size_t>((h * kV + d) * kLora + c)] = kvb(h, kNope + d, c);
  }
  const HostMatrix mk{wk_t.data(), DType::kF32, kHeads * kLora, kNope, kNope * 4};
  const HostMatrix mv{wv.data(), DType::kF32, kHeads * kV, kLora, kLora * 4};
  auto pk = b->place(&mk, 1, "wk_t");
  auto pv = b->place(&mv, 1, "wv");
  ASSERT_TRUE(pk.ok() && pv.ok());
  const std::vector<float> norm_w = random_vec(kLora, 2, 1.0f);
  auto norm = b->place_vector(norm_w.data(), kLora, "kv_norm");
  const RopeTable table = cpu::make_rope_table(10000.0f, kRope, /*interleaved=*/true);
  auto rope = b->place_rope(table);
  ASSERT_TRUE(norm.ok() && rope.ok());
  StepLimits lim;
  lim.max_tokens = T;
  lim.max_head_cols = kLora;
  ASSERT_TRUE(b->reserve(lim).ok());

  std::vector<float> q = random_vec(static_cast<size_t>(T * kHeads * kQk), 3);
  std::vector<float> kv = random_vec(static_cast<size_t>(T * (kLora + kRope)), 4);
  const std::vector<float> q0 = q, kv0 = kv;
  Cache cache(kv_dtype, static_cast<int32_t>(step.table.size()));
  LatentKvOp st;
  st.q = Tensor::dense(q.data(), DType::kF32, T, kHeads * kQk);
  st.kv = Tensor::dense(kv.data(), DType::kF32, T, kLora + kRope);
  st.n_head = kHeads;
  st.q_head_dim = kQk;
  st.q_rope_col = kNope;
  st.kv_lora_rank = kLora;
  st.rope_dim = kRope;
  st.kv_norm = *norm;
  st.rope = *rope;
  st.kv_cache = cache.view;
  b->rope_store_latent(st, step.md);

  // The stored rows and q as the reference computes them.
  const float tol_store = kv_dtype == DType::kF32 ? 1e-6f : 2e-3f;
  std::vector<std::vector<float>> c_ref(static_cast<size_t>(T)), r_ref(static_cast<size_t>(T));
  std::vector<float> q_ref = q0;
  for (int32_t t = 0; t < T; ++t) {
    const float* row = kv0.data() + static_cast<size_t>(t) * (kLora + kRope);
    double ss = 0;
    for (int32_t i = 0; i < kLora; ++i) ss += double(row[i]) * row[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / kLora + 1e-6));
    for (int32_t i = 0; i < kLora; ++i) c_ref[t].push_back(row[i] * inv * norm_w[static_cast<size_t>(i)]);
    r_ref[t].assign(row + kLora, row + kLora + kRope);
    rope_ref(r_ref[t].data(), step.pos[t], table);
    for (int32_t h = 0; h < kHeads; ++h) rope_ref(q_ref.data() + (t * kHeads + h) * kQk + kNope, step.pos[t], table);
    const std::vector<float> stored = cache.read(step.slots[static_cast<size_t>(t)]);
    ASSERT_EQ(stored.size(), 2u * static_cast<size_t>(cache.row.plane_width()));
    for (int32_t i = 0; i < kLora; ++i) EXPECT_NEAR(stored[i], c_ref[t][i], tol_store) << "latent " << t << "," << i;
    for (int32_t i = 0; i < kRope; ++i) EXPECT_NEAR(stored[kLora + i], r_ref[t][i], tol_store) << "rope key " << t;
  }
  for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(q[i], q_ref[i], 1e-6f) << "q " << i;

  // Absorbed: q_lat = W_uk^T q_nope, attention over the latents, W_uv.
  std::vector<float> q_lat(static_cast<size_t>(T * kHeads * kLora)), lat(q_lat.size());
  std::vector<float> out(static_cast<size_t>(T * kHeads * kV));
  const Tensor qt = Tensor::dense(q.data(), DType::kF32, T, kHeads * kQk);
  b->matmul_heads(*pk, kHeads, qt, kQk, Tensor::dense(q_lat.data(), DType::kF32, T, kHeads * kLora), kLora);
  LatentAttentionOp at;
  at.q_latent = Tensor::dense(q_lat.data(), DType::kF32, T, kHeads * kLora);
  at.q_rope = qt.cols_from(kNope, kHeads * kQk - kNope);
  at.q_rope_step = kQk;
  at.out = Tensor::dense(lat.data(), DType::kF32, T, kHeads * kLora);
  at.n_head = kHeads;
  at.kv_lora_rank = kLora;
  at.rope_dim = kRope;
  at.scale = 0.3f;
  at.kv = cache.view;
  b->latent_attention(at, step.md);
  b->matmul_heads(*pv, kHeads, at.out, kLora, Tensor::dense(out.data(), DType::kF32, T, kHeads * kV), kV);

  // Expanded, in double, from the exact (unrounded) rows.
  std::vector<float> ref(out.size());
  for (int32_t t = 0; t < T; ++t) {
    const int32_t s = step.seq_of[static_cast<size_t>(t)], j0 = step.q_start[static_cast<size_t>(s)];
    for (int32_t h = 0; h < kHeads; ++h) {
      const float* qh = q_ref.data() + (t * kHeads + h) * kQk;
      std::vector<double> p;
      for (int32_t j = 0; j <= step.pos[static_cast<size_t>(t)]; ++j) {
        double dot = 0;
        for (int32_t d = 0; d < kNope; ++d) {
          double k = 0;
          for (int32_t c = 0; c < kLora; ++c) k += double(kvb(h, d, c)) * c_ref[j0 + j][c];
          dot += qh[d] * k;
        }
        for (int32_t d = 0; d < kRope; ++d) dot += double(qh[kNope + d]) * r_ref[j0 + j][d];
        p.push_back(0.3 * dot);
      }
      const double m = *std::max_element(p.begin(), p.end());
      double total = 0;
      for (double& x : p) total += (x = std::exp(x - m));
      for (int32_t d = 0; d < kV; ++d) {
        double o = 0;
        for (size_t j = 0; j < p.size(); ++j) {
          double v = 0;
          for (int32_t c = 0; c < kLora; ++c) v += double(kvb(h, kNope + d, c)) * c_ref[j0 + j][c];
          o += p[j] / total * v;
        }
        ref[static_cast<size_t>((t * kHeads + h) * kV + d)] = static_cast<float>(o);
      }
    }
  }
  const float tol = (kv_dtype == DType::kF32 ? 1e-5f : 2e-3f) * max_abs(ref);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref[i], tol) << "output " << i;
}

// A sequence's outputs do not depend on the other sequences of its step.
TEST_P(MlaOps, LatentAttentionIsBatchInvariant) {
  const DType kv_dtype = GetParam();
  auto b = make_cpu_backend(2);
  const Step together({7, 3, 6}), alone({3});
  Cache cache(kv_dtype, static_cast<int32_t>(together.table.size()));
  // Fill every slot with a random row (as rope_store_latent would leave it).
  const std::vector<float> rows = random_vec(cache.k.size(), 9);
  const size_t elem = kv_dtype == DType::kF32 ? 4 : 2;
  for (size_t i = 0; i < cache.k.size() / elem; ++i) {
    for (std::vector<uint8_t>* p : {&cache.k, &cache.v}) {
      const float x = rows[i % rows.size()] * (p == &cache.k ? 1.0f : -0.5f);
      if (elem == 4) {
        std::memcpy(p->data() + 4 * i, &x, 4);
      } else {
        const uint16_t h = f32_to_f16(x);
        std::memcpy(p->data() + 2 * i, &h, 2);
      }
    }
  }
  const int32_t T = together.md.n_tokens;
  std::vector<float> q_lat = random_vec(static_cast<size_t>(T * kHeads * kLora), 5);
  std::vector<float> q_rope = random_vec(static_cast<size_t>(T * kHeads * kRope), 6);
  std::vector<float> out(q_lat.size());
  LatentAttentionOp at;
  at.q_latent = Tensor::dense(q_lat.data(), DType::kF32, T, kHeads * kLora);
  at.q_rope = Tensor::dense(q_rope.data(), DType::kF32, T, kHeads * kRope);
  at.q_rope_step = kRope;
  at.out = Tensor::dense(out.data(), DType::kF32, T, kHeads * kLora);
  at.n_head = kHeads;
  at.kv_lora_rank = kLora;
  at.rope_dim = kRope;
  at.scale = 0.5f;
  at.kv = cache.view;
  b->latent_attention(at, together.md);
  // The second sequence (tokens 7..9, blocks 2) alone: its table starts at block 2.
  Step one = alone;
  for (int32_t& blk : one.table) blk += together.table[static_cast<size_t>(together.table_start[1])];
  one.md.block_tables[0] = one.table.data();
  std::vector<float> out1(static_cast<size_t>(3 * kHeads * kLora));
  at.q_latent = at.q_latent.rows_from(7, 3);
  at.q_rope = at.q_rope.rows_from(7, 3);
  at.out = Tensor::dense(out1.data(), DType::kF32, 3, kHeads * kLora);
  b->latent_attention(at, one.md);
  for (size_t i = 0; i < out1.size(); ++i) ASSERT_EQ(out1[i], out[7 * kHeads * kLora + i]) << i;
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, MlaOps, ::testing::Values(DType::kF32, DType::kF16),
                         [](const auto& info) { return info.param == DType::kF32 ? "f32_kv" : "f16_kv"; });

}  // namespace
}  // namespace rill
