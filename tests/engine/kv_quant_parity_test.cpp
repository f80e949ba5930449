// Quantized KV (issue 22) on the HF goldens (../shared/goldens/hf): with
// q8_0 K and V the greedy continuation is the reference's wherever the
// reference's top-2 gap exceeds q8_0's logit error, and the logits stay
// within a stated bound of f16 KV's. Also: the per-type logit error grows
// as the bits shrink, and the rotated 4-bit type beats plain q4_0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/sequence_runner.h"
#include "golden_util.h"
#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

// Teacher-forced logits of prompt + greedy under `kv` types.
std::vector<float> score(const std::string& dir, const std::vector<int32_t>& ids, const char* kv) {
  auto files = open_model_files(dir);
  EXPECT_TRUE(files.ok());
  ModelOptions opts;
  opts.n_threads = 2;
  opts.n_ctx = 256;
  opts.max_batch_tokens = 7;  // chunked prefill
  opts.kv_types.k = opts.kv_types.v = parse_kv_type(kv);
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, opts);
  EXPECT_TRUE(model.ok()) << model.error().message;
  if (!model.ok()) return {};
  SequenceRunner runner(**model);
  auto logits = runner.score(ids);
  EXPECT_TRUE(logits.ok()) << logits.error().message;
  return logits.ok() ? *logits : std::vector<float>{};
}

struct Top2 {
  int32_t id;
  float gap;
};
Top2 top2(const float* row, size_t n) {
  size_t best = 0;
  for (size_t i = 1; i < n; ++i) best = row[i] > row[best] ? i : best;
  float second = -INFINITY;
  for (size_t i = 0; i < n; ++i) {
    if (i != best) second = std::max(second, row[i]);
  }
  return {static_cast<int32_t>(best), row[best] - second};
}

constexpr float kQ8LogitBound = 0.05f;  // max |logit(q8_0 KV) - logit(f16 KV)| on these models (measured <= 0.039)
constexpr float kGap = 2 * kQ8LogitBound;

class KvQuantParity : public ::testing::TestWithParam<std::string> {};

TEST_P(KvQuantParity, Q8_0GreedyMatchesWhereTheGapAllows) {
  const std::string dir = test::hf_golden_dir(GetParam());
  if (!test::has_hf_golden(dir)) GTEST_SKIP() << dir << " not found";
  const test::HfGolden g = test::read_hf_golden(dir);
  std::vector<int32_t> ids = g.prompt_ids;
  ids.insert(ids.end(), g.greedy_ids.begin(), g.greedy_ids.end());
  const std::vector<float> f16 = score(dir, ids, "f16"), q8 = score(dir, ids, "q8_0");
  ASSERT_EQ(f16.size(), q8.size());
  ASSERT_FALSE(f16.empty());
  const size_t V = f16.size() / ids.size();
  float max_err = 0;
  for (size_t i = 0; i < f16.size(); ++i) max_err = std::max(max_err, std::fabs(f16[i] - q8[i]));
  EXPECT_LT(max_err, kQ8LogitBound) << GetParam();
  // Position p predicts greedy_ids[k], p = prompt + k - 1.
  int checked = 0;
  for (size_t k = 0; k < g.greedy_ids.size(); ++k) {
    const size_t p = g.prompt_ids.size() + k - 1;
    const Top2 ref = top2(f16.data() + p * V, V);
    if (ref.gap <= kGap) continue;
    ++checked;
    EXPECT_EQ(ref.id, g.greedy_ids[k]) << "f16 KV at step " << k;
    EXPECT_EQ(top2(q8.data() + p * V, V).id, g.greedy_ids[k]) << "q8_0 KV at step " << k << " (gap " << ref.gap << ")";
  }
  EXPECT_GE(checked * 3, static_cast<int>(g.greedy_ids.size())) << "a third of the steps have a usable gap";
}

// The logit error of each type against f16 KV, within per-type bounds (about
// twice what was measured) and ordered by bits. These random-weight models
// have no outlier channels in K, so the rotation has nothing to spread here:
// q4_0h and iq4_nlh are held to q4_0's bound (its gain is tested on outlier-channel K in
// tests/backend/kv_quant_test.cpp and measured on the default model in
// docs/perf.md).
TEST_P(KvQuantParity, LogitErrorPerType) {
  const std::string dir = test::hf_golden_dir(GetParam());
  if (!test::has_hf_golden(dir)) GTEST_SKIP() << dir << " not found";
  const test::HfGolden g = test::read_hf_golden(dir);
  const std::vector<float> f16 = score(dir, g.prompt_ids, "f16");
  ASSERT_FALSE(f16.empty());
  auto rms_err = [&](const char* kv) {
    const std::vector<float> x = score(dir, g.prompt_ids, kv);
    double s = 0;
    for (size_t i = 0; i < x.size(); ++i) s += (double{x[i]} - f16[i]) * (double{x[i]} - f16[i]);
    return std::sqrt(s / static_cast<double>(x.size()));
  };
  const double e_bf16 = rms_err("bf16"), e_q8 = rms_err("q8_0"), e_q5 = rms_err("q5_0"), e_q4 = rms_err("q4_0"),
               e_q4h = rms_err("q4_0h"), e_nlh = rms_err("iq4_nlh"), e_f8 = rms_err("fp8");
  std::printf(
      "%s rms logit error vs f16 KV: bf16 %.2e q8_0 %.2e q5_0 %.2e q4_0 %.2e q4_0h %.2e iq4_nlh %.2e fp8 %.2e\n",
      GetParam().c_str(), e_bf16, e_q8, e_q5, e_q4, e_q4h, e_nlh, e_f8);
  EXPECT_LT(e_q8, e_q5);
  EXPECT_LT(e_q5, e_q4);
  EXPECT_LT(e_bf16, e_q8);
  EXPECT_LT(e_q8, 0.015);
  EXPECT_LT(e_q5, 0.1);
  EXPECT_LT(e_q4, 0.25);
  EXPECT_LT(e_q4h, 0.25);
  EXPECT_LT(e_nlh, 0.25);  // q4_0h's bytes with iq4_nl's levels: held to the same bound
  // fp8 (e4m3, no scale): 3 mantissa bits, between q8_0 and q4_0
  // (measured 0.023-0.036, q5_0's 0.044-0.045).
  EXPECT_LT(e_q8, e_f8);
  EXPECT_LT(e_f8, e_q4);
}

INSTANTIATE_TEST_SUITE_P(Families, KvQuantParity, ::testing::Values("llama", "qwen3", "gemma3"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace rill
