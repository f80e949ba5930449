// The MTP layer of every family that runs one (model/mtp_head.h around the
// family's decoder layer; ModelOptions::mtp, Model::forward_mtp), held to
// tools/make_mtp_golden.py's numpy reference on a tiny checkpoint with a
// seeded MTP layer: the model's greedy pick after the prompt is the
// golden's next_token, and the head's logits (over the model's hidden
// states, or the golden's given rows for Qwen3-Next) at every prompt position
// (t_{p+1} the next prompt token, the last row the model's pick) match,
// whole and fed in two chunks (the MTP layer's KV carried between steps);
// forward_mtp's mtp_hidden is the same with and without logits asked for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/model_files.h"
#include "model/batch.h"
#include "model/registry.h"

namespace rill {
namespace {

void expect_reference_head(const std::string& name) {
  const std::string dir = std::string(RILL_TEST_DATA) + "/" + name;
  std::ifstream in(dir + "/golden.json");
  ASSERT_TRUE(in) << dir;
  const auto gold = nlohmann::json::parse(in);
  const auto prompt = gold["prompt_ids"].get<std::vector<int32_t>>();
  const auto want = gold["mtp_logits"].get<std::vector<std::vector<float>>>();
  const auto n = static_cast<int32_t>(prompt.size());
  auto files = open_model_files(dir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  ModelOptions o;
  o.n_threads = 2;
  o.n_ctx = 64;
  o.max_batch_tokens = 32;
  auto plain = create_model(builtin_registry(), infer_profile(**files), *files, o);
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_EQ((*plain)->n_mtp_layers(), 0) << name;  // bound only when asked for
  o.mtp = true;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, o);
  ASSERT_TRUE(model.ok()) << model.error().message;
  Model& m = **model;
  ASSERT_EQ(m.n_mtp_layers(), 1) << name;
  const int64_t E = m.config().n_embd, V = m.n_vocab();
  const std::vector<int32_t> table = slot_block_table(0, m.n_ctx(), m.kv_block_size());

  Batch b;
  b.add_sequence(prompt.data(), n, 0, true, table);
  const KvSpec& groups = m.kv_spec();
  if (std::any_of(groups.begin(), groups.end(), [](const LayerGroupSpec& g) { return !g.is_attention(); }))
    b.seqs[0].state_slot = 0;  // a hybrid's recurrent state (Qwen3-Next)
  std::vector<float> logits(static_cast<size_t>(V)), hidden(static_cast<size_t>(n * E));
  const Status st = m.forward_hidden(b, logits.data(), hidden.data());
  ASSERT_TRUE(st.ok()) << st.error().message;
  const auto next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  EXPECT_EQ(next, gold["next_token"].get<int32_t>()) << name;
  if (gold.contains("hidden")) {
    // Qwen3-Next (no numpy gated DeltaNet): the golden's head reads given
    // rows. forward_hidden's are the states the LM head reads: its last
    // row through lm_head is the logits row.
    const TensorRef* head = (*files)->find("lm_head.weight");
    ASSERT_TRUE(head != nullptr && head->dtype == DType::kF32) << name;
    const float* wv = reinterpret_cast<const float*>(head->data);
    const float* last = hidden.data() + static_cast<size_t>((n - 1) * E);
    double err = 0;
    for (int64_t v = 0; v < V; ++v) {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += double(wv[v * E + e]) * last[e];
      err = std::max(err, std::fabs(dot - logits[static_cast<size_t>(v)]));
    }
    EXPECT_LT(err, 1e-4) << name << ": forward_hidden's last row is not what the head reads";
    hidden.clear();
    for (const auto& row : gold["hidden"]) {
      for (const auto& x : row) hidden.push_back(x.get<float>());
    }
    ASSERT_EQ(hidden.size(), static_cast<size_t>(n * E)) << name;
  }

  std::vector<int32_t> shifted(prompt.begin() + 1, prompt.end());
  shifted.push_back(next);
  std::vector<float> out_whole;
  for (const int32_t split : {n, 9}) {  // whole, then positions [0, 9), [9, 18), ...
    std::vector<float> got(static_cast<size_t>(n * V)), out(static_cast<size_t>(n * E));
    for (int32_t from = 0; from < n; from += split) {
      const int32_t len = std::min(split, n - from);
      Batch mb;
      mb.add_sequence(shifted.data() + from, len, from, false, table);
      for (int32_t i = 0; i < len; ++i) mb.sample_rows.push_back(i);
      const auto at = static_cast<size_t>(from);
      ASSERT_TRUE(m.forward_mtp(mb, hidden.data() + at * E, got.data() + at * V, out.data() + at * E).ok());
    }
    double err = 0;
    for (int32_t r = 0; r < n; ++r)
      for (int64_t v = 0; v < V; ++v)
        err = std::max(err, std::fabs(double(got[static_cast<size_t>(r * V + v)]) - want[r][v]));
    std::printf("%s: MTP head, chunks of %d: max |logit - numpy reference| = %.3g\n", name.c_str(), split, err);
    EXPECT_LT(err, 1e-4) << name << ": chunks of " << split;
    const auto first_draft = static_cast<int32_t>(std::max_element(got.end() - V, got.end()) - (got.end() - V));
    EXPECT_EQ(first_draft, gold["mtp_greedy"].back().get<int32_t>()) << name << ": chunks of " << split;
    if (out_whole.empty()) {
      out_whole = out;
    } else {
      double d = 0;
      for (size_t i = 0; i < out.size(); ++i) d = std::max(d, std::fabs(double(out[i]) - out_whole[i]));
      EXPECT_LT(d, 1e-5) << name << ": the layer's output depends on the chunking";
    }
  }
}

TEST(MtpHead, DeepSeekV3MatchesTheNumpyReference) {
  expect_reference_head("mtp-deepseek-v3");
}
TEST(MtpHead, Glm4MoeMatchesTheNumpyReference) {
  expect_reference_head("mtp-glm4-moe");
}
// GLM-5 (DSA): the MTP layer selects its keys with its own lightning
// indexer (index_topk 8 of up to 24 keys, so the selection matters).
TEST(MtpHead, Glm5MatchesTheNumpyReference) {
  expect_reference_head("mtp-glm-5");
}
TEST(MtpHead, Qwen3NextMatchesTheNumpyReference) {
  expect_reference_head("mtp-qwen3-next");
}

}  // namespace
}  // namespace rill
