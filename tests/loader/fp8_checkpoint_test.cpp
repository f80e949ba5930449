// FP8 checkpoints (loader/fp8_checkpoint.h) against tests/data/fp8/, made by
// tools/make_fp8_checkpoint.py from the HF goldens:
//  - every FP8 weight's F32 dequantization is numpy's f32 q x scale
//    (dequantized.safetensors), bit for bit; where rows
//    have one scale, the stored e4m3 and row scales give numpy's f32 values
//    exactly, and the scale tensors are not model tensors;
//  - quantization_config fields rill cannot honor are Errors naming
//    config.json and the field;
//  - malformed files (missing scale, wrong scale shape, FP8 without a
//    config, a scale without its weight) are Errors naming file and tensor.
#include "loader/fp8_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "loader/model_files.h"

namespace rill {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
const std::string kData = std::string(RILL_TEST_DATA) + "/fp8/";

struct Case {
  std::string dir;
  bool per_row;  // every FP8 weight has one scale per row (the CUDA backend uploads e4m3 as stored)
};
const Case kCases[] = {
    {"llama-fp8-block", false}, {"llama-ct-channel", true}, {"llama-ct-tensor", true}, {"qwen3-fp8-block", false}};

TEST(Fp8Checkpoint, DequantizedWeightsEqualNumpys) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.dir);
    auto files = open_model_files(kData + c.dir);
    ASSERT_TRUE(files.ok()) << files.error().message;
    auto ref = open_safetensors(kData + c.dir + "/dequantized.safetensors");
    ASSERT_TRUE(ref.ok()) << ref.error().message;
    ASSERT_GT(ref->tensors.size(), 10u);
    for (const SafetensorsTensor& r : ref->tensors) {
      const TensorRef* t = (*files)->find(r.name);
      ASSERT_NE(t, nullptr) << r.name;
      ASSERT_TRUE(t->fp8) << r.name;
      ASSERT_EQ(t->dtype, DType::kF32);
      ASSERT_EQ(t->shape, r.shape);
      for (const char* scale : {"_scale", "_scale_inv"}) EXPECT_EQ((*files)->find(r.name + scale), nullptr);
      const int64_t cols = r.shape[1];
      ASSERT_EQ(t->e4m3 != nullptr, c.per_row) << r.name;
      int64_t bad = 0, bad_e4m3 = 0;
      for (int64_t i = 0; i < t->n_elements(); ++i) {
        float want;
        std::memcpy(&want, r.data + 4 * i, 4);
        float got;
        std::memcpy(&got, t->data + 4 * i, 4);
        bad += std::memcmp(&got, &want, 4) != 0;
        if (t->e4m3) bad_e4m3 += e4m3_to_f32(t->e4m3[i]) * t->e4m3_scales[i / cols] != want;
      }
      EXPECT_EQ(bad, 0) << r.name;
      EXPECT_EQ(bad_e4m3, 0) << r.name;
    }
    // Unquantized weights (norms, embeddings, lm_head) stay as stored.
    const TensorRef* head = (*files)->find("lm_head.weight");
    ASSERT_NE(head, nullptr);
    EXPECT_FALSE(head->fp8);
    EXPECT_EQ(head->dtype, DType::kF32);
  }
}

TEST(Fp8Checkpoint, E4m3AndE5m2Values) {
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_EQ(e5m2_to_f32(0x3c), 1.0f);
  EXPECT_EQ(e5m2_to_f32(0x7b), 57344.0f);
}

// --- quantization_config ----------------------------------------------------

json ct_config() {
  std::ifstream in(kData + "llama-ct-channel/config.json");
  return json::parse(in);
}

std::string scheme_error(const json& config) {
  auto s = parse_fp8_scheme(config, "m/config.json");
  return s.ok() ? std::string("(accepted)") : s.error().message;
}

TEST(Fp8Checkpoint, ReadsBothLayouts) {
  std::ifstream in(kData + "llama-fp8-block/config.json");
  auto fp8 = parse_fp8_scheme(json::parse(in), "config.json");
  ASSERT_TRUE(fp8.ok()) << fp8.error().message;
  EXPECT_EQ(fp8->layout, Fp8Scheme::Layout::kFp8);
  EXPECT_EQ(fp8->block_rows, 32);
  EXPECT_EQ(fp8->block_cols, 48);
  json j = {{"quantization_config", {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}}}};
  EXPECT_EQ(parse_fp8_scheme(j, "c")->block_cols, 128);  // transformers' default block
  auto ct = parse_fp8_scheme(ct_config(), "config.json");
  ASSERT_TRUE(ct.ok()) << ct.error().message;
  EXPECT_EQ(ct->layout, Fp8Scheme::Layout::kCompressedTensors);
  EXPECT_EQ(ct->strategy, Fp8Scheme::Strategy::kChannel);
  EXPECT_EQ(parse_fp8_scheme(json::object(), "c")->layout, Fp8Scheme::Layout::kNone);
}

TEST(Fp8Checkpoint, RefusesWhatItCannotHonorNamingTheField) {
  const std::string prefix = "m/config.json: quantization_config.";
  json j = ct_config();
  j["quantization_config"]["quant_method"] = "awq";
  EXPECT_EQ(scheme_error(j).rfind(prefix + "quant_method is \"awq\"", 0), 0u) << scheme_error(j);
  j = {{"quantization_config", {{"quant_method", "fp8"}, {"activation_scheme", "static"}}}};
  EXPECT_EQ(scheme_error(j).rfind(prefix + "activation_scheme", 0), 0u) << scheme_error(j);
  j = {{"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {128}}}}};
  EXPECT_EQ(scheme_error(j).rfind(prefix + "weight_block_size", 0), 0u) << scheme_error(j);
  j = {{"quantization_config", {{"quant_method", "fp8"}, {"fmt", "e4m3"}}}};
  EXPECT_EQ(scheme_error(j), "(accepted)");
  j["quantization_config"]["fmt"] = "e5m2";
  EXPECT_EQ(scheme_error(j).rfind(prefix + "fmt is \"e5m2\"", 0), 0u) << scheme_error(j);
  j = {{"quantization_config", {{"quant_method", "fp8"}, {"input_scale", 1.0}}}};
  EXPECT_EQ(scheme_error(j).rfind(prefix + "input_scale is not supported", 0), 0u) << scheme_error(j);
  EXPECT_EQ(scheme_error({{"quantization_config", 3}}), "m/config.json: quantization_config must be an object");

  const std::string g = "config_groups.group_0.";
  auto edit = [&](const std::function<void(json&)>& f) {
    json c = ct_config();
    f(c["quantization_config"]);
    return scheme_error(c);
  };
  EXPECT_EQ(edit([](json& q) {
              q["config_groups"]["group_0"]["input_activations"]["dynamic"] = false;
            }).rfind(prefix + g + "input_activations.dynamic", 0),
            0u);
  EXPECT_EQ(edit([](json& q) {
              q["config_groups"]["group_0"]["weights"]["strategy"] = "group";
            }).rfind(prefix + g + "weights.strategy", 0),
            0u);
  EXPECT_EQ(edit([](json& q) {
              q["config_groups"]["group_0"]["weights"]["num_bits"] = 4;
            }).rfind(prefix + g + "weights.num_bits", 0),
            0u);
  EXPECT_EQ(edit([](json& q) {
              q["config_groups"]["group_0"]["weights"]["symmetric"] = false;
            }).rfind(prefix + g + "weights.symmetric", 0),
            0u);
  EXPECT_EQ(edit([](json& q) {
              q["config_groups"]["group_0"]["output_activations"] = json::object();
            }).rfind(prefix + g + "output_activations", 0),
            0u);
  EXPECT_EQ(edit([](json& q) { q["format"] = "int-quantized"; }).rfind(prefix + "format", 0), 0u);
  EXPECT_EQ(edit([](json& q) {
              q["kv_cache_scheme"] = json::object({{"num_bits", 8}});
            }).rfind(prefix + "kv_cache_scheme", 0),
            0u);
  EXPECT_EQ(edit([](json& q) { q["quantization_status"] = "frozen"; }).rfind(prefix + "quantization_status", 0), 0u);
  EXPECT_EQ(edit([](json& q) {
              q["config_groups"]["group_1"] = q["config_groups"]["group_0"];
              q["config_groups"]["group_1"]["weights"]["strategy"] = "tensor";
            }).rfind(prefix + "config_groups.group_1.weights differs", 0),
            0u);
}

// --- malformed files --------------------------------------------------------

struct Entry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// The committed checkpoint's tensors, for editing.
std::vector<Entry> entries_of(const std::string& dir) {
  auto f = open_safetensors(kData + dir + "/model.safetensors");
  EXPECT_TRUE(f.ok());
  std::vector<Entry> out;
  for (const SafetensorsTensor& t : f->tensors) {
    const char* dtype = t.float8 == Float8::kE4M3 ? "F8_E4M3" : t.dtype == DType::kBF16 ? "BF16" : "F32";
    out.push_back({t.name, dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.n_bytes)});
  }
  return out;
}

// A temp model dir: `config` and the entries as model.safetensors.
std::string write_model(const json& config, const std::vector<Entry>& entries) {
  const fs::path dir = fs::temp_directory_path() /
                       ("rill_fp8_" + std::to_string(::testing::UnitTest::GetInstance()->current_test_info()->line()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump();
  json header = json::object();
  std::vector<uint8_t> data;
  for (const Entry& e : entries) {
    header[e.name] = {
        {"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {data.size(), data.size() + e.bytes.size()}}};
    data.insert(data.end(), e.bytes.begin(), e.bytes.end());
  }
  std::string h = header.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  const uint64_t n = h.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << h;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  return dir.string();
}

std::string open_error(const std::string& dir) {
  auto f = open_model_files(dir);
  fs::remove_all(dir);
  return f.ok() ? std::string("(opened)") : f.error().message;
}

const std::string kQ = "model.layers.1.self_attn.k_proj.weight";

TEST(Fp8Checkpoint, MissingScaleNamesFileAndTensor) {
  auto e = entries_of("llama-ct-channel");
  std::erase_if(e, [](const Entry& x) { return x.name == kQ + "_scale"; });
  const std::string dir = write_model(ct_config(), e);
  EXPECT_EQ(open_error(dir),
            dir + "/model.safetensors: tensor '" + kQ + "' is FP8 but its scale '" + kQ + "_scale' is missing");
}

TEST(Fp8Checkpoint, WrongScaleShapeNamesFileAndTensor) {
  auto e = entries_of("llama-ct-channel");
  for (Entry& x : e) {
    if (x.name == kQ + "_scale") {
      x.shape = {x.shape[0] / 2, 2};  // same bytes, another shape
    }
  }
  const std::string dir = write_model(ct_config(), e);
  const std::string err = open_error(dir);
  EXPECT_EQ(err.rfind(dir + "/model.safetensors: tensor '" + kQ + "_scale' has shape [16, 2], expected [32, 1]", 0), 0u)
      << err;
}

TEST(Fp8Checkpoint, Fp8WithoutAConfigOrAScaleWithoutItsWeight) {
  json config = ct_config();
  config.erase("quantization_config");
  std::string dir = write_model(config, entries_of("llama-ct-channel"));
  std::string err = open_error(dir);
  EXPECT_NE(err.find("is FP8 but " + dir + "/config.json has no quantization_config"), std::string::npos) << err;

  auto e = entries_of("llama-ct-channel");
  for (Entry& x : e) {
    if (x.name == kQ) {
      x.dtype = "BF16";
      x.bytes.resize(x.bytes.size() * 2);
    }
  }
  dir = write_model(ct_config(), e);
  err = open_error(dir);
  EXPECT_EQ(err,
            dir + "/model.safetensors: tensor '" + kQ + "_scale' is a scale but '" + kQ + "' is not an FP8 weight");
}

// A weight past the loader's threading threshold (2^20 values), block
// scales with partial blocks at both edges: each value is e4m3 x its
// block's scale.
TEST(Fp8Checkpoint, LargeWeightsDequantizeOverThreads) {
  const int64_t rows = 1100, cols = 1040;  // 9 x 9 blocks of 128, the last ones partial
  Entry w{"model.layers.0.mlp.up_proj.weight", "F8_E4M3", {rows, cols}, {}};
  for (int64_t i = 0; i < rows * cols; ++i) w.bytes.push_back(static_cast<uint8_t>((i * 2654435761u) >> 7) & 0xfe);
  Entry s{"model.layers.0.mlp.up_proj.weight_scale_inv", "F32", {9, 9}, {}};
  std::vector<float> scales(81);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.001f * static_cast<float>(i + 1);
  s.bytes.resize(81 * 4);
  std::memcpy(s.bytes.data(), scales.data(), s.bytes.size());
  json config = ct_config();
  config["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  const std::string dir = write_model(config, {w, s});
  auto files = open_model_files(dir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  const TensorRef* t = (*files)->find(w.name);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->e4m3, nullptr);  // 9 scales per row
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float got;
      std::memcpy(&got, t->data + 4 * (r * cols + c), 4);
      const float want = e4m3_to_f32(w.bytes[static_cast<size_t>(r * cols + c)]) * scales[(r / 128) * 9 + c / 128];
      bad += std::memcmp(&got, &want, 4) != 0;
    }
  }
  EXPECT_EQ(bad, 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace rill
