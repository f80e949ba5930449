// gpt-oss from an MXFP4 checkpoint as OpenAI ships it on Hugging Face
// (tests/data/gpt_oss_mxfp4, tools/make_mxfp4_checkpoint.py: the gpt-oss
// golden with its experts in MXFP4 blocks and scales) on the CPU:
//  (a) against the same model with transformers' dequantization of the
//      experts in their place (dequantized.safetensors): held exactly in
//      Q8_0 (every dequantized value is a small integer times a power of
//      two), whose CPU dot products take the same Q8_0 activations as
//      MXFP4's, the logits agree within 1e-4 (measured: bit for bit) and
//      the greedy ids are identical; in f32 (f32 activations) they differ
//      by the Q8_0 activation rounding alone (bounded, measured value
//      printed);
//  (b) against llama.cpp's converter's GGUF of the same checkpoint
//      (tests/data/gguf_families/gpt_oss_mxfp4.gguf, byte for byte what the
//      converter makes of it): the same blocks, so rill's safetensors and
//      GGUF loads give the same logits bit for bit once RoPE agrees (GGUF
//      carries no YaRN `truncate`: llama.cpp rounds the correction range,
//      the checkpoint's truncate false does not; set true here for the
//      comparison, and the truncate-false difference printed), and
//      llama.cpp's own logits on that file (gpt_oss_mxfp4.json) within 1e-4
//      with its greedy ids;
//  (c) a config whose sizes disagree with the blocks is refused naming the
//      tensor and config.json.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/half.h"
#include "engine/sequence_runner.h"
#include "golden_util.h"
#include "loader/model_files.h"
#include "loader/safetensors.h"
#include "model/registry.h"

namespace rill {
namespace {

const std::string kDir = std::string(RILL_TEST_DATA) + "/gpt_oss_mxfp4";
const std::string kGguf = std::string(RILL_TEST_DATA) + "/gguf_families/gpt_oss_mxfp4";

struct LlamaCpp {
  std::vector<int32_t> prompt_ids, greedy_ids;
  std::vector<std::vector<float>> logits;  // [prompt position][n_vocab]
};

LlamaCpp read_llamacpp() {
  std::ifstream in(kGguf + ".json");
  const nlohmann::json j = nlohmann::json::parse(in);
  return {j["prompt_ids"].get<std::vector<int32_t>>(), j["greedy_ids"].get<std::vector<int32_t>>(),
          j["logits"].get<std::vector<std::vector<float>>>()};
}

// The checkpoint with dequantized.safetensors' dense experts (transformers'
// dequantization, [X, cols, rows] as a dense gpt-oss checkpoint stores them)
// in place of the MXFP4 ones.
struct Dense {
  std::shared_ptr<ModelFiles> files;
  SafetensorsFile experts;  // what the replaced tensors point into
};

Dense dense_copy() {
  Dense d;
  auto files = open_model_files(kDir);
  EXPECT_TRUE(files.ok()) << files.error().message;
  d.files = std::move(files).value();
  auto experts = open_safetensors(kDir + "/dequantized.safetensors");
  EXPECT_TRUE(experts.ok()) << experts.error().message;
  d.experts = std::move(experts).value();
  for (const SafetensorsTensor& t : d.experts.tensors) {
    TensorRef& ref = d.files->tensors.at(t.name);
    EXPECT_EQ(ref.dtype, DType::kMXFP4) << t.name;
    ref = TensorRef{};
    ref.name = t.name;
    ref.file = kDir + "/dequantized.safetensors";
    ref.dtype = t.dtype;
    ref.shape = t.shape;
    ref.data = t.data;
    ref.n_bytes = t.n_bytes;
  }
  return d;
}

// The same dequantized weights held in Q8_0, exactly: each block of 32
// values v = k 2^s (k an MXFP4 code value times 2, |k| <= 12) takes d =
// 2^(floor(log2 max |v|) - 6), so every v / d is an integer of at most 96
// and d a power of two f16 holds. The experts are given as the stacked
// per-projection tensors (gate_proj / up_proj / down_proj [X, rows, cols]
// with their biases, as GGUF files bind). CPU dot products of Q8_0 and of
// MXFP4 weights both take Q8_0 activations and sum integers per block,
// then scale by the product of two powers of two per block: the same sums
// up to the order of float additions across blocks.
struct Q8Copy {
  std::shared_ptr<ModelFiles> files;
  std::vector<std::vector<uint8_t>> store;
};

// Appends Q8_0 rows of `n_rows` x `n_cols` values at(r, c) to `out`; false
// when a value is not exactly representable so.
bool to_q8_0(int64_t n_rows, int64_t n_cols, const std::function<float(int64_t, int64_t)>& at,
             std::vector<uint8_t>& out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t b = 0; b < n_cols / 32; ++b) {
      float v[32], amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j] = at(r, b * 32 + j)));
      int ex = 0;
      if (amax > 0) std::frexp(amax, &ex);  // amax = m 2^ex, m in [0.5, 1)
      const float d = amax > 0 ? std::ldexp(1.0f, ex - 1 - 6) : 0.0f;
      const uint16_t dh = f32_to_f16(d);
      if (f16_to_f32(dh) != d) return false;
      out.push_back(static_cast<uint8_t>(dh & 0xFF));
      out.push_back(static_cast<uint8_t>(dh >> 8));
      for (int j = 0; j < 32; ++j) {
        const float q = d > 0 ? v[j] / d : 0.0f;
        if (q != std::nearbyint(q) || std::fabs(q) > 127) return false;
        out.push_back(static_cast<uint8_t>(static_cast<int8_t>(q)));
      }
    }
  }
  return true;
}

Q8Copy q8_0_copy(const Dense& d, int64_t n_layer) {
  Q8Copy q;
  q.files = std::make_shared<ModelFiles>();  // the tensors only: the views stay valid while d lives
  q.files->format = d.files->format;
  q.files->path = d.files->path;
  q.files->config = d.files->config;
  q.files->tensors = d.files->tensors;
  for (int64_t il = 0; il < n_layer; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".mlp.experts.";
    const TensorRef gu = q.files->tensors.at(p + "gate_up_proj"), dn = q.files->tensors.at(p + "down_proj");
    const TensorRef gub = q.files->tensors.at(p + "gate_up_proj_bias"), dnb = q.files->tensors.at(p + "down_proj_bias");
    EXPECT_EQ(gu.dtype, DType::kF32);
    EXPECT_EQ(gub.dtype, DType::kF32);
    const int64_t X = gu.shape[0], E = gu.shape[1], F = gu.shape[2] / 2;
    const auto* w_gu = reinterpret_cast<const float*>(gu.data);   // [X, E, 2F]
    const auto* w_dn = reinterpret_cast<const float*>(dn.data);   // [X, F, E]
    const auto* b_gu = reinterpret_cast<const float*>(gub.data);  // [X, 2F]
    const auto* b_dn = reinterpret_cast<const float*>(dnb.data);  // [X, E]
    auto add = [&](const std::string& name, std::vector<int64_t> shape, DType t, std::vector<uint8_t> bytes) {
      q.store.push_back(std::move(bytes));
      TensorRef r;
      r.name = name;
      r.file = "(the test's Q8_0 copy)";
      r.dtype = t;
      r.shape = std::move(shape);
      r.data = q.store.back().data();
      r.n_bytes = q.store.back().size();
      q.files->tensors[name] = r;
    };
    for (int which = 0; which < 3; ++which) {  // gate (even gate_up columns), up (odd), down
      const int64_t rows = which == 2 ? E : F, cols = which == 2 ? F : E;
      std::vector<uint8_t> bytes, bias;
      for (int64_t e = 0; e < X; ++e) {
        auto at = [&](int64_t r, int64_t c) {
          return which == 2 ? w_dn[(e * F + c) * E + r] : w_gu[(e * E + c) * 2 * F + 2 * r + which];
        };
        EXPECT_TRUE(to_q8_0(rows, cols, at, bytes)) << p << " expert " << e << " is not exactly Q8_0";
        for (int64_t r = 0; r < rows; ++r) {
          const float b = which == 2 ? b_dn[e * E + r] : b_gu[e * 2 * F + 2 * r + which];
          const auto* bb = reinterpret_cast<const uint8_t*>(&b);
          bias.insert(bias.end(), bb, bb + 4);
        }
      }
      const std::string proj = which == 0 ? "gate_proj" : which == 1 ? "up_proj" : "down_proj";
      add(p + proj + ".weight", {X, rows, cols}, DType::kQ8_0, std::move(bytes));
      add(p + proj + ".bias", {X, rows}, DType::kF32, std::move(bias));
    }
    for (const char* gone : {"gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"}) {
      q.files->tensors.erase(p + gone);
    }
  }
  return q;
}

struct Logits {
  std::vector<float> logits;  // [prompt positions, n_vocab]
  std::vector<int32_t> greedy;
};

Logits run(const std::shared_ptr<ModelFiles>& files, const std::vector<int32_t>& prompt, size_t n_greedy) {
  ModelOptions o;
  o.n_threads = 2;
  o.n_ctx = 64;
  o.max_batch_tokens = 64;
  o.kv_block_size = 4;
  auto model = create_model(builtin_registry(), infer_profile(*files), files, o);
  EXPECT_TRUE(model.ok()) << model.error().message;
  if (!model.ok()) return {};
  SequenceRunner runner(**model);
  auto logits = runner.score(prompt);
  EXPECT_TRUE(logits.ok()) << logits.error().message;
  runner.reset();
  GenerationOptions go;
  go.max_tokens = static_cast<int>(n_greedy);
  go.ignore_eos = true;
  go.sampling.temperature = 0;
  auto gen = runner.generate(prompt, go, [](int32_t) { return true; });
  EXPECT_TRUE(gen.ok()) << gen.error().message;
  return {logits.ok() ? *logits : std::vector<float>{}, gen.ok() ? gen->ids : std::vector<int32_t>{}};
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = a.size() == b.size() ? 0 : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, double(std::fabs(x)));
  return m;
}

class GptOssMxfp4 : public ::testing::Test {
 protected:
  void SetUp() override { lc_ = read_llamacpp(); }
  LlamaCpp lc_;
};

TEST_F(GptOssMxfp4, MatchesTheDequantizedCheckpoint) {
  auto files = open_model_files(kDir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  const Logits mxfp4 = run(*files, lc_.prompt_ids, lc_.greedy_ids.size());
  const Dense d = dense_copy();
  const Logits dense = run(d.files, lc_.prompt_ids, lc_.greedy_ids.size());
  ASSERT_FALSE(mxfp4.logits.empty());
  const Q8Copy q8 = q8_0_copy(d, (*files)->config.n_layer);
  const Logits same_rounding = run(q8.files, lc_.prompt_ids, lc_.greedy_ids.size());
  ASSERT_EQ(same_rounding.logits.size(), mxfp4.logits.size());
  const double vs_q8 = max_abs_diff(mxfp4.logits, same_rounding.logits);
  const double vs_f32 = max_abs_diff(mxfp4.logits, dense.logits);
  std::printf(
      "MXFP4 checkpoint (CPU) vs its dequantized experts held exactly in Q8_0 (Q8_0 activations as MXFP4's): "
      "max |logit diff| %.3g; in f32 (f32 activations): %.3g, max |logit| %.3g, over %zu positions\n",
      vs_q8, vs_f32, max_abs(dense.logits), lc_.prompt_ids.size());
  EXPECT_LT(vs_q8, 1e-4);
  EXPECT_EQ(mxfp4.greedy, same_rounding.greedy);
  EXPECT_EQ(mxfp4.greedy.size(), lc_.greedy_ids.size());
  // f32 activations against ggml's Q8_0 ones (up to 1/254 of a block's
  // largest value each): measured 0.027 at max |logit| 2.8 (2026-12-03),
  // and on this tiny random model (logits within ~1 of each other) the
  // greedy ids part after 8 tokens, so only the bound is held here.
  EXPECT_LT(vs_f32, 0.05);
  EXPECT_GT(vs_f32, 0.0);
}

TEST_F(GptOssMxfp4, MatchesItsGgufAndLlamaCpp) {
  auto gguf = open_model_files(kGguf + ".gguf");
  ASSERT_TRUE(gguf.ok()) << gguf.error().message;
  const Logits from_gguf = run(*gguf, lc_.prompt_ids, lc_.greedy_ids.size());
  auto files = open_model_files(kDir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  ASSERT_FALSE((*files)->config.rope_scaling.truncate);  // the checkpoint's, as gpt-oss's
  const Logits as_stored = run(*files, lc_.prompt_ids, lc_.greedy_ids.size());
  (*files)->config.rope_scaling.truncate = true;  // llama.cpp's YaRN range
  const Logits truncated = run(*files, lc_.prompt_ids, lc_.greedy_ids.size());
  ASSERT_FALSE(truncated.logits.empty());
  ASSERT_EQ(truncated.logits.size(), from_gguf.logits.size());
  EXPECT_EQ(truncated.logits, from_gguf.logits) << "max |diff| " << max_abs_diff(truncated.logits, from_gguf.logits);
  EXPECT_EQ(truncated.greedy, from_gguf.greedy);
  std::vector<float> lc;
  for (const auto& row : lc_.logits) lc.insert(lc.end(), row.begin(), row.end());
  const double vs_llamacpp = max_abs_diff(truncated.logits, lc);
  EXPECT_LT(vs_llamacpp, 1e-4);
  EXPECT_EQ(truncated.greedy, lc_.greedy_ids);
  std::printf(
      "MXFP4 checkpoint vs its GGUF: identical logits (YaRN truncate true); vs llama.cpp %.3g; "
      "truncate false (as stored) vs true %.3g\n",
      vs_llamacpp, max_abs_diff(as_stored.logits, truncated.logits));
}

TEST_F(GptOssMxfp4, ConfigSizesDisagreeingWithTheBlocksAreRefused) {
  auto files = open_model_files(kDir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  (*files)->config.n_ff_expert = (*files)->config.n_ff = 48;  // as if config.json said intermediate_size 48
  ModelOptions o;
  o.n_threads = 1;
  o.n_ctx = 16;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, o);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.error().message,
            kDir +
                "/model-00002-of-00002.safetensors: tensor 'model.layers.0.mlp.experts.gate_up_proj_blocks' has "
                "shape [4, 64, 2, 16], " +
                kDir + "/config.json (num_local_experts 4, hidden_size / intermediate_size) expects [4, 96, 2, 16]");
}

}  // namespace
}  // namespace rill
