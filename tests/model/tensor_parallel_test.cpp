// Tensor parallelism on the CPU's simulated ranks: the Llama family (dense
// and MoE) split over N = 2 and 4 ranks gives the one-device logits and
// greedy tokens.
//
// Tolerance: 1e-4 absolute on logits (the goldens' logits are O(1)). The
// split changes only summation order: o and down are summed as N partial
// dot products then added rank by rank, instead of one dot product over the
// whole row (f32 weights: each partial differs by a few ulps, ~1e-7
// relative, and 3 layers of residual stream keep that far below 1e-4). The
// observed worst case is printed. Greedy ids must be identical, and equal
// the goldens' (Hugging Face) continuation. Replicated work (norms, router,
// embedding rows) is exact, so a MoE's routing is the same on every rank.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../engine/golden_util.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "model/tensor_parallel.h"

namespace rill {
namespace {

namespace fs = std::filesystem;
const std::string kGoldens = std::string(RILL_SHARED_DIR) + "/goldens/hf/";
constexpr double kLogitTolerance = 1e-4;
constexpr int64_t kCtx = 64;

Result<std::unique_ptr<Model>> open_dir(const std::string& dir, int tensor_parallel) {
  RILL_ASSIGN_OR_RETURN(auto files, open_model_files(dir));
  ModelOptions opts;
  opts.n_threads = 2;
  opts.n_ctx = kCtx;
  opts.n_kv_slots = 3;
  opts.max_batch_tokens = 64;
  opts.tensor_parallel = tensor_parallel;
  return create_model(builtin_registry(), infer_profile(*files), files, opts);
}

Result<std::unique_ptr<Model>> open(const std::string& family, int tensor_parallel) {
  return open_dir(kGoldens + family, tensor_parallel);
}

// Every position's logits of `ids` run as one prefill in `slot`: [n, V].
std::vector<float> prefill_all_rows(Model& m, const std::vector<int32_t>& ids, int32_t slot) {
  Batch b;
  b.add_sequence(ids.data(), static_cast<int32_t>(ids.size()), 0, false,
                 slot_block_table(slot, kCtx, m.kv_block_size()));
  for (int32_t i = 0; i < b.n_tokens(); ++i) b.sample_rows.push_back(i);
  std::vector<float> logits(ids.size() * static_cast<size_t>(m.n_vocab()));
  const Status s = m.forward(b, logits.data());
  EXPECT_TRUE(s.ok()) << s.error().message;
  return logits;
}

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// Greedy continuation of the prompt in slot 0, token by token through the
// KV cache; every step's logits appended to *step_logits.
std::vector<int32_t> greedy(Model& m, const std::vector<int32_t>& prompt, int n_new, std::vector<float>* step_logits) {
  const auto table = slot_block_table(0, kCtx, m.kv_block_size());
  const int64_t V = m.n_vocab();
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<int32_t> out;
  Batch b;
  b.add_sequence(prompt.data(), static_cast<int32_t>(prompt.size()), 0, true, table);
  for (int i = 0; i < n_new; ++i) {
    const Status s = m.forward(b, logits.data());
    EXPECT_TRUE(s.ok()) << s.error().message;
    step_logits->insert(step_logits->end(), logits.begin(), logits.end());
    out.push_back(argmax(logits.data(), V));
    b.clear();
    b.add_sequence(&out.back(), 1, static_cast<int32_t>(prompt.size()) + i, true, table);
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

struct Case {
  std::string family;
  int n_ranks;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.family << " N=" << c.n_ranks;
}

class TensorParallel : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallel, MatchesOneDevice) {
  const auto [family, n_ranks] = GetParam();
  if (!fs::exists(kGoldens + family)) GTEST_SKIP() << "no golden " << family;
  auto one = open(family, 1);
  ASSERT_TRUE(one.ok()) << one.error().message;
  auto tp = open(family, n_ranks);
  ASSERT_TRUE(tp.ok()) << tp.error().message;
  ASSERT_NE(dynamic_cast<TensorParallelModel*>(tp->get()), nullptr);
  EXPECT_EQ(dynamic_cast<TensorParallelModel&>(**tp).n_ranks(), n_ranks);
  EXPECT_EQ((*tp)->n_kv_blocks(), (*one)->n_kv_blocks());
  EXPECT_EQ((*tp)->n_vocab(), (*one)->n_vocab());
  const test::HfGolden g = test::read_hf_golden(kGoldens + family);

  // Prefill, every position.
  const std::vector<float> ref = prefill_all_rows(**one, g.prompt_ids, 0);
  const std::vector<float> got = prefill_all_rows(**tp, g.prompt_ids, 0);
  const double prefill_err = max_abs_diff(got, ref);
  EXPECT_LE(prefill_err, kLogitTolerance) << family << " N=" << n_ranks;
  const int64_t V = (*one)->n_vocab();
  for (size_t t = 0; t < g.prompt_ids.size(); ++t) {
    EXPECT_EQ(argmax(got.data() + t * V, V), argmax(ref.data() + t * V, V)) << "position " << t;
  }
  // The same prompt again, in another slot: the same bits (the group's sums
  // do not depend on the threads' timing).
  const std::vector<float> again = prefill_all_rows(**tp, g.prompt_ids, 2);
  EXPECT_EQ(0, std::memcmp(again.data(), got.data(), got.size() * sizeof(float)));

  // Greedy decode through the split KV cache.
  std::vector<float> ref_steps, tp_steps;
  const int n_new = static_cast<int>(g.greedy_ids.size());
  const auto ref_ids = greedy(**one, g.prompt_ids, n_new, &ref_steps);
  const auto tp_ids = greedy(**tp, g.prompt_ids, n_new, &tp_steps);
  EXPECT_EQ(tp_ids, ref_ids);
  EXPECT_EQ(tp_ids, g.greedy_ids);
  const double decode_err = max_abs_diff(tp_steps, ref_steps);
  EXPECT_LE(decode_err, kLogitTolerance);
  std::printf("[ info ] %s N=%d: max |logit diff| prefill %.3g, decode %.3g\n", family.c_str(), n_ranks, prefill_err,
              decode_err);
}

// Two sequences of different lengths in one step, in scattered KV blocks.
TEST_P(TensorParallel, BatchedStepMatchesOneDevice) {
  const auto [family, n_ranks] = GetParam();
  if (!fs::exists(kGoldens + family)) GTEST_SKIP() << "no golden " << family;
  auto one = open(family, 1);
  auto tp = open(family, n_ranks);
  ASSERT_TRUE(one.ok() && tp.ok());
  const test::HfGolden g = test::read_hf_golden(kGoldens + family);
  const std::vector<int32_t> table_a = {7, 2, 9, 4}, table_b = {0, 11, 5, 1};
  std::vector<std::vector<float>> out;
  for (Model* m : {one->get(), tp->get()}) {
    Batch b;
    b.add_sequence(g.prompt_ids.data(), 17, 0, true, table_a);
    b.add_sequence(g.prompt_ids.data() + 3, 9, 0, true, table_b);
    std::vector<float> prefill(2 * static_cast<size_t>(m->n_vocab()));
    ASSERT_TRUE(m->forward(b, prefill.data()).ok());
    b.clear();
    const int32_t next_a = 5, next_b = 7;
    b.add_sequence(&next_a, 1, 17, true, table_a);
    b.add_sequence(&next_b, 1, 9, true, table_b);
    std::vector<float> decode(2 * static_cast<size_t>(m->n_vocab()));
    ASSERT_TRUE(m->forward(b, decode.data()).ok());
    prefill.insert(prefill.end(), decode.begin(), decode.end());
    out.push_back(std::move(prefill));
  }
  EXPECT_LE(max_abs_diff(out[1], out[0]), kLogitTolerance);
}

std::vector<Case> cases() {
  std::vector<Case> c;
  // Dense Llama variants (qwen2: qkv bias; qwen3: q/k norms; llama3-tied:
  // llama3 rope, tied LM head; mistral-swa: sliding window), then MoE.
  for (const char* f : {"llama", "qwen2", "qwen3", "llama3-tied", "mistral-swa", "qwen3-moe", "mixtral"}) {
    for (int n : {2, 4}) c.push_back({f, n});
  }
  return c;
}

INSTANTIATE_TEST_SUITE_P(Families, TensorParallel, ::testing::ValuesIn(cases()), [](const auto& info) {
  std::string name = info.param.family + "_N" + std::to_string(info.param.n_ranks);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
});

// The llama golden with its vocabulary cut to the first n_vocab rows (embedding
// and LM head), written as a model directory under dst.
void write_trimmed_vocab_model(const fs::path& src, int64_t n_vocab, const fs::path& dst) {
  fs::create_directories(dst);
  std::ifstream cfg_in(src / "config.json");
  auto cfg = nlohmann::json::parse(cfg_in);
  cfg["vocab_size"] = n_vocab;
  std::ofstream(dst / "config.json") << cfg.dump();
  std::ifstream in(src / "model.safetensors", std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto h = nlohmann::json::parse(header);
  nlohmann::json out_h;
  std::string out_data;
  for (const auto& [name, t] : h.items()) {
    if (name == "__metadata__") continue;
    const auto begin = t["data_offsets"][0].get<size_t>();
    auto end = t["data_offsets"][1].get<size_t>();
    auto shape = t["shape"];
    if (name == "lm_head.weight" || name == "model.embed_tokens.weight") {
      end = begin + (end - begin) / shape[0].get<size_t>() * static_cast<size_t>(n_vocab);
      shape[0] = n_vocab;
    }
    out_h[name] = {
        {"dtype", t["dtype"]}, {"shape", shape}, {"data_offsets", {out_data.size(), out_data.size() + end - begin}}};
    out_data += data.substr(begin, end - begin);
  }
  const std::string out_header = out_h.dump();
  const uint64_t out_len = out_header.size();
  std::ofstream out(dst / "model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&out_len), 8);
  out << out_header << out_data;
}

// A vocabulary that does not divide over the ranks: 509 rows over 2 ranks
// are 255 + 254 (padded to 255 for the gather), over 4 ranks 128 * 3 + 125.
TEST(TensorParallelVocab, UnevenVocabularyMatchesOneDevice) {
  if (!fs::exists(kGoldens + "llama")) GTEST_SKIP();
  const fs::path dir = fs::temp_directory_path() / ("rill_tp_vocab_" + std::to_string(::getpid()));
  write_trimmed_vocab_model(kGoldens + "llama", 509, dir);
  const test::HfGolden g = test::read_hf_golden(kGoldens + "llama");
  auto one = open_dir(dir.string(), 1);
  ASSERT_TRUE(one.ok()) << one.error().message;
  ASSERT_EQ((*one)->n_vocab(), 509);
  const std::vector<float> ref = prefill_all_rows(**one, g.prompt_ids, 0);
  for (int n : {2, 4}) {
    auto tp = open_dir(dir.string(), n);
    ASSERT_TRUE(tp.ok()) << tp.error().message;
    const std::vector<float> got = prefill_all_rows(**tp, g.prompt_ids, 0);
    EXPECT_LE(max_abs_diff(got, ref), kLogitTolerance) << "N=" << n;
  }
  fs::remove_all(dir);
}

// ModelOptions::kv_cache_bytes is the budget of all ranks together, and
// every rank holds the same number of blocks (the engine sees one block
// space). llama has 2 KV heads: over 2 ranks each holds one (the one-device
// bytes per token in all), over 4 ranks each of the 4 holds one (twice them).
TEST(TensorParallelKv, BudgetIsTheWholeModels) {
  if (!fs::exists(kGoldens + "llama")) GTEST_SKIP();
  auto files = open_model_files(kGoldens + "llama");
  ASSERT_TRUE(files.ok()) << files.error().message;
  auto open_with_budget = [&](int tensor_parallel) {
    ModelOptions opts;
    opts.n_threads = 2;
    opts.n_ctx = kCtx;
    opts.kv_cache_bytes = 3'000'017;  // no multiple of a block, nor of N blocks
    opts.tensor_parallel = tensor_parallel;
    return create_model(builtin_registry(), infer_profile(**files), *files, opts);
  };
  auto one = open_with_budget(1);
  ASSERT_TRUE(one.ok()) << one.error().message;
  const int64_t block_bytes = (*one)->kv_block_size() * static_cast<int64_t>((*one)->kv_bytes_per_token());
  EXPECT_EQ((*one)->n_kv_blocks(), 3'000'017 / block_bytes);
  for (int n : {2, 4}) {
    auto tp = open_with_budget(n);
    ASSERT_TRUE(tp.ok()) << tp.error().message;
    EXPECT_EQ((*tp)->kv_bytes_per_token(), (*one)->kv_bytes_per_token() * static_cast<size_t>(n / 2)) << "N=" << n;
    EXPECT_EQ((*tp)->n_kv_blocks(), 3'000'017 / (block_bytes * (n / 2))) << "N=" << n;
  }
}

TEST(TensorParallelErrors, RefusesHeadsThatDoNotDivide) {
  if (!fs::exists(kGoldens + "llama")) GTEST_SKIP();
  for (int n : {3, 8}) {
    auto m = open("llama", n);  // 4 query heads, 2 KV heads
    ASSERT_FALSE(m.ok()) << "N=" << n;
    EXPECT_NE(m.error().message.find("num_attention_heads 4 does not divide over " + std::to_string(n)),
              std::string::npos)
        << m.error().message;
  }
  auto zero = open("llama", 0);
  ASSERT_FALSE(zero.ok());
}

TEST(TensorParallelErrors, FamiliesWithoutItRefuse) {
  if (!fs::exists(kGoldens + "gemma2")) GTEST_SKIP();
  auto m = open("gemma2", 2);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("no tensor-parallel implementation"), std::string::npos) << m.error().message;
}

}  // namespace
}  // namespace rill
