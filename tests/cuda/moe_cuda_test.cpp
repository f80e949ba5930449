// The CUDA Mixtral and Qwen3-MoE (llama_cuda.cpp with model/cuda_moe.h)
// against Hugging Face and the CPU:
//  - ../shared/goldens/hf/{mixtral, qwen3-moe} (f32 weights): logits within
//    1e-3 of transformers at every prompt position (prefilled in chunks of
//    7 tokens) and the greedy continuation identical;
//  - the same models in bf16: GPU against CPU within bf16 error (3% of the
//    largest |logit|), prefill through the grouped per-expert GEMMs;
//  - the engine, three greedy requests at once, ids picked on the device;
//  - batch invariance (f32): a decode row's logits bit-identical alone and
//    beside 39 other sequences (80 routed pairs over 4 or 8 experts: every
//    expert serves several tokens, most more than 8), and a prompt's logits
//    identical whether it is prefilled alone or beside another prompt.
// RILL_SHARED_DIR in the environment overrides the build-time path.
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/half.h"
#include "engine/sequence_runner.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "rill/engine.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"

namespace rill {
namespace {

ModelOptions options(Device d) {
  ModelOptions o;
  o.device = d;
  o.n_threads = 2;
  o.n_ctx = 256;
  o.max_batch_tokens = 7;  // chunked prefill over the 24-token prompt
  return o;
}

class CudaMoeHf : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    RILL_REQUIRE_GPU();
    dir_ = test::hf_golden_dir(GetParam());
    if (!std::filesystem::exists(dir_ + "/golden.json")) GTEST_SKIP() << dir_ << " not found";
  }
  std::string dir_;
};

TEST_P(CudaMoeHf, LogitsAndGreedyMatchTransformers) {
  const test::HfGolden g = test::read_hf_golden(dir_);
  auto files = open_model_files(dir_);
  ASSERT_TRUE(files.ok()) << files.error().message;
  ASSERT_GT((*files)->config.n_expert, 0);
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, options(Device::kCuda));
  ASSERT_TRUE(model.ok()) << model.error().message;
  SequenceRunner runner(**model);
  auto logits = runner.score(g.prompt_ids);
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  const double max_err = test::max_golden_error((*logits), g);
  EXPECT_LT(max_err, 1e-3) << GetParam() << ": max |logit - reference| = " << max_err;
  std::printf("[ cuda moe hf ] %s: max |logit - transformers| = %.3g\n", GetParam().c_str(), max_err);

  runner.reset();
  GenerationOptions go;
  go.max_tokens = static_cast<int>(g.greedy_ids.size());
  go.ignore_eos = true;
  go.sampling.temperature = 0;
  auto gen = runner.generate(g.prompt_ids, go, [](int32_t) { return true; });
  ASSERT_TRUE(gen.ok()) << gen.error().message;
  EXPECT_EQ(gen->ids, g.greedy_ids) << GetParam();
}

TEST_P(CudaMoeHf, Bf16WeightsMatchTheCpuWithinBf16Error) {
  const test::HfGolden g = test::read_hf_golden(dir_);
  std::vector<std::vector<uint16_t>> store;
  auto files = open_model_files(dir_);
  ASSERT_TRUE(files.ok()) << files.error().message;
  test::to_bf16(**files, store);
  auto cpu = create_model(builtin_registry(), infer_profile(**files), *files, options(Device::kCpu));
  auto gpu = create_model(builtin_registry(), infer_profile(**files), *files, options(Device::kCuda));
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  SequenceRunner rc(**cpu), rg(**gpu);
  auto lc = rc.score(g.prompt_ids);
  auto lg = rg.score(g.prompt_ids);
  ASSERT_TRUE(lc.ok() && lg.ok());
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < lc->size(); ++i) {
    max_err = std::max(max_err, std::fabs(double((*lc)[i]) - (*lg)[i]));
    max_ref = std::max(max_ref, std::fabs(double((*lc)[i])));
  }
  EXPECT_LT(max_err, 0.03 * max_ref) << GetParam();
  std::printf("[ cuda moe bf16 ] %s: max |gpu - cpu| = %.3g (max |logit| %.3g)\n", GetParam().c_str(), max_err,
              max_ref);
}

TEST_P(CudaMoeHf, EngineGreedyOnTheDeviceGivesTheGoldenTokens) {
  const test::HfGolden g = test::read_hf_golden(dir_);
  auto files = open_model_files(dir_);
  ASSERT_TRUE(files.ok()) << files.error().message;
  ModelOptions o = options(Device::kCuda);
  o.n_kv_slots = 4;
  o.max_batch_tokens = 64;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, o);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto engine = Engine::create(std::move(model).value(), nullptr, EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  test::expect_greedy_prefixes(**engine, g, 3, GetParam());
}

// Decode logits of sequence 0 alone and beside 39 others (same KV), over
// several steps (the first runs eagerly, later ones replay a CUDA graph);
// then prompt logits alone and batched with another prompt.
TEST_P(CudaMoeHf, DecodeAndPrefillAreBatchInvariant) {
  auto files = open_model_files(dir_);
  ASSERT_TRUE(files.ok()) << files.error().message;
  constexpr int32_t kSeqs = 40;
  ModelOptions o = options(Device::kCuda);
  o.n_kv_slots = kSeqs + 2;
  o.max_batch_tokens = 256;
  o.max_batch_seqs = 64;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, o);
  ASSERT_TRUE(model.ok()) << model.error().message;
  Model& m = **model;
  const int64_t V = m.n_vocab();
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> len;
  Batch b;
  std::vector<float> logits(static_cast<size_t>(kSeqs * V));
  for (int32_t s = 0; s < kSeqs; ++s) {
    tables.push_back(slot_block_table(s, m.n_ctx(), m.kv_block_size()));
    std::vector<int32_t> ids(static_cast<size_t>(6 + (s * 5) % 23));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + s * 11) % V);
    b.clear();
    b.add_sequence(ids.data(), static_cast<int32_t>(ids.size()), 0, true, tables.back());
    ASSERT_TRUE(m.forward(b, logits.data()).ok());
    len.push_back(static_cast<int32_t>(ids.size()));
  }
  // Each step: row 0 alone at position p, then all rows, row 0 again at p
  // (rewriting the same K/V).
  int n_diff = 0;
  std::vector<float> alone(static_cast<size_t>(V));
  for (int step = 0; step < 3; ++step) {
    const int32_t tok0 = 5 + step;
    b.clear();
    b.add_sequence(&tok0, 1, len[0], true, tables[0]);
    ASSERT_TRUE(m.forward(b, alone.data()).ok());
    std::vector<int32_t> toks(kSeqs);
    b.clear();
    for (int32_t s = 0; s < kSeqs; ++s) {
      toks[static_cast<size_t>(s)] = s == 0 ? tok0 : static_cast<int32_t>((s * 13 + step) % V);
      b.add_sequence(&toks[static_cast<size_t>(s)], 1, len[static_cast<size_t>(s)], true,
                     tables[static_cast<size_t>(s)]);
    }
    ASSERT_TRUE(m.forward(b, logits.data()).ok());
    for (int64_t i = 0; i < V; ++i) n_diff += alone[static_cast<size_t>(i)] != logits[static_cast<size_t>(i)];
    for (int32_t& l : len) ++l;
  }
  EXPECT_EQ(n_diff, 0) << GetParam() << ": decode logits of row 0 differ alone vs. beside " << kSeqs - 1 << " rows";

  // Prefill: a 20-token prompt in slot kSeqs alone, then beside a 30-token one.
  std::vector<int32_t> p1(20), p2(30);
  for (size_t i = 0; i < p1.size(); ++i) p1[i] = static_cast<int32_t>((i * 7 + 3) % V);
  for (size_t i = 0; i < p2.size(); ++i) p2[i] = static_cast<int32_t>((i * 5 + 1) % V);
  const auto t1 = slot_block_table(kSeqs, m.n_ctx(), m.kv_block_size());
  const auto t2 = slot_block_table(kSeqs + 1, m.n_ctx(), m.kv_block_size());
  b.clear();
  b.add_sequence(p1.data(), 20, 0, true, t1);
  ASSERT_TRUE(m.forward(b, alone.data()).ok());
  b.clear();
  b.add_sequence(p2.data(), 30, 0, true, t2);
  b.add_sequence(p1.data(), 20, 0, true, t1);
  ASSERT_TRUE(m.forward(b, logits.data()).ok());
  n_diff = 0;
  for (int64_t i = 0; i < V; ++i) n_diff += alone[static_cast<size_t>(i)] != logits[static_cast<size_t>(V + i)];
  EXPECT_EQ(n_diff, 0) << GetParam() << ": prompt logits differ alone vs. beside another prompt";
}

INSTANTIATE_TEST_SUITE_P(MoeFamily, CudaMoeHf, ::testing::Values("mixtral", "qwen3-moe"), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n) if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
});

}  // namespace
}  // namespace rill
