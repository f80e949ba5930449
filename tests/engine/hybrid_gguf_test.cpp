// The hybrid gated-DeltaNet families from GGUF files: tests/data/gguf_hybrid
// holds the Hugging Face goldens qwen3_5 and qwen3-next converted the way
// llama.cpp's converter lays them out (architectures qwen35 and qwen3next;
// tools/make_hybrid_gguf.py, which also checked that llama.cpp gives
// transformers' logits on them) and llama.cpp's logits and greedy ids. rill
// must give llama.cpp's logits (1e-4) and transformers' (1e-3) at every
// prompt position, in chunks, and the greedy ids of both; a file missing a
// hybrid key or tensor is an error naming the file and the item.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "../loader/gguf_writer.h"
#include "engine/sequence_runner.h"
#include "golden_util.h"
#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

const std::string kData = std::string(RILL_TEST_DATA) + "/gguf_hybrid/";

struct Case {
  std::string name;    // tests/data/gguf_hybrid/<name>.{gguf,json}
  std::string golden;  // ../shared/goldens/hf/<golden>
  std::string architecture;
};

const Case kCases[] = {{"qwen3_5", "qwen3_5", "qwen3_5_text"}, {"qwen3_next", "qwen3-next", "qwen3_next"}};

struct LlamaCppGolden {
  std::vector<int32_t> prompt_ids, greedy_ids;
  std::vector<std::vector<float>> logits;  // [prompt position][n_vocab]
};

LlamaCppGolden read_llamacpp(const std::string& path) {
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  return {j["prompt_ids"].get<std::vector<int32_t>>(), j["greedy_ids"].get<std::vector<int32_t>>(),
          j["logits"].get<std::vector<std::vector<float>>>()};
}

double max_abs_diff(const std::vector<float>& got, const std::vector<std::vector<float>>& ref, int64_t V) {
  double m = 0;
  for (size_t t = 0; t < ref.size(); ++t) {
    for (int64_t i = 0; i < V; ++i) m = std::max(m, std::fabs(double(got[t * V + i]) - ref[t][i]));
  }
  return m;
}

std::unique_ptr<Model> load(const std::shared_ptr<ModelFiles>& files, int max_batch_tokens) {
  ModelOptions o;
  o.n_threads = 2;
  o.n_ctx = 128;
  o.max_batch_tokens = max_batch_tokens;
  auto model = create_model(builtin_registry(), infer_profile(*files), files, o);
  EXPECT_TRUE(model.ok()) << model.error().message;
  return model.ok() ? std::move(model).value() : nullptr;
}

class HybridGguf : public ::testing::TestWithParam<Case> {};

TEST_P(HybridGguf, ConfigMatchesTheHuggingFaceCheckpoint) {
  const Case& c = GetParam();
  const std::string dir = test::hf_golden_dir(c.golden);
  if (!test::has_hf_golden(dir)) GTEST_SKIP() << dir << " not found";
  auto gguf = open_model_files(kData + c.name + ".gguf");
  ASSERT_TRUE(gguf.ok()) << gguf.error().message;
  auto hf = open_model_files(dir);
  ASSERT_TRUE(hf.ok()) << hf.error().message;
  const ModelConfig& g = (*gguf)->config;
  const ModelConfig& h = (*hf)->config;
  EXPECT_EQ(g.architecture, c.architecture);
  EXPECT_EQ(infer_profile(**gguf).loader, "gguf");
  EXPECT_EQ(g.n_layer, h.n_layer);
  EXPECT_EQ(g.n_head, h.n_head);
  EXPECT_EQ(g.n_head_kv, h.n_head_kv);
  EXPECT_EQ(g.head_dim, h.head_dim);
  EXPECT_EQ(g.rope_dim, h.rope_dim);  // partial rotary: head_dim / 4
  EXPECT_EQ(g.n_expert, h.n_expert);
  EXPECT_EQ(g.n_ff_expert, h.n_ff_expert);
  EXPECT_EQ(g.n_ff_shared_expert, h.n_ff_shared_expert);
  for (const char* key : {"linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                          "linear_value_head_dim", "linear_conv_kernel_dim", "layer_types"}) {
    EXPECT_EQ(g.raw.at(key), h.raw.at(key)) << key;
  }
  // llama.cpp's names reach the linear-attention layers' canonical names.
  for (const char* name : {"linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight", "linear_attn.A",
                           "linear_attn.dt_bias", "linear_attn.conv1d.weight", "linear_attn.norm.weight",
                           "linear_attn.out_proj.weight", "post_attention_layernorm.weight"}) {
    EXPECT_TRUE((*gguf)->find(std::string("model.layers.0.") + name)) << name;
  }
  EXPECT_TRUE((*gguf)->find("model.layers.1.self_attn.q_proj.weight"));
}

TEST_P(HybridGguf, LogitsMatchLlamaCppAndTransformersGreedyIdsToo) {
  const Case& c = GetParam();
  const std::string dir = test::hf_golden_dir(c.golden);
  if (!test::has_hf_golden(dir)) GTEST_SKIP() << dir << " not found";
  const test::HfGolden hf = test::read_hf_golden(dir);
  const LlamaCppGolden lc = read_llamacpp(kData + c.name + ".json");
  ASSERT_EQ(lc.prompt_ids, hf.prompt_ids);
  auto files = open_model_files(kData + c.name + ".gguf");
  ASSERT_TRUE(files.ok()) << files.error().message;

  // Whole prompt in one step, and in chunks of 7 (state carried across steps).
  for (int chunk : {64, 7}) {
    std::unique_ptr<Model> model = load(*files, chunk);
    ASSERT_TRUE(model);
    SequenceRunner runner(*model);
    auto logits = runner.score(lc.prompt_ids);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    const int64_t V = model->n_vocab();
    const double vs_llamacpp = max_abs_diff(*logits, lc.logits, V);
    const double vs_transformers = max_abs_diff(*logits, hf.logits, V);
    EXPECT_LT(vs_llamacpp, 1e-4) << c.name << " chunk " << chunk << ": max |rill - llama.cpp| = " << vs_llamacpp;
    EXPECT_LT(vs_transformers, 1e-3) << c.name << " chunk " << chunk
                                     << ": max |rill - transformers| = " << vs_transformers;
    std::printf("%s.gguf, prefill chunk %d: max |logit diff| vs llama.cpp %.2e, vs transformers %.2e\n", c.name.c_str(),
                chunk, vs_llamacpp, vs_transformers);

    runner.reset();
    GenerationOptions go;
    go.max_tokens = static_cast<int>(hf.greedy_ids.size());
    go.ignore_eos = true;
    go.sampling.temperature = 0;
    auto gen = runner.generate(lc.prompt_ids, go, [](int32_t) { return true; });
    ASSERT_TRUE(gen.ok()) << gen.error().message;
    EXPECT_EQ(gen->ids, hf.greedy_ids) << c.name;
    EXPECT_EQ(gen->ids, lc.greedy_ids) << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(HybridFamilies, HybridGguf, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

// The committed file with one length-prefixed name (a metadata key or a
// tensor name) replaced by another of the same length, so the file stays
// valid and the original item is gone. Returns the new file's path.
std::string with_renamed(const std::string& file, const std::string& from, const std::string& to) {
  EXPECT_EQ(from.size(), to.size());
  std::ifstream in(kData + file, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  testing::ByteSink needle;
  needle.put_str(from);  // u64 length, then the bytes
  auto it = std::search(bytes.begin(), bytes.end(), needle.bytes.begin(), needle.bytes.end());
  EXPECT_NE(it, bytes.end()) << from << " not in " << file;
  if (it != bytes.end()) std::copy(to.begin(), to.end(), it + 8);
  return testing::write_temp_file(bytes, "renamed_" + file);
}

std::string load_error(const std::string& path) {
  auto files = open_model_files(path);
  if (!files.ok()) return files.error().message;
  ModelOptions o;
  o.n_threads = 1;
  o.n_ctx = 32;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, o);
  return model.ok() ? "(no error)" : model.error().message;
}

TEST(HybridGgufErrors, AMissingKeyOrTensorIsNamed) {
  for (const char* key : {"qwen35.ssm.conv_kernel", "qwen35.ssm.state_size", "qwen35.ssm.group_count",
                          "qwen35.ssm.time_step_rank", "qwen35.ssm.inner_size"}) {
    std::string gone = key;
    gone.back() = gone.back() == 'x' ? 'y' : 'x';
    const std::string path = with_renamed("qwen3_5.gguf", key, gone);
    EXPECT_EQ(load_error(path), path + ": missing metadata key '" + key + "'");
  }
  {
    const std::string path = with_renamed("qwen3_next.gguf", "blk.2.ssm_a", "blk.2.ssm_x");
    const std::string err = load_error(path);
    EXPECT_NE(err.find(path + ": missing tensor 'model.layers.2.linear_attn.A_log'"), std::string::npos) << err;
    EXPECT_NE(err.find("ssm_a"), std::string::npos) << err;
  }
  {
    const std::string path = with_renamed("qwen3_5.gguf", "blk.0.attn_gate.weight", "blk.0.attn_gate.weighx");
    EXPECT_EQ(load_error(path), path + ": missing tensor 'model.layers.0.linear_attn.in_proj_z.weight'");
  }
  {
    const std::string path = with_renamed("qwen3_next.gguf", "blk.0.ssm_ba.weight", "blk.0.ssm_ba.weighx");
    EXPECT_EQ(load_error(path), path + ": missing tensor 'model.layers.0.linear_attn.in_proj_b.weight'");
  }
}

TEST(HybridGguf, WithoutTheRecurrentLayerListTheIntervalDecides) {
  // As in llama.cpp: layer il is full attention when (il + 1) %
  // full_attention_interval == 0 (4 in the file, the converter's default).
  const std::string path =
      with_renamed("qwen3_5.gguf", "qwen35.attention.recurrent_layers", "qwen35.attention.recurrent_layerx");
  auto files = open_model_files(path);
  ASSERT_TRUE(files.ok()) << files.error().message;
  EXPECT_EQ((*files)->config.raw.at("layer_types"),
            nlohmann::json({"linear_attention", "linear_attention", "linear_attention", "full_attention"}));
}

}  // namespace
}  // namespace rill
