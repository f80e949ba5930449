// The CUDA multi-head latent attention family (model/arch/deepseek.cpp's
// graph on the CUDA Backend: cuda/latent_attention.h, cuda/lightning_index.h)
// against Hugging Face and the CPU model, on the tiny ../shared/goldens/hf
// models (minicpm3: dense MLA with the muP scales; deepseek-v3: MLA with
// the sigmoid group-limited MoE; glm-5: MLA, that MoE and DeepSeek sparse
// attention, index_topk 8 on a 24-token prompt), KV blocks of 4:
//  - f32 weights: logits within 1e-3 of the goldens with the prompt whole
//    and in chunks of 7, 5 and 1 (prefill steps, decode steps, decode
//    graphs), where the CPU tests hold them (tests/engine/mla_parity_test,
//    dsa_parity_test): every position of minicpm3 and deepseek-v3;
//    glm-5 against transformers up to its first index-score tie (positions
//    0-10) and against the causal numpy reference (tests/data/glm-5-causal)
//    at every position; the greedy continuation identical (glm-5: the
//    causal reference's), alone and through the engine (three requests at
//    once, ids picked on the device);
//  - the CPU model and the CUDA model agree within 2e-4 on every logit;
//  - bf16 weights (bf16 activations: o_proj's input and the muP scales go
//    through their F32 copies) against the CPU over the same weights within
//    5% of the largest |logit| (glm-5 left out: bf16 rounding can move a
//    key across the indexer's cut, which changes what a token attends to);
//  - batch invariance with scattered block tables: two sequences batched
//    give, bit for bit, the logits each gives alone (a prefill step and a
//    decode step), in the default and the batch-invariant modes; in the
//    batch-invariant mode the prompt in chunks of 5 gives the bits of the
//    prompt whole;
//  - the KV cache holds one latent row per token and layer, exported in the
//    CPU model's layout, and rows exported and imported elsewhere give the
//    same decode logits (the prefix-cache tiers);
//  - llama.cpp's GGUF layout of the goldens (tests/data/gguf_families:
//    deepseek2.gguf, glm_dsa.gguf, by tools/make_family_gguf.py) gives the
//    Hugging Face load's logits on CUDA bit for bit and the greedy ids
//    (minicpm3's file is left out: llama.cpp hard-codes other muP
//    constants), and glm_dsa_h8.gguf gives llama.cpp's logits and ids.
// RILL_SHARED_DIR / RILL_TEST_DATA in the environment override the
// build-time paths. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
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

constexpr int kFirstTie = 11;  // glm-5's golden: the first position whose selection has a tie at the cut

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

double max_error(const std::vector<float>& logits, const test::HfGolden& g, size_t n_positions) {
  const size_t V = g.logits[0].size();
  EXPECT_GE(logits.size(), n_positions * V);
  double m = 0;
  for (size_t t = 0; t < n_positions && (t + 1) * V <= logits.size(); ++t) {
    for (size_t i = 0; i < V; ++i) m = std::max(m, std::fabs(double(logits[t * V + i]) - g.logits[t][i]));
  }
  return m;
}

class CudaMla : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    RILL_REQUIRE_GPU();
    dir_ = test::hf_golden_dir(GetParam());
    if (!test::has_hf_golden(dir_)) GTEST_SKIP() << dir_ << " not found";
    hf_ = test::read_hf_golden(dir_);
    dsa_ = GetParam() == "glm-5";
    // glm-5: transformers' golden holds up to its first tie; the causal
    // reference holds everywhere and gives the greedy continuation.
    ref_ = dsa_ ? test::read_hf_golden(test_data_dir() + "/glm-5-causal") : hf_;
    ASSERT_EQ(ref_.prompt_ids, hf_.prompt_ids);
    n_hf_positions_ = dsa_ ? kFirstTie : hf_.prompt_ids.size();
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
    auto logits = runner.score(hf_.prompt_ids);
    EXPECT_TRUE(logits.ok()) << logits.error().message;
    return logits.ok() ? *logits : std::vector<float>{};
  }

  std::string dir_;
  test::HfGolden hf_, ref_;
  bool dsa_ = false;
  size_t n_hf_positions_ = 0;
};

TEST_P(CudaMla, LogitsMatchTheGoldensWholeAndChunked) {
  for (int chunk : {64, 7, 5, 1}) {
    const std::vector<float> logits = score(options(Device::kCuda, chunk));
    const double hf_err = max_error(logits, hf_, n_hf_positions_);
    EXPECT_LT(hf_err, 1e-3) << GetParam() << ", chunks of " << chunk << ": transformers, positions 0.."
                            << n_hf_positions_ - 1;
    std::printf("[ cuda hf ] %s chunks of %d: max |logit - transformers| = %.3g\n", GetParam().c_str(), chunk, hf_err);
    if (dsa_) {
      const double err = test::max_golden_error(logits, ref_);
      EXPECT_LT(err, 1e-3) << "chunks of " << chunk << ": the causal reference, every position";
      std::printf("[ cuda causal ] glm-5 chunks of %d: max |logit - reference| = %.3g\n", chunk, err);
    }
  }
}

TEST_P(CudaMla, GgufFileGivesTheHuggingFaceLogits) {
  if (GetParam() == "minicpm3") GTEST_SKIP() << "llama.cpp's minicpm3 files hard-code other muP constants";
  const std::string path =
      test_data_dir() + "/gguf_families/" + (GetParam() == "glm-5" ? "glm_dsa.gguf" : "deepseek2.gguf");
  auto files = open_model_files(path);
  ASSERT_TRUE(files.ok()) << files.error().message;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, options(Device::kCuda));
  ASSERT_TRUE(model.ok()) << model.error().message;
  SequenceRunner runner(**model);
  auto logits = runner.score(hf_.prompt_ids);
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  const std::vector<float> hf = score(options(Device::kCuda));
  const double vs_hf = test::max_abs_diff(*logits, hf);
  const double vs_ref = test::max_golden_error(*logits, ref_);
  EXPECT_EQ(*logits, hf) << path << ": max |gguf - hf| = " << vs_hf;  // the same f32 numbers, the same kernels
  EXPECT_LT(vs_ref, 1e-3) << path;
  std::printf("[ cuda gguf ] %s: max |gguf - hf| = %.3g (bit for bit: %s), vs the reference %.3g\n", path.c_str(),
              vs_hf, *logits == hf ? "yes" : "no", vs_ref);
  runner.reset();
  GenerationOptions go;
  go.max_tokens = static_cast<int>(ref_.greedy_ids.size());
  go.ignore_eos = true;
  go.sampling.temperature = 0;
  auto gen = runner.generate(ref_.prompt_ids, go, [](int32_t) { return true; });
  ASSERT_TRUE(gen.ok()) << gen.error().message;
  EXPECT_EQ(gen->ids, ref_.greedy_ids) << path;
}

TEST_P(CudaMla, GreedyTokensMatchTheGolden) {
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

TEST_P(CudaMla, CudaAgreesWithTheCpu) {
  const std::vector<float> cpu = score(options(Device::kCpu));
  const std::vector<float> gpu = score(options(Device::kCuda));
  const double err = test::max_abs_diff(gpu, cpu);
  EXPECT_LT(err, 2e-4) << GetParam();
  std::printf("[ cuda vs cpu ] %s: max |gpu - cpu| = %.3g\n", GetParam().c_str(), err);
}

TEST_P(CudaMla, Bf16WeightsMatchTheCpuWithinBf16Error) {
  if (dsa_) GTEST_SKIP() << "bf16 rounding can move keys across the indexer's cut";
  std::vector<std::vector<uint16_t>> store;
  auto files = open_model_files(dir_);
  ASSERT_TRUE(files.ok()) << files.error().message;
  test::to_bf16(**files, store);
  auto cpu = create_model(builtin_registry(), infer_profile(**files), *files, options(Device::kCpu));
  auto gpu = create_model(builtin_registry(), infer_profile(**files), *files, options(Device::kCuda));
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  SequenceRunner rc(**cpu), rg(**gpu);
  auto lc = rc.score(hf_.prompt_ids);
  auto lg = rg.score(hf_.prompt_ids);
  ASSERT_TRUE(lc.ok() && lg.ok());
  double max_ref = 0;
  for (float v : *lc) max_ref = std::max(max_ref, std::fabs(double(v)));
  const double err = test::max_abs_diff(*lg, *lc);
  EXPECT_LT(err, 0.05 * max_ref) << GetParam();
  std::printf("[ cuda bf16 ] %s: max |gpu - cpu| = %.3g (max |logit| %.3g)\n", GetParam().c_str(), err, max_ref);
}

TEST_P(CudaMla, EngineGreedyOnTheDeviceGivesTheGoldenTokens) {
  ModelOptions o = options(Device::kCuda, 64);
  o.n_kv_slots = 4;
  auto model = open(o);
  ASSERT_TRUE(model.ok()) << model.error().message;
  ASSERT_TRUE((*model)->has_forward_greedy());
  auto engine = Engine::create(std::move(model).value(), nullptr, EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  test::expect_greedy_prefixes(**engine, ref_, 3, GetParam());
}

// Two sequences with scattered tables, batched and alone, bit for bit.
void expect_batched_rows_equal_alone(Model& m, const std::vector<int32_t>& ids, const std::string& what) {
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
  b.clear();
  b.add_sequence(ids.data(), n_a, 0, true, a2);  // A again, elsewhere
  b.add_sequence(ids.data() + 3, n_b, 0, true, b1);
  ASSERT_TRUE(m.forward(b, batched.data()).ok());
  for (size_t i = 0; i < V; ++i) {
    ASSERT_EQ(batched[i], alone_a[i]) << what << ": sequence A, logit " << i;
    ASSERT_EQ(batched[V + i], alone_b[i]) << what << ": sequence B, logit " << i;
  }
  const int32_t next_a = 5, next_b = 7;
  std::vector<float> step_a(V), step_b(V), step_ab(2 * V);
  b.clear();
  b.add_sequence(&next_a, 1, n_a, true, a1);
  ASSERT_TRUE(m.forward(b, step_a.data()).ok());
  b.clear();
  b.add_sequence(&next_a, 1, n_a, true, a2);
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

TEST_P(CudaMla, BatchedRowsEqualSingleSequenceRows) {
  for (bool invariant : {false, true}) {
    ModelOptions o = options(Device::kCuda, 64);
    o.n_kv_slots = 4;  // 64 blocks of 4
    o.batch_invariant = invariant;
    auto model = open(o);
    ASSERT_TRUE(model.ok()) << model.error().message;
    expect_batched_rows_equal_alone(**model, hf_.prompt_ids, invariant ? "batch-invariant" : "default mode");
  }
}

TEST_P(CudaMla, BatchInvariantChunksGiveTheWholePromptsBits) {
  ModelOptions whole = options(Device::kCuda, 64), chunked = options(Device::kCuda, 5);
  whole.batch_invariant = chunked.batch_invariant = true;
  const std::vector<float> a = score(whole), b = score(chunked);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << GetParam() << ": logit " << i;
}

// kv_lora_rank + qk_rope_head_dim (+ index_head_dim) f32 values per token
// and layer, split over the K and V planes.
TEST_P(CudaMla, KvCacheHoldsOneLatentRowPerTokenAndLayer) {
  auto model = open(options(Device::kCuda));
  ASSERT_TRUE(model.ok()) << model.error().message;
  const auto& raw = (*model)->config().raw;
  const size_t row = raw["kv_lora_rank"].get<size_t>() + raw["qk_rope_head_dim"].get<size_t>() +
                     raw.value("index_head_dim", size_t{0});
  const auto n_layers = static_cast<size_t>((*model)->config().n_layer);
  EXPECT_EQ((*model)->kv_bytes_per_token(), n_layers * row * sizeof(float));
  const auto layers = (*model)->kv_layers();
  ASSERT_EQ(layers.size(), n_layers);
  EXPECT_EQ(layers[0].row_bytes, (row + 1) / 2 * sizeof(float));
  ASSERT_EQ((*model)->kv_spec().size(), 1u);
}

// Every layer's latent rows of blocks, K plane then V plane, as floats.
std::vector<float> exported_kv(Model& m, const std::vector<int32_t>& blocks) {
  const size_t bb = m.kv_layers()[0].row_bytes * static_cast<size_t>(m.kv_block_size());
  std::vector<float> out;
  for (size_t l = 0; l < m.kv_layers().size(); ++l) {
    std::vector<float> k(bb * blocks.size() / sizeof(float)), v(k.size());
    const Status st = m.copy_kv_blocks_out(static_cast<int64_t>(l), blocks, bb, reinterpret_cast<uint8_t*>(k.data()),
                                           reinterpret_cast<uint8_t*>(v.data()));
    EXPECT_TRUE(st.ok()) << st.error().message;
    out.insert(out.end(), k.begin(), k.end());
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// The prefix-cache tiers' export: the CUDA model's latent rows have the CPU
// model's layout (within f32 rounding), and rows exported from one CUDA
// model and imported into another elsewhere give the first one's decode
// logits bit for bit.
TEST_P(CudaMla, KvExportHasTheCpuLayoutAndRestores) {
  ModelOptions o = options(Device::kCuda, 64);
  o.n_kv_slots = 4;  // 64 blocks of 4
  ModelOptions oc = o;
  oc.device = Device::kCpu;
  auto cpu = open(oc);
  auto gpu = open(o);
  auto fresh = open(o);
  ASSERT_TRUE(cpu.ok() && gpu.ok() && fresh.ok());
  ASSERT_EQ((*cpu)->kv_layers().size(), (*gpu)->kv_layers().size());
  EXPECT_EQ((*cpu)->kv_layers()[0].row_bytes, (*gpu)->kv_layers()[0].row_bytes);
  const size_t V = static_cast<size_t>((*gpu)->n_vocab());
  const int32_t n = 20;  // five whole blocks
  const std::vector<int32_t> blocks = {0, 1, 2, 3, 4}, moved = {10, 11, 12, 13, 14};
  std::vector<float> logits(V);
  for (Model* m : {cpu->get(), gpu->get()}) {
    Batch b;
    b.add_sequence(hf_.prompt_ids.data(), n, 0, true, blocks);
    ASSERT_TRUE(m->forward(b, logits.data()).ok());
  }
  const std::vector<float> want = exported_kv(**cpu, blocks), got = exported_kv(**gpu, blocks);
  double max_ref = 0;
  for (float x : want) max_ref = std::max(max_ref, double(std::fabs(x)));
  EXPECT_GT(max_ref, 1e-3);
  EXPECT_LT(test::max_abs_diff(got, want), 1e-4 * std::max(1.0, max_ref)) << GetParam();

  const size_t bb = (*gpu)->kv_layers()[0].row_bytes * static_cast<size_t>((*gpu)->kv_block_size());
  const size_t per_layer = 2 * bb * blocks.size() / sizeof(float);
  for (size_t l = 0; l < (*gpu)->kv_layers().size(); ++l) {
    const auto* k = reinterpret_cast<const uint8_t*>(got.data() + l * per_layer);
    const Status st = (*fresh)->copy_kv_blocks_in(static_cast<int64_t>(l), moved, bb, k, k + bb * blocks.size());
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  const int32_t next = hf_.prompt_ids[static_cast<size_t>(n)];
  std::vector<float> decoded(V), restored(V);
  Batch b;
  std::vector<int32_t> table = blocks;
  table.push_back(5);
  b.add_sequence(&next, 1, n, true, table);
  ASSERT_TRUE((*gpu)->forward(b, decoded.data()).ok());
  b.clear();
  table = moved;
  table.push_back(15);
  b.add_sequence(&next, 1, n, true, table);
  ASSERT_TRUE((*fresh)->forward(b, restored.data()).ok());
  EXPECT_EQ(restored, decoded) << GetParam();
}

// glm_dsa_h8.gguf (the GLM-5 golden's indexer with 8 heads: no index top-k
// ties on its prompt and greedy continuation, tests/engine/family_gguf_test)
// on CUDA against llama.cpp's logits at every prompt position (1e-4, whole
// and in chunks of 7 and 1) and its greedy ids.
TEST(CudaMlaGguf, GlmDsaMatchesLlamaCpp) {
  RILL_REQUIRE_GPU();
  const std::string base = test_data_dir() + "/gguf_families/glm_dsa_h8";
  std::ifstream in(base + ".json");
  ASSERT_TRUE(in) << base << ".json";
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto prompt = j.at("prompt_ids").get<std::vector<int32_t>>();
  const auto greedy = j.at("greedy_ids").get<std::vector<int32_t>>();
  const auto ref = j.at("logits").get<std::vector<std::vector<float>>>();
  ASSERT_EQ(j.at("determined_positions").get<size_t>(), prompt.size() + greedy.size());  // no ties anywhere
  auto files = open_model_files(base + ".gguf");
  ASSERT_TRUE(files.ok()) << files.error().message;
  for (int chunk : {64, 7, 1}) {
    auto model = create_model(builtin_registry(), infer_profile(**files), *files, options(Device::kCuda, chunk));
    ASSERT_TRUE(model.ok()) << model.error().message;
    SequenceRunner runner(**model);
    auto logits = runner.score(prompt);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    const size_t V = ref[0].size();
    ASSERT_EQ(logits->size(), prompt.size() * V);
    double err = 0;
    for (size_t t = 0; t < prompt.size(); ++t) {
      for (size_t i = 0; i < V; ++i) err = std::max(err, std::fabs(double((*logits)[t * V + i]) - ref[t][i]));
    }
    EXPECT_LT(err, 1e-4) << "chunks of " << chunk;
    std::printf("[ cuda gguf ] glm_dsa_h8 chunks of %d: max |logit - llama.cpp| = %.3g\n", chunk, err);
    runner.reset();
    GenerationOptions go;
    go.max_tokens = static_cast<int>(greedy.size());
    go.ignore_eos = true;
    go.sampling.temperature = 0;
    auto gen = runner.generate(prompt, go, [](int32_t) { return true; });
    ASSERT_TRUE(gen.ok()) << gen.error().message;
    EXPECT_EQ(gen->ids, greedy) << "chunks of " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Mla, CudaMla, ::testing::Values("minicpm3", "deepseek-v3", "glm-5"), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
});

}  // namespace
}  // namespace rill
