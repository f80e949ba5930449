// The MoE families from GGUF files: the Hugging Face goldens (mixtral,
// qwen3-moe) converted here the way llama.cpp's converter writes them (llama
// names, experts stacked in ffn_*_exps [n_expert, rows, cols], Mixtral as
// architecture "llama" with expert_count and its q/k rows permuted for
// interleaved RoPE) must give transformers' logits and greedy ids.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../loader/gguf_writer.h"
#include "engine/sequence_runner.h"
#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

const std::string kGoldens = std::string(RILL_SHARED_DIR) + "/goldens/hf/";
constexpr uint32_t kGgmlF32 = 0;

std::vector<uint8_t> bytes_of(const TensorRef& t) {
  return {t.data, t.data + t.n_bytes};
}

// Rows of q or k reordered per head as llama.cpp's converter does for
// "llama" files: row h*hd + 2i + j takes row h*hd + j*hd/2 + i.
std::vector<uint8_t> permute_heads(const TensorRef& t, int64_t n_head) {
  const int64_t rows = t.shape[0], hd = rows / n_head;
  const size_t row_bytes = t.n_bytes / static_cast<size_t>(rows);
  std::vector<uint8_t> out(t.n_bytes);
  for (int64_t h = 0; h < n_head; ++h) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        std::memcpy(out.data() + static_cast<size_t>(h * hd + 2 * i + j) * row_bytes,
                    t.data + static_cast<size_t>(h * hd + j * hd / 2 + i) * row_bytes, row_bytes);
      }
    }
  }
  return out;
}

// Writes the HF model in `dir` as a GGUF file; returns its path.
std::string convert(const ModelFiles& hf, bool mixtral) {
  const ModelConfig& c = hf.config;
  const std::string arch = mixtral ? "llama" : "qwen3moe";
  testing::GgufWriter w;
  w.add_string("general.architecture", arch);
  w.add_u32(arch + ".context_length", static_cast<uint32_t>(c.max_position));
  w.add_u32(arch + ".embedding_length", static_cast<uint32_t>(c.n_embd));
  w.add_u32(arch + ".block_count", static_cast<uint32_t>(c.n_layer));
  w.add_u32(arch + ".feed_forward_length", static_cast<uint32_t>(c.n_ff));
  w.add_u32(arch + ".attention.head_count", static_cast<uint32_t>(c.n_head));
  w.add_u32(arch + ".attention.head_count_kv", static_cast<uint32_t>(c.n_head_kv));
  w.add_u32(arch + ".attention.key_length", static_cast<uint32_t>(c.head_dim));
  w.add_f32(arch + ".attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  w.add_f32(arch + ".rope.freq_base", c.rope_theta);
  w.add_u32(arch + ".expert_count", static_cast<uint32_t>(c.n_expert));
  w.add_u32(arch + ".expert_used_count", static_cast<uint32_t>(c.n_expert_used));
  if (!mixtral) w.add_u32(arch + ".expert_feed_forward_length", static_cast<uint32_t>(c.n_ff_expert));

  auto add = [&](const std::string& name, const TensorRef& t, std::vector<uint8_t> data) {
    w.add_tensor(name, kGgmlF32, std::vector<int64_t>(t.shape.rbegin(), t.shape.rend()), data);
  };
  auto add_as = [&](const std::string& name, const std::string& hf_name) {
    const TensorRef* t = hf.find(hf_name);
    EXPECT_TRUE(t) << hf_name;
    if (t) add(name, *t, bytes_of(*t));
  };
  add_as("token_embd.weight", "model.embed_tokens.weight");
  add_as("output_norm.weight", "model.norm.weight");
  add_as("output.weight", "lm_head.weight");
  const std::string moe = mixtral ? "block_sparse_moe." : "mlp.";
  const char* gate = mixtral ? "w1" : "gate_proj";
  const char* up = mixtral ? "w3" : "up_proj";
  const char* down = mixtral ? "w2" : "down_proj";
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const std::string p = "model.layers." + std::to_string(il) + ".";
    const std::string b = "blk." + std::to_string(il) + ".";
    add_as(b + "attn_norm.weight", p + "input_layernorm.weight");
    const TensorRef* q = hf.find(p + "self_attn.q_proj.weight");
    const TensorRef* k = hf.find(p + "self_attn.k_proj.weight");
    add(b + "attn_q.weight", *q, mixtral ? permute_heads(*q, c.n_head) : bytes_of(*q));
    add(b + "attn_k.weight", *k, mixtral ? permute_heads(*k, c.n_head_kv) : bytes_of(*k));
    add_as(b + "attn_v.weight", p + "self_attn.v_proj.weight");
    add_as(b + "attn_output.weight", p + "self_attn.o_proj.weight");
    if (!mixtral) {
      add_as(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight");
      add_as(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight");
    }
    add_as(b + "ffn_norm.weight", p + "post_attention_layernorm.weight");
    add_as(b + "ffn_gate_inp.weight", p + moe + "gate.weight");
    for (auto [gguf, proj] :
         {std::pair{"ffn_gate_exps.weight", gate}, {"ffn_up_exps.weight", up}, {"ffn_down_exps.weight", down}}) {
      TensorRef stacked;
      std::vector<uint8_t> data;
      for (int64_t e = 0; e < c.n_expert; ++e) {
        const TensorRef* t = hf.find(p + moe + "experts." + std::to_string(e) + "." + proj + ".weight");
        data.insert(data.end(), t->data, t->data + t->n_bytes);
        stacked.shape = {c.n_expert, t->shape[0], t->shape[1]};
      }
      add(b + gguf, stacked, std::move(data));
    }
  }
  return testing::write_temp_file(w.build(), (mixtral ? "mixtral" : "qwen3moe") + std::string(".gguf"));
}

class MoeGguf : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeGguf, ConvertedFileMatchesTransformers) {
  const std::string dir = kGoldens + GetParam();
  if (!std::filesystem::exists(dir + "/golden.json")) GTEST_SKIP() << dir << " not found";
  std::ifstream in(dir + "/golden.json");
  const nlohmann::json g = nlohmann::json::parse(in);
  const bool mixtral = GetParam() == "mixtral";
  auto hf = open_model_files(dir);
  ASSERT_TRUE(hf.ok()) << hf.error().message;
  const std::string path = convert(**hf, mixtral);

  auto files = open_model_files(path);
  ASSERT_TRUE(files.ok()) << files.error().message;
  const ModelConfig& c = (*files)->config;
  EXPECT_EQ(c.architecture, mixtral ? "mixtral" : "qwen3_moe");
  EXPECT_EQ(c.rope_style, mixtral ? RopeStyle::kInterleaved : RopeStyle::kHalf);
  EXPECT_EQ(c.n_expert, (*hf)->config.n_expert);
  EXPECT_EQ(c.n_expert_used, (*hf)->config.n_expert_used);
  EXPECT_EQ(c.n_ff_expert, (*hf)->config.n_ff_expert);
  EXPECT_TRUE(c.norm_topk_prob);
  ASSERT_TRUE((*files)->find("model.layers.0.mlp.experts.gate_proj.weight"));

  ModelOptions opts;
  opts.n_threads = 2;
  opts.n_ctx = 256;
  opts.max_batch_tokens = 7;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, opts);
  ASSERT_TRUE(model.ok()) << model.error().message;
  SequenceRunner runner(**model);
  const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto ref = g["logits"].get<std::vector<std::vector<float>>>();
  auto logits = runner.score(prompt);
  ASSERT_TRUE(logits.ok()) << logits.error().message;
  const int64_t V = (*model)->n_vocab();
  double max_err = 0;
  for (size_t t = 0; t < prompt.size(); ++t) {
    for (int64_t i = 0; i < V; ++i) max_err = std::max(max_err, std::fabs(double((*logits)[t * V + i]) - ref[t][i]));
  }
  EXPECT_LT(max_err, 1e-3) << GetParam() << " from GGUF: max |logit - reference| = " << max_err;

  runner.reset();
  GenerationOptions go;
  go.max_tokens = static_cast<int>(g["greedy_ids"].size());
  go.ignore_eos = true;
  go.sampling.temperature = 0;
  auto gen = runner.generate(prompt, go, [](int32_t) { return true; });
  ASSERT_TRUE(gen.ok()) << gen.error().message;
  EXPECT_EQ(gen->ids, g["greedy_ids"].get<std::vector<int32_t>>());
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(MoeFamilies, MoeGguf, ::testing::Values("mixtral", "qwen3-moe"), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
});

}  // namespace
}  // namespace rill
