// Attention with sink logits (gpt-oss; AttentionParams::sinks): per head the
// softmax denominator also holds exp(sink), which adds no value; held to a
// direct double-precision reference, with a sliding window, GQA, sinks far
// above and below the scores (a query whose sink dominates gets a near-zero
// output), and on every ISA's attention row.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/paged_kv.h"
#include "core/thread_pool.h"
#include "quant_test_util.h"

namespace rill::cpu {
namespace {

// out [n_q, n_head, hd] of queries at positions pos[i] over keys 0..n_kv-1 (f32 rows).
std::vector<double> reference(const std::vector<float>& q, const std::vector<int32_t>& pos, const std::vector<float>& k,
                              const std::vector<float>& v, const AttentionParams& p) {
  const int64_t hd = p.head_dim, H = p.n_head, G = p.n_head / p.n_head_kv, kvw = p.n_head_kv * hd;
  std::vector<double> out(q.size());
  for (size_t i = 0; i < pos.size(); ++i) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t lo = p.window > 0 ? std::max<int64_t>(0, pos[i] - p.window + 1) : 0;
      std::vector<double> s;
      double mx = p.sinks ? p.sinks[h] : -INFINITY;
      for (int64_t j = lo; j <= pos[i]; ++j) {
        double d = 0;
        for (int64_t c = 0; c < hd; ++c) d += double(q[(i * H + h) * hd + c]) * k[j * kvw + (h / G) * hd + c];
        s.push_back(d * p.scale);
        mx = std::max(mx, s.back());
      }
      double z = p.sinks ? std::exp(p.sinks[h] - mx) : 0.0;
      for (double x : s) z += std::exp(x - mx);
      for (int64_t c = 0; c < hd; ++c) {
        double acc = 0;
        for (size_t t = 0; t < s.size(); ++t)
          acc += std::exp(s[t] - mx) / z * v[(lo + int64_t(t)) * kvw + (h / G) * hd + c];
        out[(i * H + h) * hd + c] = acc;
      }
    }
  }
  return out;
}

TEST(AttentionSinks, MatchTheReferenceOnEveryIsa) {
  constexpr int64_t kHd = 16, kHeads = 4, kKvHeads = 2, kKv = 70;
  const auto k = testing::random_floats(kKv * kKvHeads * kHd, 1, -1.0f, 1.0f);
  const auto v = testing::random_floats(kKv * kKvHeads * kHd, 2, -1.0f, 1.0f);
  const std::vector<int32_t> pos = {0, 5, 31, 64, 69};
  const auto q = testing::random_floats(static_cast<int64_t>(pos.size()) * kHeads * kHd, 3, -2.0f, 2.0f);
  const float sinks[kHeads] = {0.3f, -2.0f, 40.0f, -60.0f};  // ordinary, low, dominating, vanishing
  const PagedKv kv = make_contiguous_kv(k.data(), v.data(), kKvHeads * kHd * sizeof(float));
  ThreadPool pool(2);
  for (int64_t window : {0, 8}) {
    AttentionParams p;
    p.n_head = kHeads;
    p.n_head_kv = kKvHeads;
    p.head_dim = kHd;
    p.scale = 0.25f;
    p.window = window;
    p.sinks = sinks;
    const auto want = reference(q, pos, k, v, p);
    AttentionParams plain = p;
    plain.sinks = nullptr;
    const auto no_sink = reference(q, pos, k, v, plain);
    for (Isa isa : testing::available_isas()) {
      std::vector<float> out(q.size());
      for (size_t i = 0; i < pos.size(); ++i) {
        for (int64_t h = 0; h < kHeads; ++h) {
          AttendRowArgs a;
          a.q = q.data() + (i * kHeads + h) * kHd;
          a.kv = kv;
          a.kv.k += (h / 2) * kHd * sizeof(float);
          a.kv.v += (h / 2) * kHd * sizeof(float);
          a.head_dim = kHd;
          a.j_begin = window > 0 ? std::max<int64_t>(0, pos[i] - window + 1) : 0;
          a.j_end = pos[i] + 1;
          a.scale = p.scale;
          a.has_sink = true;
          a.sink = sinks[h];
          a.out = out.data() + (i * kHeads + h) * kHd;
          kernels(isa).attend_row(a);
        }
      }
      for (size_t e = 0; e < out.size(); ++e) ASSERT_NEAR(out[e], want[e], 2e-6) << "isa " << int(isa) << " at " << e;
    }
    // Through attention() (the sinks pointer per head).
    std::vector<float> out(q.size());
    attention(q.data(), pos.data(), static_cast<int64_t>(pos.size()), kv, kKv, p, out.data(), pool);
    double max_sink_effect = 0;
    for (size_t e = 0; e < out.size(); ++e) {
      ASSERT_NEAR(out[e], want[e], 2e-6) << "attention() at " << e;
      max_sink_effect = std::max(max_sink_effect, std::fabs(want[e] - no_sink[e]));
    }
    EXPECT_GT(max_sink_effect, 0.1) << "the sinks must change the result";
    // Head 2's sink (40) dominates every score: its outputs are near zero.
    for (size_t i = 0; i < pos.size(); ++i)
      for (int64_t c = 0; c < kHd; ++c) EXPECT_LT(std::fabs(out[(i * kHeads + 2) * kHd + c]), 1e-6);
  }
}

}  // namespace
}  // namespace rill::cpu
