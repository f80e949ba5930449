// Batch-invariant mode of the CUDA models (ModelOptions::batch_invariant,
// CudaModelBase::batch_invariant_), on HF goldens converted in memory to
// bf16 weights (Llama, Gemma 2, the Qwen3 MoE, Mixtral, GLM-4.5's sigmoid
// router, Gemma 4's MoE block) and to Q8_0 (Llama; GLM-4.5, whose experts
// then stay Q8_0 blocks in the CUDA MoE's expert GEMV), and with q8_0 KV
// (Llama, Gemma 2), q8_0h (Llama), q4_0h and iq4_nlh KV (Gemma 2: sliding
// and full layers; kv_types_cuda_test.cpp holds their accuracy), q4_0, fp8,
// bf16, q4_1 and q5_1 KV (Llama), q5_0 (Gemma 2), and Gemma 4 with
// full layers of head_dim 512 (gemma4_hd512_model.h; f16, q8_0 and q8_0h64
// KV: q8_0h64's blocks of 64 need heads of 64 or more, which the goldens'
// 16-wide heads are not; q5_1 for the wide prefill of head_dim 512):
//  1. a decode row's logits are bit-identical alone and in steps of 3, 9 and
//     40 sequences and beside a 100-token prompt; with the mode off the test only logs how many logits of
//     the 9- and 40-sequence rows differ (what the mode buys);
//  2. through the Engine, 12 prompts of different lengths, each run alone
//     and all at once under a 16-token step budget (chunked prefill, mixed
//     steps), give the same tokens, greedy and seeded sampling;
//  3. the mode's logits stay within bf16 error of the default mode's.
// Skipped without a CUDA device or the goldens.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "../engine/golden_util.h"
#include "backend/cpu/quants.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "engine/sequence_runner.h"
#include "gemma4_hd512_model.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "rill/engine.h"

namespace rill {
namespace {

struct Case {
  std::string golden;
  DType weights;             // kBF16 or kQ8_0
  std::string kv_type = "";  // a --kv-type (q8_0: quantized KV); "": the model's own
};

// Every 2-D f32 tensor converted to `to` (bf16, or Q8_0 where rows are a
// whole number of blocks); buffers kept in `store`.
void convert(ModelFiles& files, DType to, std::vector<std::vector<uint8_t>>& store) {
  for (auto& [name, t] : files.tensors) {
    if (t.shape.size() != 2 || t.dtype != DType::kF32) continue;
    const auto* src = reinterpret_cast<const float*>(t.data);
    const int64_t n = t.n_elements(), cols = t.shape.back();
    const bool q8 = to == DType::kQ8_0 && cols % 32 == 0;
    std::vector<uint8_t> b(static_cast<size_t>(q8 ? n / 32 * 34 : n * 2));
    if (q8) {
      for (int64_t r = 0; r < n / cols; ++r)
        cpu::ref::quantize_row_q8_0(src + r * cols, b.data() + r * (cols / 32) * 34, cols);
    } else {
      auto* d = reinterpret_cast<uint16_t*>(b.data());
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
    }
    store.push_back(std::move(b));
    t.dtype = q8 ? DType::kQ8_0 : DType::kBF16;
    t.data = store.back().data();
    t.n_bytes = store.back().size();
  }
}

class CudaBatchInvariant : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    RILL_REQUIRE_GPU();
    dir_ =
        GetParam().golden == "gemma4-hd512" ? test::gemma4_hd512_model_dir() : test::hf_golden_dir(GetParam().golden);
    if (dir_.empty()) GTEST_SKIP() << "the gemma4 golden is missing";
    if (!std::filesystem::exists(dir_ + "/config.json")) GTEST_SKIP() << dir_ << " not found";
    auto files = open_model_files(dir_);
    ASSERT_TRUE(files.ok()) << files.error().message;
    files_ = std::move(files).value();
    convert(*files_, GetParam().weights, store_);
  }
  std::string name() const {
    return GetParam().golden + (GetParam().weights == DType::kQ8_0 ? " q8_0" : " bf16") +
           (GetParam().kv_type.empty() ? "" : " kv " + GetParam().kv_type);
  }
  std::unique_ptr<Model> model(bool invariant, int max_tokens, int n_slots) {
    ModelOptions o;
    o.device = Device::kCuda;
    o.n_ctx = 128;
    o.max_batch_tokens = max_tokens;
    o.n_kv_slots = n_slots;
    o.batch_invariant = invariant;
    if (!GetParam().kv_type.empty()) o.kv_types.k = o.kv_types.v = parse_kv_type(GetParam().kv_type);
    auto m = create_model(builtin_registry(), infer_profile(*files_), files_, o);
    EXPECT_TRUE(m.ok()) << m.error().message;
    return m.ok() ? std::move(m).value() : nullptr;
  }

  std::string dir_;
  std::shared_ptr<ModelFiles> files_;
  std::vector<std::vector<uint8_t>> store_;
};

// Adds a sequence on `table` in every attention group (Gemma's sliding
// group too: groups have KV planes of their own, so they may share ids).
void add(Batch& b, const Model& m, const int32_t* ids, int32_t n, int32_t pos0, const std::vector<int32_t>& table) {
  const int32_t s = b.add_sequence(ids, n, pos0, true, table);
  b.group_tables.resize(m.kv_spec().size() - 1);
  for (auto& g : b.group_tables) {
    g.resize(static_cast<size_t>(b.seqs[static_cast<size_t>(s)].table_start));
    g.insert(g.end(), table.begin(), table.end());
  }
}

// Logits of sequence 0's decode token alone and in steps of 3, 9 and 40
// sequences (every sequence prefilled alone first, prompts of 6..45 tokens).
std::vector<std::vector<float>> decode_rows(Model& m) {
  constexpr int kSeqs = 40;
  const int64_t V = m.n_vocab();
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> len;
  Batch b;
  std::vector<float> logits(static_cast<size_t>(kSeqs) * V);
  for (int32_t s = 0; s < kSeqs; ++s) {
    tables.push_back(slot_block_table(s, m.n_ctx(), m.kv_block_size()));
    std::vector<int32_t> ids(static_cast<size_t>(6 + s));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + s * 11 + 1) % V);
    b.clear();
    add(b, m, ids.data(), static_cast<int32_t>(ids.size()), 0, tables.back());
    const Status st = m.forward(b, logits.data());
    EXPECT_TRUE(st.ok()) << st.error().message;
    len.push_back(static_cast<int32_t>(ids.size()));
  }
  std::vector<std::vector<float>> rows;
  for (int n : {1, 3, 9, 40}) {
    b.clear();
    for (int32_t s = 0; s < n; ++s) {
      const int32_t next = (5 + s) % static_cast<int32_t>(V);
      add(b, m, &next, 1, len[static_cast<size_t>(s)], tables[static_cast<size_t>(s)]);
    }
    const Status st = m.forward(b, logits.data());
    EXPECT_TRUE(st.ok()) << st.error().message;
    rows.emplace_back(logits.begin(), logits.begin() + V);
  }
  // A mixed step of 101 tokens: row 0's decode token beside a 100-token
  // prompt in slot kSeqs (the GEMM's two-row-group path, two token blocks).
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 29 + 3) % V);
  const auto extra = slot_block_table(kSeqs, m.n_ctx(), m.kv_block_size());
  b.clear();
  const int32_t next = 5;
  add(b, m, &next, 1, len[0], tables[0]);
  add(b, m, prompt.data(), 100, 0, extra);
  const Status st = m.forward(b, logits.data());
  EXPECT_TRUE(st.ok()) << st.error().message;
  rows.emplace_back(logits.begin(), logits.begin() + V);
  return rows;
}

int n_diff(const std::vector<float>& a, const std::vector<float>& b) {
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

TEST_P(CudaBatchInvariant, DecodeRowIsBitIdenticalAtAnyBatchSize) {
  auto inv = model(true, 128, 41);
  ASSERT_TRUE(inv);
  const auto on = decode_rows(*inv);
  inv.reset();
  const int sizes[] = {1, 3, 9, 40, 101};
  for (size_t k = 1; k < on.size(); ++k) {
    EXPECT_EQ(n_diff(on[0], on[k]), 0) << name() << ": row 0 alone vs in a step of " << sizes[k];
  }
  auto def = model(false, 128, 41);
  ASSERT_TRUE(def);
  const auto off = decode_rows(*def);
  double max_err = 0, max_abs = 0;
  for (size_t i = 0; i < off[0].size(); ++i) {
    max_err = std::max(max_err, static_cast<double>(std::fabs(off[0][i] - on[0][i])));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(off[0][i])));
  }
  std::printf(
      "[ cuda batch-invariant ] %s: mode off, row 0 alone vs steps of 3/9/40/101: %d/%d/%d/%d of %zu "
      "logits differ; mode on vs off alone: max |diff| %.3g (max |logit| %.3g)\n",
      name().c_str(), n_diff(off[0], off[1]), n_diff(off[0], off[2]), n_diff(off[0], off[3]), n_diff(off[0], off[4]),
      off[0].size(), max_err, max_abs);
  // Both modes round activations to bf16 between layers, in different orders.
  EXPECT_LE(max_err, 0.03 * (1.0 + max_abs)) << name();
}

// Tokens of 12 requests: greedy for even i, seeded sampling for odd i.
std::vector<std::vector<int32_t>> engine_tokens(std::unique_ptr<Model> m, bool together) {
  if (!m) return {};
  const int64_t V = m->n_vocab();
  EngineOptions eo;
  eo.max_batch_tokens = 16;
  eo.max_running = 12;
  auto engine = Engine::create(std::move(m), nullptr, eo);
  EXPECT_TRUE(engine.ok()) << engine.error().message;
  if (!engine.ok()) return {};
  std::vector<std::vector<int32_t>> out(12);
  std::vector<RequestHandle> hs;
  auto drain = [&](size_t i) {
    GenerationEvent ev;
    while (hs[i].next(ev)) {
      EXPECT_TRUE(ev.error.empty()) << ev.error;
      out[i].insert(out[i].end(), ev.token_ids.begin(), ev.token_ids.end());
    }
  };
  for (int i = 0; i < 12; ++i) {
    GenerationRequest r;
    for (int k = 0; k < 5 + 4 * i; ++k) r.prompt.push_back(static_cast<int32_t>((k * 53 + i * 17 + 2) % V));
    r.max_tokens = 10;
    r.ignore_eos = true;
    r.sampling.temperature = i % 2 == 0 ? 0.0f : 0.9f;
    if (i % 2 == 1) r.sampling.seed = 1000 + static_cast<uint64_t>(i);
    auto h = (*engine)->submit(std::move(r));
    EXPECT_TRUE(h.ok()) << h.error().message;
    if (!h.ok()) return {};
    hs.push_back(std::move(h).value());
    if (!together) drain(hs.size() - 1);
  }
  if (together) {
    for (size_t i = 0; i < hs.size(); ++i) drain(i);
  }
  return out;
}

TEST_P(CudaBatchInvariant, EngineTokensAloneAndTogetherAreIdentical) {
  const auto alone = engine_tokens(model(true, 16, 16), false);
  const auto together = engine_tokens(model(true, 16, 16), true);
  ASSERT_EQ(alone.size(), 12u);
  ASSERT_EQ(together.size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(alone[i].size(), 10u);
    EXPECT_EQ(alone[i], together[i]) << name() << " request " << i << (i % 2 ? " (seeded)" : " (greedy)");
  }
  const auto off_alone = engine_tokens(model(false, 16, 16), false);
  const auto off_together = engine_tokens(model(false, 16, 16), true);
  int n_req = 0;
  for (size_t i = 0; i < off_alone.size() && i < off_together.size(); ++i) n_req += off_alone[i] != off_together[i];
  std::printf("[ cuda batch-invariant ] %s: mode off, %d of 12 requests' tokens differ alone vs together\n",
              name().c_str(), n_req);
}

INSTANTIATE_TEST_SUITE_P(
    Families, CudaBatchInvariant,
    ::testing::Values(Case{"llama", DType::kBF16}, Case{"llama", DType::kQ8_0}, Case{"gemma2", DType::kBF16},
                      Case{"qwen3-moe", DType::kBF16}, Case{"mixtral", DType::kBF16}, Case{"glm4-moe", DType::kBF16},
                      Case{"glm4-moe", DType::kQ8_0}, Case{"gemma4-moe", DType::kBF16},
                      Case{"llama", DType::kBF16, "q8_0"}, Case{"gemma2", DType::kBF16, "q8_0"},
                      Case{"llama", DType::kBF16, "q8_0h"}, Case{"gemma2", DType::kBF16, "q4_0h"},
                      Case{"gemma2", DType::kBF16, "iq4_nlh"}, Case{"gemma4-hd512", DType::kBF16},
                      Case{"gemma4-hd512", DType::kBF16, "q8_0"}, Case{"gemma4-hd512", DType::kBF16, "q8_0h64"},
                      Case{"gemma4-hd512", DType::kBF16, "iq4_nlh64"}, Case{"llama", DType::kBF16, "q4_0"},
                      Case{"llama", DType::kBF16, "fp8"}, Case{"llama", DType::kBF16, "bf16"},
                      Case{"llama", DType::kBF16, "q4_1"}, Case{"llama", DType::kBF16, "q5_1"},
                      Case{"gemma2", DType::kBF16, "q5_0"}, Case{"gemma4-hd512", DType::kBF16, "q5_1"}),
    [](const auto& info) {
      std::string n = info.param.golden + (info.param.weights == DType::kQ8_0 ? "_q8" : "_bf16") +
                      (info.param.kv_type.empty() ? "" : "_kv_" + info.param.kv_type);
      for (char& c : n)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      return n;
    });

}  // namespace
}  // namespace rill
