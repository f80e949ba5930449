// MXFP4 checkpoints (loader/mxfp4_checkpoint.h) against tests/data/gpt_oss_mxfp4,
// the gpt-oss golden with its experts in MXFP4 as OpenAI ships gpt-oss on
// Hugging Face (tools/make_mxfp4_checkpoint.py):
//  - the re-laid blocks are, byte for byte, the MXFP4 tensors llama.cpp's
//    converter makes of the same checkpoint (tests/data/gguf_families/
//    gpt_oss_mxfp4.gguf: gate rows = the even gate_up rows, up = the odd);
//  - each weight decoded by the OCP definition (FP4 code x 2^(e - 127))
//    equals transformers' dequantization (dequantized.safetensors), bit for
//    bit, and the blocks and scales are no model tensors;
//  - modules_to_not_convert is honoured both ways (matching as transformers'
//    should_convert_module does);
//  - quantization_config fields rill cannot honour, other quant_methods and
//    malformed files (missing or misshapen scales, MXFP4 on another tensor,
//    wrong dtypes) are Errors naming the file, the tensor or the field.
#include "loader/mxfp4_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <unistd.h>

#include "loader/model_files.h"

namespace rill {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
const std::string kDir = std::string(RILL_TEST_DATA) + "/gpt_oss_mxfp4";
const std::string kGguf = std::string(RILL_TEST_DATA) + "/gguf_families/gpt_oss_mxfp4.gguf";
constexpr int64_t kLayers = 4, kX = 4, kE = 64, kF = 32;

std::string layer(int64_t il) {
  return "model.layers." + std::to_string(il) + ".mlp.experts.";
}

TEST(Mxfp4Checkpoint, BlocksAreWhatLlamaCppsConverterMakesOfThem) {
  auto hf = open_model_files(kDir);
  ASSERT_TRUE(hf.ok()) << hf.error().message;
  auto gguf = open_model_files(kGguf);
  ASSERT_TRUE(gguf.ok()) << gguf.error().message;
  const size_t row_e = 2 * 17, row_f = 17;  // bytes of a row of E / F weights
  for (int64_t il = 0; il < kLayers; ++il) {
    const std::string p = layer(il);
    const TensorRef* gu = (*hf)->find(p + "gate_up_proj");
    const TensorRef* dn = (*hf)->find(p + "down_proj");
    ASSERT_TRUE(gu && dn) << p;
    EXPECT_EQ(gu->dtype, DType::kMXFP4);
    EXPECT_EQ(gu->shape, (std::vector<int64_t>{kX, 2 * kF, kE}));
    EXPECT_EQ(gu->n_bytes, static_cast<size_t>(kX * 2 * kF) * row_e);
    EXPECT_EQ(dn->shape, (std::vector<int64_t>{kX, kE, kF}));
    EXPECT_EQ(gu->file, kDir + "/model-00002-of-00002.safetensors");
    const TensorRef* gate = (*gguf)->find(p + "gate_proj.weight");
    const TensorRef* up = (*gguf)->find(p + "up_proj.weight");
    const TensorRef* down = (*gguf)->find(p + "down_proj.weight");
    ASSERT_TRUE(gate && up && down) << p;
    ASSERT_EQ(gate->dtype, DType::kMXFP4);
    for (int64_t e = 0; e < kX; ++e) {
      for (int64_t r = 0; r < kF; ++r) {
        const uint8_t* g_row = gate->data + static_cast<size_t>(e * kF + r) * row_e;
        const uint8_t* u_row = up->data + static_cast<size_t>(e * kF + r) * row_e;
        EXPECT_EQ(std::memcmp(gu->data + static_cast<size_t>(e * 2 * kF + 2 * r) * row_e, g_row, row_e), 0)
            << p << " expert " << e << " gate row " << r;
        EXPECT_EQ(std::memcmp(gu->data + static_cast<size_t>(e * 2 * kF + 2 * r + 1) * row_e, u_row, row_e), 0)
            << p << " expert " << e << " up row " << r;
      }
    }
    ASSERT_EQ(down->n_bytes, dn->n_bytes);
    EXPECT_EQ(std::memcmp(down->data, dn->data, dn->n_bytes), 0) << p << "down_proj";
    EXPECT_EQ(row_f * kE * kX, dn->n_bytes);
  }
}

// W = FP4[code] x 2^(e - 127) (OCP MX): computed here from the definition,
// not from rill's GGML tables.
float ocp_value(const uint8_t* ggml_block, int j) {
  static const float kFp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  const uint8_t code = j < 16 ? (ggml_block[1 + j] & 0xF) : (ggml_block[1 + j - 16] >> 4);
  return std::ldexp(kFp4[code], int(ggml_block[0]) - 127);
}

TEST(Mxfp4Checkpoint, WeightsAreTransformersDequantization) {
  auto hf = open_model_files(kDir);
  ASSERT_TRUE(hf.ok()) << hf.error().message;
  auto dense = open_safetensors(kDir + "/dequantized.safetensors");
  ASSERT_TRUE(dense.ok()) << dense.error().message;
  ASSERT_EQ(dense->tensors.size(), size_t(2 * kLayers));
  int64_t n_checked = 0, n_nonzero = 0;
  for (const SafetensorsTensor& d : dense->tensors) {
    // Dense [X, cols, rows] (x @ W) against the MXFP4 [X, rows, cols].
    const TensorRef* m = (*hf)->find(d.name);
    ASSERT_TRUE(m) << d.name;
    ASSERT_EQ(d.dtype, DType::kF32);
    const int64_t R = m->shape[1], C = m->shape[2];
    ASSERT_EQ(d.shape, (std::vector<int64_t>{kX, C, R})) << d.name;
    const auto* w = reinterpret_cast<const float*>(d.data);
    for (int64_t e = 0; e < kX; ++e) {
      for (int64_t r = 0; r < R; ++r) {
        for (int64_t c = 0; c < C; ++c) {
          const uint8_t* block = m->data + static_cast<size_t>((e * R + r) * (C / 32) + c / 32) * 17;
          const float want = w[(e * C + c) * R + r];
          const float got = ocp_value(block, static_cast<int>(c % 32));
          if (std::memcmp(&want, &got, 4) != 0) {
            ADD_FAILURE() << d.name << " [" << e << ", " << r << ", " << c << "]: " << got << " vs " << want;
            return;
          }
          ++n_checked;
          n_nonzero += want != 0;
        }
      }
    }
  }
  EXPECT_EQ(n_checked, kLayers * kX * 3 * kE * kF);
  EXPECT_GT(n_nonzero, n_checked / 2);
  for (const auto& [name, t] : (*hf)->tensors) {
    EXPECT_EQ(name.find("_blocks"), std::string::npos) << name;
    EXPECT_EQ(name.find("_scales"), std::string::npos) << name;
  }
  EXPECT_EQ((*hf)->mxfp4.stored.size(), size_t(4 * kLayers));
}

TEST(Mxfp4Checkpoint, GroupRelayout) {
  // Codes 0..15 then 15..0 in element order: transformers packs elements
  // 2k (low) and 2k + 1 (high) into byte k; ggml j (low) and j + 16 (high).
  uint8_t codes[16], out[17];
  uint8_t element[32];
  for (int j = 0; j < 32; ++j) element[j] = static_cast<uint8_t>(j < 16 ? j : 31 - j);
  for (int k = 0; k < 16; ++k) codes[k] = static_cast<uint8_t>(element[2 * k] | (element[2 * k + 1] << 4));
  mxfp4_group_to_ggml(codes, 121, out);
  EXPECT_EQ(out[0], 121);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[1 + j] & 0xF, element[j]) << j;
    EXPECT_EQ(out[1 + j] >> 4, element[j + 16]) << j;
  }
}

bool converts(const Mxfp4Scheme& s, const std::string& module) {
  auto c = mxfp4_converts(s, module);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return c.ok() && *c;
}

TEST(Mxfp4Checkpoint, ModulesToNotConvertMatchAsTransformersDoes) {
  // The expectations are transformers 5.25's should_convert_module on the
  // same names (re.match: a prefix match with no module boundary).
  auto scheme = [](std::vector<std::string> patterns) {
    nlohmann::json config = {{"quantization_config", {{"quant_method", "mxfp4"}}}};
    config["quantization_config"]["modules_to_not_convert"] = std::move(patterns);
    auto s = parse_mxfp4_scheme(config, "config.json");
    EXPECT_TRUE(s.ok()) << s.error().message;
    return *s;
  };
  Mxfp4Scheme s = scheme({"model.layers.*.self_attn", "lm_head", "layer.1", "mlp.gate"});
  EXPECT_FALSE(converts(s, "model.layers.3.self_attn"));
  EXPECT_FALSE(converts(s, "model.layers.3.self_attn.q_proj"));  // a prefix
  EXPECT_FALSE(converts(s, "lm_head"));
  EXPECT_FALSE(converts(s, "model.lm_head"));  // as a suffix
  EXPECT_FALSE(converts(s, "layer.1.attn"));
  EXPECT_FALSE(converts(s, "layer.11.attn"));  // no module boundary in re.match
  EXPECT_FALSE(converts(s, "mlp.gate_proj"));
  EXPECT_TRUE(converts(s, "mlp.up_proj"));
  EXPECT_TRUE(converts(s, "model.layers.3.mlp.experts"));
  s = scheme({"model.layers.1.mlp.experts"});
  EXPECT_FALSE(converts(s, "model.layers.1.mlp.experts"));
  EXPECT_TRUE(converts(s, "model.layers.11.mlp.experts"));
  EXPECT_TRUE(converts(s, "model.layers.2.mlp.experts"));
  // A pattern that backtracks without bound: an error naming it (found by
  // fuzz_hf_config; std::regex hung on it).
  s = scheme({"(a|a)*(b|c)"});
  auto hostile = mxfp4_converts(s, std::string(kMaxMxfp4ModuleChars, 'a'));
  ASSERT_FALSE(hostile.ok());
  EXPECT_NE(hostile.error().message.find("(a|a)*(b|c)"), std::string::npos) << hostile.error().message;
}

// --- configs and malformed files --------------------------------------------

struct Entry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// The committed checkpoint's tensors (both shards), for editing.
std::vector<Entry> entries() {
  std::vector<Entry> out;
  for (const char* shard : {"/model-00001-of-00002.safetensors", "/model-00002-of-00002.safetensors"}) {
    auto f = open_safetensors(kDir + shard);
    EXPECT_TRUE(f.ok());
    for (const SafetensorsTensor& t : f->tensors) {
      out.push_back({t.name, t.u8 ? "U8" : "F32", t.shape, std::vector<uint8_t>(t.data, t.data + t.n_bytes)});
    }
  }
  return out;
}

json config() {
  std::ifstream in(kDir + "/config.json");
  return json::parse(in);
}

// The running test's temp model dir.
std::string model_dir() {
  return (fs::temp_directory_path() / ("rill_mxfp4_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name()))
      .string();
}

// model_dir() holding `cfg` and the entries as model.safetensors.
std::string write_model(const json& cfg, const std::vector<Entry>& es) {
  const fs::path dir = model_dir();
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << cfg.dump();
  json header = json::object();
  std::vector<uint8_t> data;
  for (const Entry& e : es) {
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

std::string open_error(const json& cfg, const std::vector<Entry>& es) {
  const std::string dir = write_model(cfg, es);
  auto f = open_model_files(dir);
  fs::remove_all(dir);
  return f.ok() ? std::string("(opened)") : f.error().message;
}

Entry* find(std::vector<Entry>& es, const std::string& name) {
  for (Entry& e : es) {
    if (e.name == name) return &e;
  }
  ADD_FAILURE() << name;
  return nullptr;
}

const std::string kGu = layer(1) + "gate_up_proj";

TEST(Mxfp4Checkpoint, MissingScalesNameTheTensor) {
  auto es = entries();
  std::erase_if(es, [](const Entry& e) { return e.name == kGu + "_scales"; });
  const std::string dir = model_dir();
  const std::string err = open_error(config(), es);
  EXPECT_EQ(err, dir + "/model.safetensors: tensor '" + kGu + "_blocks' is MXFP4 but its scales '" + kGu +
                     "_scales' are missing");
  // And blocks missing beside their scales.
  es = entries();
  std::erase_if(es, [](const Entry& e) { return e.name == kGu + "_blocks"; });
  EXPECT_EQ(open_error(config(), es), dir + "/model.safetensors: tensor '" + kGu +
                                          "_scales' is MXFP4 but its blocks '" + kGu + "_blocks' are missing");
}

// A crafted name long enough to overflow std::regex's recursion (one frame
// per character) is refused before any pattern is matched.
TEST(Mxfp4Checkpoint, OverlongTensorNameIsRefused) {
  auto es = entries();
  const std::string name = "model.layers." + std::string(200000, 'a') + ".mlp.experts.gate_up_proj";
  es.push_back({name, "F32", {1}, std::vector<uint8_t>(4, 0)});
  const std::string dir = model_dir();
  EXPECT_EQ(open_error(config(), es), dir + "/model.safetensors: tensor '" + name + "' has a name of " +
                                          std::to_string(name.size()) +
                                          " characters; an MXFP4 checkpoint's are at most 1024");
}

TEST(Mxfp4Checkpoint, WrongScalesShapeNamesTheTensor) {
  auto es = entries();
  Entry* s = find(es, kGu + "_scales");
  s->shape = {kX, 2 * kF, 1};
  s->bytes.resize(kX * 2 * kF);
  const std::string dir = model_dir();
  EXPECT_EQ(open_error(config(), es), dir + "/model.safetensors: tensor '" + kGu +
                                          "_scales' has shape [4, 64, 1], expected [4, 64, 2] " +
                                          "(one scale per 32 weights of '" + kGu + "_blocks' [4, 64, 2, 16])");
}

TEST(Mxfp4Checkpoint, MalformedBlocksAreRefusedByName) {
  const std::string dir = model_dir();
  auto es = entries();
  Entry* b = find(es, kGu + "_blocks");
  b->shape = {kX, 2 * kF, 32};  // rank 3
  EXPECT_EQ(open_error(config(), es),
            dir + "/model.safetensors: tensor '" + kGu +
                "_blocks' has shape [4, 64, 32]; MXFP4 blocks are [n_expert, rows, cols / 32, 16] (16 bytes of codes "
                "per 32 weights)");
  es = entries();
  b = find(es, kGu + "_blocks");
  b->dtype = "F32";
  b->shape = {kX, 2 * kF, 2, 4};
  EXPECT_EQ(open_error(config(), es), dir + "/model.safetensors: tensor '" + kGu + "_blocks' must be U8 (MXFP4 codes)");
  es = entries();
  find(es, kGu + "_scales")->dtype = "I8";  // an index buffer: left out, so missing
  EXPECT_NE(open_error(config(), es).find("its scales '" + kGu + "_scales' are missing"), std::string::npos);
  // MXFP4 on a tensor transformers' format does not quantize.
  es = entries();
  const std::string q = "model.layers.0.self_attn.q_proj";
  es.push_back({q + "_blocks", "U8", {64, 2, 16}, std::vector<uint8_t>(64 * 32)});
  es.push_back({q + "_scales", "U8", {64, 2}, std::vector<uint8_t>(64 * 2)});
  EXPECT_EQ(open_error(config(), es),
            dir + "/model.safetensors: tensor '" + q +
                "_blocks' is MXFP4, which rill reads for the experts' gate_up_proj and down_proj only "
                "('<...>.experts.gate_up_proj_blocks' / '_scales', as transformers' Mxfp4GptOssExperts)");
}

TEST(Mxfp4Checkpoint, ModulesToNotConvertIsHonoured) {
  // Layer 2's experts stored dense (transformers' dequantization) while the
  // config converts them: refused; listed in modules_to_not_convert: read
  // dense beside the other layers' MXFP4.
  auto dense = open_safetensors(kDir + "/dequantized.safetensors");
  ASSERT_TRUE(dense.ok());
  auto es = entries();
  const std::string p = layer(2);
  std::erase_if(es, [&](const Entry& e) { return e.name.rfind(p, 0) == 0 && e.dtype == "U8"; });
  for (const SafetensorsTensor& t : dense->tensors) {
    if (t.name.rfind(p, 0) == 0)
      es.push_back({t.name, "F32", t.shape, std::vector<uint8_t>(t.data, t.data + t.n_bytes)});
  }
  const std::string dir = model_dir();
  EXPECT_EQ(open_error(config(), es),
            dir + "/model.safetensors: tensor '" + p + "down_proj' is stored unquantized, but " + dir +
                "/config.json's quantization_config (mxfp4) converts 'model.layers.2.mlp.experts': expected '" + p +
                "down_proj_blocks' and '" + p +
                "down_proj_scales' (or list 'model.layers.2.mlp.experts' in modules_to_not_convert)");
  json cfg = config();
  cfg["quantization_config"]["modules_to_not_convert"].push_back("model.layers.2.mlp.experts");
  write_model(cfg, es);
  auto f = open_model_files(dir);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->find(p + "gate_up_proj")->dtype, DType::kF32);
  EXPECT_EQ((*f)->find(p + "gate_up_proj")->shape, (std::vector<int64_t>{kX, kE, 2 * kF}));
  EXPECT_EQ((*f)->find(layer(1) + "gate_up_proj")->dtype, DType::kMXFP4);
  fs::remove_all(dir);
  // Experts the list excludes but stored as MXFP4.
  es = entries();
  cfg = config();
  cfg["quantization_config"]["modules_to_not_convert"].push_back("model.layers.*.mlp.experts");
  EXPECT_EQ(open_error(cfg, es), dir + "/model.safetensors: tensor '" + layer(0) + "down_proj_blocks' is MXFP4, but " +
                                     dir +
                                     "/config.json's modules_to_not_convert excludes 'model.layers.0.mlp.experts' "
                                     "(its experts would be stored unquantized)");
}

TEST(Mxfp4Checkpoint, ConfigsRillCannotHonourAreRefusedByField) {
  const auto es = entries();
  auto error_with = [&](const std::function<void(json&)>& edit) {
    json cfg = config();
    edit(cfg);
    const std::string dir = model_dir();
    std::string err = open_error(cfg, es);
    const std::string prefix = dir + "/config.json: ";
    return err.rfind(prefix, 0) == 0 ? err.substr(prefix.size()) : "(not about config.json) " + err;
  };
  EXPECT_EQ(error_with([](json& c) { c["quantization_config"]["quant_method"] = "awq"; }),
            "quantization_config.quant_method is \"awq\"; supported: \"fp8\" and \"compressed-tensors\" "
            "(float-quantized FP8), \"mxfp4\" (gpt-oss experts). GGUF files carry rill's other quantized types");
  EXPECT_EQ(error_with([](json& c) { c["quantization_config"]["dequantize"] = true; }),
            "quantization_config.dequantize must be false (rill keeps the MXFP4 experts as stored)");
  EXPECT_EQ(error_with([](json& c) { c["quantization_config"]["block_size"] = 32; }),
            "quantization_config.block_size is not supported (mxfp4 reads quant_method, modules_to_not_convert, "
            "dequantize)");
  EXPECT_EQ(error_with([](json& c) { c["quantization_config"]["modules_to_not_convert"] = "lm_head"; }),
            "quantization_config.modules_to_not_convert must be a list of module names or patterns");
  EXPECT_EQ(error_with([](json& c) { c["quantization_config"]["modules_to_not_convert"].push_back("layers.("); }),
            "quantization_config.modules_to_not_convert entry \"layers.(\" is not a valid regular expression: "
            "missing closing parenthesis at offset 8");
  EXPECT_EQ(error_with([](json& c) { c["quantization_config"]["modules_to_not_convert"].push_back(3); }),
            "quantization_config.modules_to_not_convert entry 3 must be a non-empty string of at most 256 characters");
  EXPECT_EQ(error_with([](json& c) { c["model_type"] = "llama"; }),
            "quantization_config mxfp4 is read for gpt_oss checkpoints only (transformers converts gpt-oss's "
            "experts only); model_type is 'llama'");
  // MXFP4 tensors without the config.
  const std::string dir = model_dir();
  json cfg = config();
  cfg.erase("quantization_config");
  EXPECT_EQ(open_error(cfg, es), dir + "/model.safetensors: tensor '" + layer(0) +
                                     "down_proj_blocks' is MXFP4 blocks but " + dir +
                                     "/config.json has no quantization_config with quant_method \"mxfp4\"");
  // The committed checkpoint itself opens, with dequantize false spelled out.
  cfg = config();
  cfg["quantization_config"]["dequantize"] = false;
  EXPECT_EQ(open_error(cfg, es), "(opened)");
}

}  // namespace
}  // namespace rill
