// The CUDA Mixtral, Qwen3-MoE and GLM-4.5 (glm4-moe: the sigmoid router,
// an ungated shared expert) (llama.cuda in arch/llama.cpp, the CUDA
// Backend's moe_ffn):
// batch invariance (f32) with many routed tokens: a decode row's logits
// bit-identical alone and beside 39 other sequences (80 routed pairs over 4
// or 8 experts: every expert serves several tokens, most more than 8), and
// a prompt's logits identical whether it is prefilled alone or beside
// another prompt. The goldens (f32 against transformers, bf16 against the
// CPU, the engine on the device) run with the Llama family in
// llama_cuda_test.cpp. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "loader/model_files.h"
#include "model/registry.h"

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

INSTANTIATE_TEST_SUITE_P(MoeFamily, CudaMoeHf, ::testing::Values("mixtral", "qwen3-moe", "glm4-moe"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace rill
