// The Gemma family implementation (model/arch/gemma.cpp) on the tiny HF
// goldens: two KV groups whose tables the model reads separately, batch
// invariance of the flat Batch, sliding-window holes that are never read,
// the same model from a GGUF file (llama.cpp's names, norms stored as 1 + w)
// against the transformers logits, and config errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "../loader/gguf_writer.h"
#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

namespace fs = std::filesystem;
const std::string kGoldens = std::string(RILL_SHARED_DIR) + "/goldens/hf/";
constexpr int32_t kBlock = 4;  // the goldens' window of 8 spans 2-3 blocks

Result<std::unique_ptr<Model>> open(const std::string& path, ModelOptions opts) {
  RILL_ASSIGN_OR_RETURN(auto files, open_model_files(path));
  return create_model(builtin_registry(), infer_profile(*files), files, opts);
}

nlohmann::json golden(const std::string& family) {
  std::ifstream in(kGoldens + family + "/golden.json");
  return nlohmann::json::parse(in);
}

ModelOptions small_options() {
  ModelOptions opts;
  opts.n_threads = 2;
  opts.n_ctx = 32;
  opts.n_kv_slots = 4;  // 4 * 8 = 32 blocks of 4 tokens
  opts.kv_block_size = kBlock;
  return opts;
}

// A table of `n` blocks from `ids`, one table per KV group.
struct Tables {
  std::vector<int32_t> sliding, full;
};

void add(Batch& b, const Tables& t, const int32_t* ids, int32_t n, int32_t pos0, bool all_rows = false) {
  // The Gemma model's groups: 0 sliding, 1 full.
  const int32_t s = b.add_sequence(ids, n, pos0, !all_rows, t.sliding);
  b.group_tables.resize(1);
  b.group_tables[0].resize(static_cast<size_t>(b.seqs[static_cast<size_t>(s)].table_start));
  b.group_tables[0].insert(b.group_tables[0].end(), t.full.begin(), t.full.end());
  if (all_rows) {
    for (int32_t i = 0; i < n; ++i) b.sample_rows.push_back(b.seqs[static_cast<size_t>(s)].q_start + i);
  }
}

class GemmaModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!fs::exists(kGoldens + GetParam() + "/golden.json")) GTEST_SKIP() << GetParam() << " golden not found";
    ids_ = golden(GetParam())["prompt_ids"].get<std::vector<int32_t>>();
  }
  std::vector<int32_t> ids_;
};

TEST_P(GemmaModelTest, DeclaresASlidingAndAFullGroup) {
  auto model = open(kGoldens + GetParam(), small_options());
  ASSERT_TRUE(model.ok()) << model.error().message;
  const KvSpec& spec = (*model)->kv_spec();
  ASSERT_EQ(spec.size(), 2u);
  EXPECT_EQ(spec[0].kind, LayerKind::kSliding);
  EXPECT_EQ(spec[0].window, 8);
  EXPECT_EQ(spec[1].kind, LayerKind::kFull);
}

// Scattered tables, different in each group: two sequences of different
// lengths (both longer than the window) batched give, row for row, the
// logits each gives alone, on the prefill step and on a batched decode step.
TEST_P(GemmaModelTest, BatchedRowsEqualSingleSequenceRows) {
  auto model = open(kGoldens + GetParam(), small_options());
  ASSERT_TRUE(model.ok()) << model.error().message;
  Model& m = **model;
  const size_t V = static_cast<size_t>(m.n_vocab());
  const Tables a1{{11, 2, 7, 4, 20, 21}, {0, 9, 5, 1, 22, 23}};
  const Tables a2{{3, 10, 6, 8, 24, 25}, {12, 13, 14, 15, 26, 27}};  // A again, elsewhere
  const Tables b1{{16, 17, 18, 19}, {28, 29, 30, 31}};
  const int32_t n_a = 19, n_b = 13;

  std::vector<float> alone_a(V), alone_b(V), batched(2 * V);
  Batch b;
  add(b, a1, ids_.data(), n_a, 0);
  ASSERT_TRUE(m.forward(b, alone_a.data()).ok());
  b.clear();
  add(b, b1, ids_.data() + 3, n_b, 0);
  ASSERT_TRUE(m.forward(b, alone_b.data()).ok());
  b.clear();
  add(b, a2, ids_.data(), n_a, 0);
  add(b, b1, ids_.data() + 3, n_b, 0);
  ASSERT_TRUE(m.forward(b, batched.data()).ok());
  for (size_t i = 0; i < V; ++i) {
    ASSERT_EQ(batched[i], alone_a[i]) << "sequence A, logit " << i;
    ASSERT_EQ(batched[V + i], alone_b[i]) << "sequence B, logit " << i;
  }

  const int32_t next_a = 5, next_b = 7;
  std::vector<float> step_a(V), step_b(V), step_ab(2 * V);
  b.clear();
  add(b, a1, &next_a, 1, n_a);
  ASSERT_TRUE(m.forward(b, step_a.data()).ok());
  b.clear();
  add(b, a2, &next_a, 1, n_a);
  add(b, b1, &next_b, 1, n_b);
  ASSERT_TRUE(m.forward(b, step_ab.data()).ok());
  b.clear();
  add(b, b1, &next_b, 1, n_b);
  ASSERT_TRUE(m.forward(b, step_b.data()).ok());
  for (size_t i = 0; i < V; ++i) {
    ASSERT_EQ(step_ab[i], step_a[i]) << "decode A, logit " << i;
    ASSERT_EQ(step_ab[V + i], step_b[i]) << "decode B, logit " << i;
  }
}

// The sliding group's blocks wholly before the window are never read: a
// decode step at position 20 (window [13, 20]) gives the same logits when
// those entries are -1 (released) or name blocks another sequence has since
// filled, and the full group's table is what full layers read (a wrong full
// table changes the logits).
TEST_P(GemmaModelTest, SlidingHolesAreNeverRead) {
  auto model = open(kGoldens + GetParam(), small_options());
  ASSERT_TRUE(model.ok()) << model.error().message;
  Model& m = **model;
  const size_t V = static_cast<size_t>(m.n_vocab());
  const int32_t n = 20;
  const Tables t{{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}};
  std::vector<float> prefill(V), want(V), got(V);
  Batch b;
  add(b, t, ids_.data(), n, 0);
  ASSERT_TRUE(m.forward(b, prefill.data()).ok());
  const int32_t next = ids_[static_cast<size_t>(n)];
  b.clear();
  add(b, t, &next, 1, n);
  ASSERT_TRUE(m.forward(b, want.data()).ok());

  // Another sequence writes blocks 12.. in both groups.
  const Tables other{{12, 13, 14, 15}, {16, 17, 18, 19}};
  std::vector<float> scratch(V);
  b.clear();
  add(b, other, ids_.data() + 1, 16, 0);
  ASSERT_TRUE(m.forward(b, scratch.data()).ok());

  // Position 20 attends to [13, 20]: sliding blocks 0..2 (positions 0-11) are dead.
  for (const std::vector<int32_t>& dead : {std::vector<int32_t>{-1, -1, -1}, std::vector<int32_t>{12, 13, 14}}) {
    Tables holed = t;
    std::copy(dead.begin(), dead.end(), holed.sliding.begin());
    b.clear();
    add(b, holed, &next, 1, n);
    ASSERT_TRUE(m.forward(b, got.data()).ok());
    for (size_t i = 0; i < V; ++i) ASSERT_EQ(got[i], want[i]) << "dead entries " << dead[0] << ", logit " << i;
  }
  // A hole inside the window is an error, in either group.
  Tables bad = t;
  bad.sliding[3] = -1;  // positions 12-15
  b.clear();
  add(b, bad, &next, 1, n);
  EXPECT_FALSE(m.forward(b, got.data()).ok());
  bad = t;
  bad.full[0] = -1;
  b.clear();
  add(b, bad, &next, 1, n);
  EXPECT_FALSE(m.forward(b, got.data()).ok());
  // The full layers read the full group's table: pointing it at the other
  // sequence's blocks changes the logits.
  Tables swapped = t;
  std::copy(other.full.begin(), other.full.end(), swapped.full.begin());
  b.clear();
  add(b, swapped, &next, 1, n);
  ASSERT_TRUE(m.forward(b, got.data()).ok());
  EXPECT_NE(got, want);
}

TEST_P(GemmaModelTest, MissingGroupTableIsAnError) {
  auto model = open(kGoldens + GetParam(), small_options());
  ASSERT_TRUE(model.ok()) << model.error().message;
  std::vector<float> logits(static_cast<size_t>((*model)->n_vocab()));
  Batch b;
  b.add_sequence(ids_.data(), 4, 0, true, slot_block_table(0, 32, kBlock));
  const auto st = (*model)->forward(b, logits.data());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("KV groups"), std::string::npos) << st.error().message;
}

// --- GGUF -------------------------------------------------------------------

// The golden checkpoint written as llama.cpp's converter writes a Gemma
// GGUF: its tensor names, f32 data, every norm weight stored as 1 + w.
std::string write_gguf(const std::string& family) {
  auto files = open_model_files(kGoldens + family);
  EXPECT_TRUE(files.ok()) << files.error().message;
  const ModelConfig& c = (*files)->config;
  const bool gemma2 = family == "gemma2";
  const std::string arch = gemma2 ? "gemma2" : "gemma3";
  testing::GgufWriter w;
  w.add_string("general.architecture", arch);
  w.add_u32(arch + ".context_length", static_cast<uint32_t>(c.max_position));
  w.add_u32(arch + ".embedding_length", static_cast<uint32_t>(c.n_embd));
  w.add_u32(arch + ".block_count", static_cast<uint32_t>(c.n_layer));
  w.add_u32(arch + ".feed_forward_length", static_cast<uint32_t>(c.n_ff));
  w.add_u32(arch + ".attention.head_count", static_cast<uint32_t>(c.n_head));
  w.add_u32(arch + ".attention.head_count_kv", static_cast<uint32_t>(c.n_head_kv));
  w.add_u32(arch + ".attention.key_length", static_cast<uint32_t>(c.head_dim));
  w.add_u32(arch + ".attention.value_length", static_cast<uint32_t>(c.head_dim));
  w.add_f32(arch + ".attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  w.add_f32(arch + ".rope.freq_base", c.rope_theta);
  w.add_u32(arch + ".attention.sliding_window", static_cast<uint32_t>(c.sliding_window));
  if (gemma2) {
    w.add_f32(arch + ".attn_logit_softcapping", c.raw["attn_logit_softcapping"].get<float>());
    w.add_f32(arch + ".final_logit_softcapping", c.raw["final_logit_softcapping"].get<float>());
  } else {
    w.add_u32(arch + ".attention.sliding_window_pattern", c.raw["sliding_window_pattern"].get<uint32_t>());
  }
  const std::map<std::string, std::string> kNames = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  for (const auto& [name, t] : (*files)->tensors) {
    std::string gguf;
    if (name == "model.embed_tokens.weight") gguf = "token_embd.weight";
    if (name == "model.norm.weight") gguf = "output_norm.weight";
    if (name.starts_with("model.layers.")) {
      const size_t dot = name.find('.', 13);
      gguf = "blk." + name.substr(13, dot - 13) + "." + kNames.at(name.substr(dot + 1));
    }
    EXPECT_FALSE(gguf.empty()) << name;
    std::vector<float> v(static_cast<size_t>(t.n_elements()));
    std::memcpy(v.data(), t.data, v.size() * sizeof(float));
    if (name.ends_with("norm.weight")) {
      for (float& x : v) x += 1.0f;
    }
    std::vector<uint8_t> bytes(v.size() * sizeof(float));
    std::memcpy(bytes.data(), v.data(), bytes.size());
    w.add_tensor(gguf, /*F32*/ 0, std::vector<int64_t>(t.shape.rbegin(), t.shape.rend()), bytes);
  }
  return testing::write_temp_file(w.build(), family + ".gguf");
}

TEST_P(GemmaModelTest, GgufFileMatchesTransformers) {
  // Gemma 4: the golden as llama.cpp's converter writes it (tools/make_family_gguf.py).
  const bool gemma4 = GetParam().rfind("gemma4", 0) == 0;
  const std::string path = gemma4 ? std::string(RILL_TEST_DATA) + "/gguf_families/" +
                                        (GetParam() == "gemma4" ? "gemma4.gguf" : "gemma4_moe.gguf")
                                  : write_gguf(GetParam());
  ModelOptions opts = small_options();
  opts.max_batch_tokens = 32;
  auto model = open(path, opts);
  ASSERT_TRUE(model.ok()) << model.error().message;
  Model& m = **model;
  EXPECT_EQ(m.config().architecture, GetParam() == "gemma2" ? "gemma2" : gemma4 ? "gemma4_text" : "gemma3_text");
  ASSERT_EQ(m.kv_spec().size(), 2u);
  const auto g = golden(GetParam());
  const auto ref = g["logits"].get<std::vector<std::vector<float>>>();
  const auto n = static_cast<int32_t>(ids_.size());
  const size_t V = static_cast<size_t>(m.n_vocab());
  std::vector<float> logits(static_cast<size_t>(n) * V);
  Batch b;
  add(b, Tables{slot_block_table(0, 32, kBlock), slot_block_table(1, 32, kBlock)}, ids_.data(), n, 0, true);
  ASSERT_TRUE(m.forward(b, logits.data()).ok());
  double max_err = 0;
  for (size_t t = 0; t < static_cast<size_t>(n); ++t) {
    for (size_t i = 0; i < V; ++i) max_err = std::max(max_err, std::fabs(double(logits[t * V + i]) - ref[t][i]));
  }
  EXPECT_LT(max_err, 1e-3) << GetParam() << " from GGUF";
  if (!gemma4) fs::remove(path);
}

INSTANTIATE_TEST_SUITE_P(GemmaFamily, GemmaModelTest, ::testing::Values("gemma2", "gemma3", "gemma4", "gemma4-moe"));

// --- config -----------------------------------------------------------------

TEST(GemmaModel, RegistryBindsEveryGemmaModelType) {
  for (const char* graph : {"gemma2", "gemma3_text", "gemma3", "gemma4_text", "gemma4"}) {
    for (const char* loader : {"hf", "gguf"}) {
      ModelProfile p{graph, loader, "autoregressive", std::nullopt, std::nullopt, std::nullopt};
      auto cpu = builtin_registry().select(p, Device::kCpu);
      ASSERT_TRUE(cpu.ok()) << graph << ": " << cpu.error().message;
      EXPECT_EQ((*cpu)->id, "gemma.cpu");
      auto cuda = builtin_registry().select(p, Device::kCuda);
      ASSERT_TRUE(cuda.ok()) << graph << ": " << cuda.error().message;
      EXPECT_EQ((*cuda)->id, "gemma.cuda");
    }
  }
}

// Writes the golden's files with an edited config.json to a temp dir.
std::string with_config(const std::string& family, const std::function<void(nlohmann::json&)>& edit) {
  const fs::path dir = fs::temp_directory_path() / ("rill_gemma_cfg_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(kGoldens + family + "/model.safetensors", dir / "model.safetensors",
                fs::copy_options::overwrite_existing);
  std::ifstream in(kGoldens + family + "/config.json");
  auto cfg = nlohmann::json::parse(in);
  edit(cfg);
  std::ofstream(dir / "config.json") << cfg.dump();
  return dir.string();
}

TEST(GemmaModel, ConfigErrorsNameTheFileAndField) {
  if (!fs::exists(kGoldens + "gemma3/golden.json")) GTEST_SKIP();
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    const char* want;
  };
  const Case kCases[] = {
      {[](nlohmann::json& c) { c["hidden_activation"] = "relu"; }, "hidden_activation 'relu'"},
      {[](nlohmann::json& c) { c["layer_types"] = {"sliding_attention"}; }, "'layer_types'"},
      {[](nlohmann::json& c) { c["layer_types"][1] = "chunked_attention"; }, "chunked_attention"},
      {[](nlohmann::json& c) { c["query_pre_attn_scalar"] = "16"; }, "'query_pre_attn_scalar'"},
  };
  for (const Case& k : kCases) {
    const std::string dir = with_config("gemma3", k.edit);
    auto model = open(dir, small_options());
    ASSERT_FALSE(model.ok()) << k.want;
    EXPECT_NE(model.error().message.find(k.want), std::string::npos) << model.error().message;
    EXPECT_NE(model.error().message.find("config.json"), std::string::npos) << model.error().message;
    fs::remove_all(dir);
  }
}

// gemma2's softcaps are read from config.json and applied: removing either
// changes the logits (the final one by more than the tolerance; the
// attention one, with this model's small scores, by less: see
// tests/engine/gemma_parity_test.cpp).
TEST(GemmaModel, LogitSoftcapsAreHonored) {
  if (!fs::exists(kGoldens + "gemma2/golden.json")) GTEST_SKIP();
  const auto ids = golden("gemma2")["prompt_ids"].get<std::vector<int32_t>>();
  auto all_logits = [&](const std::function<void(nlohmann::json&)>& edit) {
    const std::string dir = with_config("gemma2", edit);
    auto model = open(dir, small_options());
    EXPECT_TRUE(model.ok()) << model.error().message;
    const auto n = static_cast<int32_t>(ids.size());
    std::vector<float> out(static_cast<size_t>(n * (*model)->n_vocab()));
    Batch b;
    add(b, Tables{slot_block_table(0, 32, kBlock), slot_block_table(1, 32, kBlock)}, ids.data(), n, 0, true);
    EXPECT_TRUE((*model)->forward(b, out.data()).ok());
    fs::remove_all(dir);
    return out;
  };
  auto max_diff = [](const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
    return d;
  };
  const auto capped = all_logits([](nlohmann::json&) {});
  const auto no_final = all_logits([](nlohmann::json& c) { c["final_logit_softcapping"] = nullptr; });
  const auto no_attn = all_logits([](nlohmann::json& c) { c["attn_logit_softcapping"] = nullptr; });
  const auto tight_attn = all_logits([](nlohmann::json& c) { c["attn_logit_softcapping"] = 0.05; });
  EXPECT_GT(max_diff(capped, no_final), 1e-3);
  EXPECT_GT(max_diff(capped, no_attn), 1e-5);
  EXPECT_GT(max_diff(capped, tight_attn), 1e-2);
  for (float x : capped) EXPECT_LT(std::fabs(x), 30.0f);
}

// Without layer_types the pattern decides: every 2nd layer full (as the
// golden), so the logits are the same; all-full layers change them.
TEST(GemmaModel, SlidingWindowPatternWithoutLayerTypes) {
  if (!fs::exists(kGoldens + "gemma3/golden.json")) GTEST_SKIP();
  const auto ids = golden("gemma3")["prompt_ids"].get<std::vector<int32_t>>();
  auto last_logits = [&](const std::function<void(nlohmann::json&)>& edit) {
    const std::string dir = with_config("gemma3", edit);
    auto model = open(dir, small_options());
    EXPECT_TRUE(model.ok()) << model.error().message;
    std::vector<float> out(static_cast<size_t>((*model)->n_vocab()));
    Batch b;
    const auto n = static_cast<int32_t>(ids.size());
    if ((*model)->kv_spec().size() == 2) {
      add(b, Tables{slot_block_table(0, 32, kBlock), slot_block_table(1, 32, kBlock)}, ids.data(), n, 0);
    } else {
      b.add_sequence(ids.data(), n, 0, true, slot_block_table(0, 32, kBlock));
    }
    EXPECT_TRUE((*model)->forward(b, out.data()).ok());
    fs::remove_all(dir);
    return out;
  };
  const auto with_types = last_logits([](nlohmann::json&) {});
  const auto with_pattern = last_logits([](nlohmann::json& c) { c.erase("layer_types"); });
  const auto all_full = last_logits([](nlohmann::json& c) {
    c.erase("layer_types");
    c["sliding_window_pattern"] = 1;
  });
  EXPECT_EQ(with_pattern, with_types);
  EXPECT_NE(all_full, with_types);
}

// Gemma 4's KV layout: layers 4 and 5 read layer 3's and layer 2's KV
// (num_kv_shared_layers 2), so only layers 0-3 keep KV, the full layer's
// rows twice as wide (2 KV heads of 32 against 2 of 16), declared per group.
TEST(GemmaModel, Gemma4DeclaresItsKvLayersAndWidths) {
  if (!fs::exists(kGoldens + "gemma4/golden.json")) GTEST_SKIP();
  auto model = open(kGoldens + "gemma4", small_options());
  ASSERT_TRUE(model.ok()) << model.error().message;
  const Model& m = **model;
  ASSERT_EQ(m.kv_spec().size(), 2u);
  EXPECT_EQ(m.kv_spec()[0].row_width, 32);
  EXPECT_EQ(m.kv_spec()[1].row_width, 64);
  const auto layers = m.kv_layers();
  ASSERT_EQ(layers.size(), 4u);
  const int32_t groups[] = {0, 0, 1, 0};
  const size_t row_bytes[] = {128, 128, 256, 128};  // f32
  for (size_t l = 0; l < 4; ++l) {
    EXPECT_EQ(layers[l].group, groups[l]) << "layer " << l;
    EXPECT_EQ(layers[l].dtype, DType::kF32);
    EXPECT_EQ(layers[l].row_bytes, row_bytes[l]) << "layer " << l;
  }
  EXPECT_EQ(m.kv_bytes_per_token(), 2u * (128 + 128 + 256 + 128));
}

// gemma4-moe (the 26B-A4B shape): full layers have one KV head of 32 whose
// K is also V, so both groups' rows are 32 wide; every layer keeps KV.
TEST(GemmaModel, Gemma4MoeKeepsOneKvHeadOnFullLayers) {
  if (!fs::exists(kGoldens + "gemma4-moe/golden.json")) GTEST_SKIP();
  auto model = open(kGoldens + "gemma4-moe", small_options());
  ASSERT_TRUE(model.ok()) << model.error().message;
  const Model& m = **model;
  ASSERT_EQ(m.kv_spec().size(), 2u);
  EXPECT_EQ(m.kv_spec()[0].row_width, 32);
  EXPECT_EQ(m.kv_spec()[1].row_width, 32);
  ASSERT_EQ(m.kv_layers().size(), 4u);
  EXPECT_EQ(m.kv_bytes_per_token(), 2u * 4 * 128);
}

// What Gemma 4 reads from config.json matters: each edit changes the
// logits of the golden (or, where the weights no longer fit, is refused).
TEST(GemmaModel, Gemma4ConfigFieldsAreHonored) {
  if (!fs::exists(kGoldens + "gemma4/golden.json")) GTEST_SKIP();
  const auto ids = golden("gemma4")["prompt_ids"].get<std::vector<int32_t>>();
  auto logits = [&](const std::function<void(nlohmann::json&)>& edit) {
    const std::string dir = with_config("gemma4", edit);
    auto model = open(dir, small_options());
    EXPECT_TRUE(model.ok()) << model.error().message;
    std::vector<float> out;
    if (!model.ok()) return out;
    const auto n = static_cast<int32_t>(ids.size());
    out.resize(static_cast<size_t>(n * (*model)->n_vocab()));
    Batch b;
    add(b, Tables{slot_block_table(0, 32, kBlock), slot_block_table(1, 32, kBlock)}, ids.data(), n, 0, true);
    EXPECT_TRUE((*model)->forward(b, out.data()).ok());
    fs::remove_all(dir);
    return out;
  };
  auto max_diff = [](const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
    return d;
  };
  const auto base = logits([](nlohmann::json&) {});
  ASSERT_FALSE(base.empty());
  const auto full_rope =
      logits([](nlohmann::json& c) { c["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 1.0; });
  const auto no_cap = logits([](nlohmann::json& c) { c["final_logit_softcapping"] = nullptr; });
  const auto local_base =
      logits([](nlohmann::json& c) { c["rope_parameters"]["sliding_attention"]["rope_theta"] = 500.0; });
  EXPECT_GT(max_diff(base, full_rope), 1e-4);
  EXPECT_GT(max_diff(base, no_cap), 1e-3);
  EXPECT_GT(max_diff(base, local_base), 1e-4);
}

// A gemma4 (multimodal) checkpoint: its text model's fields in text_config
// and its tensors under model.language_model. give the text model's logits.
TEST(GemmaModel, Gemma4MultimodalCheckpointRunsItsTextModel) {
  if (!fs::exists(kGoldens + "gemma4/golden.json")) GTEST_SKIP();
  const fs::path dir = fs::temp_directory_path() / ("rill_gemma4_mm_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {  // safetensors: u64 header length, JSON header, data (offsets relative to the data)
    std::ifstream in(kGoldens + "gemma4/model.safetensors", std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), sizeof n);
    const auto header = nlohmann::json::parse(bytes.substr(8, n));
    nlohmann::json renamed = nlohmann::json::object();
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string k = it.key();
      renamed[k.rfind("model.", 0) == 0 ? "model.language_model." + k.substr(6) : k] = it.value();
    }
    const std::string h = renamed.dump();
    const uint64_t hn = h.size();
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    out.write(reinterpret_cast<const char*>(&hn), sizeof hn);
    out << h << bytes.substr(8 + n);
  }
  std::ifstream cin(kGoldens + "gemma4/config.json");
  const auto text = nlohmann::json::parse(cin);
  nlohmann::json cfg = {
      {"model_type", "gemma4"}, {"architectures", {"Gemma4ForConditionalGeneration"}}, {"text_config", text}};
  std::ofstream(dir / "config.json") << cfg.dump();
  auto model = open(dir.string(), small_options());
  ASSERT_TRUE(model.ok()) << model.error().message;
  const auto g = golden("gemma4");
  const auto ids = g["prompt_ids"].get<std::vector<int32_t>>();
  const auto ref = g["logits"].get<std::vector<std::vector<float>>>();
  const auto n = static_cast<int32_t>(ids.size());
  const size_t V = static_cast<size_t>((*model)->n_vocab());
  std::vector<float> logits(static_cast<size_t>(n) * V);
  Batch b;
  add(b, Tables{slot_block_table(0, 32, kBlock), slot_block_table(1, 32, kBlock)}, ids.data(), n, 0, true);
  ASSERT_TRUE((*model)->forward(b, logits.data()).ok());
  double max_err = 0;
  for (size_t t = 0; t < static_cast<size_t>(n); ++t) {
    for (size_t i = 0; i < V; ++i) max_err = std::max(max_err, std::fabs(double(logits[t * V + i]) - ref[t][i]));
  }
  EXPECT_LT(max_err, 1e-3);
  fs::remove_all(dir);
}

TEST(GemmaModel, Gemma4ConfigErrorsNameTheField) {
  if (!fs::exists(kGoldens + "gemma4/golden.json")) GTEST_SKIP();
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    const char* want;
  };
  const Case kCases[] = {
      {[](nlohmann::json& c) {
         c["per_layer_config"]["9"] = {{"head_dim", 32}};
       },
       "per_layer_config.9"},
      {[](nlohmann::json& c) {
         c["per_layer_config"]["2"] = {{"sliding_window", 4}};
       },
       "per_layer_config.2.sliding_window"},
      {[](nlohmann::json& c) {
         c["per_layer_config"]["2"] = {{"head_dim", 31}};
       },
       "head_dim 31"},
      {[](nlohmann::json& c) { c["num_kv_shared_layers"] = 6; }, "no earlier layer"},
      {[](nlohmann::json& c) { c["num_kv_shared_layers"] = 0; }, "k_proj"},
      {[](nlohmann::json& c) { c["rope_parameters"]["sliding_attention"]["rope_type"] = "linear"; },
       "sliding_attention"},
      {[](nlohmann::json& c) { c["use_bidirectional_attention"] = "all"; }, "use_bidirectional_attention"},
  };
  for (const Case& k : kCases) {
    const std::string dir = with_config("gemma4", k.edit);
    auto model = open(dir, small_options());
    ASSERT_FALSE(model.ok()) << k.want;
    EXPECT_NE(model.error().message.find(k.want), std::string::npos) << model.error().message;
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace rill
