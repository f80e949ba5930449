// MiniCPM 1/2/4 (`minicpm`: model/arch/llama.cpp's graph with the muP
// scales of model/mup_scales.h) on the CUDA Backend, against the float64
// numpy reference of tools/make_minicpm_golden.py, the CPU model and
// llama.cpp, on the tiny checkpoints tests/data/minicpm (own lm_head),
// tests/data/minicpm-tied and tests/data/minicpm-longrope (MiniCPM 4's
// LongRoPE short factors), KV blocks of 4:
//  - f32 weights: logits within 1e-3 of the reference with the prompt whole
//    and in chunks of 7, 5 and 1 (prefill steps, decode steps, decode
//    graphs), the greedy continuation identical, alone and through the
//    engine (three requests at once, ids picked on the device);
//  - the CPU model and the CUDA model agree within 2e-4 on every logit;
//  - bf16 weights (bf16 activations: the scaled attention output, GLU
//    output and final rows go through their F32 copies, LlamaActivations'
//    attn32 / mlp32 / final32) against the CPU over the same weights within
//    5% of the largest |logit|;
//  - batch invariance with scattered block tables: two sequences batched
//    give, bit for bit, the logits each gives alone (a decode step in the
//    default mode; a prefill step and a decode step in the batch-invariant
//    mode, where the prompt in chunks of 5 also gives the bits of the
//    prompt whole);
//  - llama.cpp's GGUF layout (tests/data/gguf_families/minicpm*.gguf, by
//    tools/make_family_gguf.py) gives llama.cpp's logits within 1e-4 and
//    its greedy ids.
// RILL_TEST_DATA in the environment overrides the build-time path. Skipped
// without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "engine/sequence_runner.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "rill/engine.h"

namespace rill {
namespace {

ModelOptions options(Device d, int max_batch_tokens = 7) {
  ModelOptions o;
  o.device = d;
  o.n_threads = 2;
  o.n_ctx = 64;
  o.max_batch_tokens = max_batch_tokens;
  o.kv_block_size = 4;
  return o;
}

std::string test_data_dir() {
  const char* env = std::getenv("RILL_TEST_DATA");
  return env ? env : RILL_TEST_DATA;
}

class CudaMinicpm : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    RILL_REQUIRE_GPU();
    dir_ = test_data_dir() + "/" + GetParam();
    ref_ = test::read_hf_golden(dir_);
  }
  Result<std::unique_ptr<Model>> open(const ModelOptions& o) {
    RILL_ASSIGN_OR_RETURN(auto files, open_model_files(dir_));
    return create_model(builtin_registry(), infer_profile(*files), files, o);
  }
  std::vector<float> score(const ModelOptions& o) {
    auto model = open(o);
    EXPECT_TRUE(model.ok()) << model.error().message;
    if (!model.ok()) return {};
    SequenceRunner runner(**model);
    auto logits = runner.score(ref_.prompt_ids);
    EXPECT_TRUE(logits.ok()) << logits.error().message;
    return logits.ok() ? *logits : std::vector<float>{};
  }

  std::string dir_;
  test::HfGolden ref_;
};

TEST_P(CudaMinicpm, LogitsMatchTheReferenceWholeAndChunked) {
  for (int chunk : {64, 7, 5, 1}) {
    const std::vector<float> logits = score(options(Device::kCuda, chunk));
    const double err = test::max_golden_error(logits, ref_);
    EXPECT_LT(err, 1e-3) << GetParam() << ", chunks of " << chunk;
    std::printf("[ cuda ref ] %s chunks of %d: max |logit - reference| = %.3g\n", GetParam().c_str(), chunk, err);
  }
}

TEST_P(CudaMinicpm, GreedyTokensMatchTheReference) {
  auto model = open(options(Device::kCuda));
  ASSERT_TRUE(model.ok()) << model.error().message;
  SequenceRunner runner(**model);
  GenerationOptions go;
  go.max_tokens = static_cast<int>(ref_.greedy_ids.size());
  go.ignore_eos = true;
  go.sampling.temperature = 0;
  auto gen = runner.generate(ref_.prompt_ids, go, [](int32_t) { return true; });
  ASSERT_TRUE(gen.ok()) << gen.error().message;
  EXPECT_EQ(gen->ids, ref_.greedy_ids) << GetParam();
}

TEST_P(CudaMinicpm, CudaAgreesWithTheCpu) {
  const std::vector<float> cpu = score(options(Device::kCpu));
  const std::vector<float> gpu = score(options(Device::kCuda));
  const double err = test::max_abs_diff(gpu, cpu);
  EXPECT_LT(err, 2e-4) << GetParam();
  std::printf("[ cuda vs cpu ] %s: max |gpu - cpu| = %.3g\n", GetParam().c_str(), err);
}

TEST_P(CudaMinicpm, Bf16WeightsMatchTheCpuWithinBf16Error) {
  std::vector<std::vector<uint16_t>> store;
  auto files = open_model_files(dir_);
  ASSERT_TRUE(files.ok()) << files.error().message;
  test::to_bf16(**files, store);
  auto cpu = create_model(builtin_registry(), infer_profile(**files), *files, options(Device::kCpu));
  auto gpu = create_model(builtin_registry(), infer_profile(**files), *files, options(Device::kCuda));
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  SequenceRunner rc(**cpu), rg(**gpu);
  auto lc = rc.score(ref_.prompt_ids);
  auto lg = rg.score(ref_.prompt_ids);
  ASSERT_TRUE(lc.ok() && lg.ok());
  double max_ref = 0;
  for (float v : *lc) max_ref = std::max(max_ref, std::fabs(double(v)));
  const double err = test::max_abs_diff(*lg, *lc);
  EXPECT_LT(err, 0.05 * max_ref) << GetParam();
  std::printf("[ cuda bf16 ] %s: max |gpu - cpu| = %.3g (max |logit| %.3g)\n", GetParam().c_str(), err, max_ref);
}

TEST_P(CudaMinicpm, EngineGreedyOnTheDeviceGivesTheReferenceTokens) {
  ModelOptions o = options(Device::kCuda, 64);
  o.n_kv_slots = 4;
  auto model = open(o);
  ASSERT_TRUE(model.ok()) << model.error().message;
  ASSERT_TRUE((*model)->has_forward_greedy());
  auto engine = Engine::create(std::move(model).value(), nullptr, EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  test::expect_greedy_prefixes(**engine, ref_, 3, GetParam());
}

// Two sequences with scattered tables, batched and alone, bit for bit: a
// decode step always (f32 weights run every matmul in the fixed-order GEMV
// and a decode row's attention split depends only on its length); the
// prefill step too when prefill_bits (the batch-invariant mode: in the
// default mode the tiled prefill attention's bits may depend on the step).
void expect_batched_rows_equal_alone(Model& m, const std::vector<int32_t>& ids, bool prefill_bits,
                                     const std::string& what) {
  const size_t V = static_cast<size_t>(m.n_vocab());
  const std::vector<int32_t> a1 = {11, 2, 7, 4, 20}, a2 = {3, 10, 6, 8, 24}, b1 = {16, 17, 18, 19};
  const int32_t n_a = 19, n_b = 13;
  std::vector<float> alone_a(V), alone_b(V), batched(2 * V);
  Batch b;
  b.add_sequence(ids.data(), n_a, 0, true, a1);
  ASSERT_TRUE(m.forward(b, alone_a.data()).ok());
  b.clear();
  b.add_sequence(ids.data() + 3, n_b, 0, true, b1);
  ASSERT_TRUE(m.forward(b, alone_b.data()).ok());
  // A again elsewhere (a2), batched with B: its decode below reads a2's KV.
  // Without prefill_bits A decodes in a1, whose KV came from A alone.
  const std::vector<int32_t>& a_table = prefill_bits ? a2 : a1;
  if (prefill_bits) {
    b.clear();
    b.add_sequence(ids.data(), n_a, 0, true, a2);
    b.add_sequence(ids.data() + 3, n_b, 0, true, b1);
    ASSERT_TRUE(m.forward(b, batched.data()).ok());
    for (size_t i = 0; i < V; ++i) {
      ASSERT_EQ(batched[i], alone_a[i]) << what << ": sequence A, logit " << i;
      ASSERT_EQ(batched[V + i], alone_b[i]) << what << ": sequence B, logit " << i;
    }
  }
  const int32_t next_a = 5, next_b = 7;
  std::vector<float> step_a(V), step_b(V), step_ab(2 * V);
  b.clear();
  b.add_sequence(&next_a, 1, n_a, true, a1);
  ASSERT_TRUE(m.forward(b, step_a.data()).ok());
  b.clear();
  b.add_sequence(&next_a, 1, n_a, true, a_table);
  b.add_sequence(&next_b, 1, n_b, true, b1);
  ASSERT_TRUE(m.forward(b, step_ab.data()).ok());
  b.clear();
  b.add_sequence(&next_b, 1, n_b, true, b1);
  ASSERT_TRUE(m.forward(b, step_b.data()).ok());
  for (size_t i = 0; i < V; ++i) {
    ASSERT_EQ(step_ab[i], step_a[i]) << what << ": decode A, logit " << i;
    ASSERT_EQ(step_ab[V + i], step_b[i]) << what << ": decode B, logit " << i;
  }
}

TEST_P(CudaMinicpm, BatchedRowsEqualSingleSequenceRows) {
  for (bool invariant : {false, true}) {
    ModelOptions o = options(Device::kCuda, 64);
    o.n_kv_slots = 4;  // 64 blocks of 4
    o.batch_invariant = invariant;
    auto model = open(o);
    ASSERT_TRUE(model.ok()) << model.error().message;
    expect_batched_rows_equal_alone(**model, ref_.prompt_ids, /*prefill_bits=*/invariant,
                                    invariant ? "batch-invariant" : "default mode");
  }
}

TEST_P(CudaMinicpm, BatchInvariantChunksGiveTheWholePromptsBits) {
  ModelOptions whole = options(Device::kCuda, 64), chunked = options(Device::kCuda, 5);
  whole.batch_invariant = chunked.batch_invariant = true;
  const std::vector<float> a = score(whole), b = score(chunked);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << GetParam() << ": logit " << i;
}

// llama.cpp's layout of the checkpoint (q/k rows permuted, the scales as
// GGUF keys) against llama.cpp's own logits and greedy ids.
TEST_P(CudaMinicpm, GgufFileGivesLlamaCppsLogits) {
  std::string name = GetParam();  // tests/data/gguf_families names them with '_'
  std::replace(name.begin(), name.end(), '-', '_');
  const std::string base = test_data_dir() + "/gguf_families/" + name;
  std::ifstream in(base + ".json");
  ASSERT_TRUE(in) << base << ".json";
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto lc_logits = j["logits"].get<std::vector<std::vector<float>>>();
  const auto lc_greedy = j["greedy_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(j["prompt_ids"].get<std::vector<int32_t>>(), ref_.prompt_ids);
  auto files = open_model_files(base + ".gguf");
  ASSERT_TRUE(files.ok()) << files.error().message;
  for (int chunk : {64, 7, 1}) {
    auto model = create_model(builtin_registry(), infer_profile(**files), *files, options(Device::kCuda, chunk));
    ASSERT_TRUE(model.ok()) << model.error().message;
    SequenceRunner runner(**model);
    auto logits = runner.score(ref_.prompt_ids);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    const test::HfGolden lc{ref_.prompt_ids, lc_logits, lc_greedy};
    const double err = test::max_golden_error(*logits, lc);
    EXPECT_LT(err, 1e-4) << name << ".gguf, chunks of " << chunk;
    std::printf("[ cuda gguf ] %s.gguf chunks of %d: max |logit - llama.cpp| = %.3g\n", name.c_str(), chunk, err);
    runner.reset();
    GenerationOptions go;
    go.max_tokens = static_cast<int>(lc_greedy.size());
    go.ignore_eos = true;
    go.sampling.temperature = 0;
    auto gen = runner.generate(ref_.prompt_ids, go, [](int32_t) { return true; });
    ASSERT_TRUE(gen.ok()) << gen.error().message;
    EXPECT_EQ(gen->ids, lc_greedy) << name << ".gguf";
  }
}

INSTANTIATE_TEST_SUITE_P(Minicpm, CudaMinicpm, ::testing::Values("minicpm", "minicpm-tied", "minicpm-longrope"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace rill
