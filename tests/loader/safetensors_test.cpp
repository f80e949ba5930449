// Safetensors parsing: a golden checkpoint written by transformers, then every
// kind of corruption, each of which must be an Error naming the file.
#include "loader/safetensors.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace rill {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kGoldenDir = std::string(RILL_SHARED_DIR) + "/goldens/hf";

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Builds a safetensors image from a header and a data section.
std::vector<uint8_t> make_image(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(8);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = uint8_t(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Three small tensors (F32 [2,3], F16 [4], BF16 [2,2]) packed back to back.
std::vector<uint8_t> small_image() {
  json h;
  h["__metadata__"] = {{"format", "pt"}};
  h["a"] = {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}};
  h["b"] = {{"dtype", "F16"}, {"shape", {4}}, {"data_offsets", {24, 32}}};
  h["c"] = {{"dtype", "BF16"}, {"shape", {2, 2}}, {"data_offsets", {32, 40}}};
  std::vector<uint8_t> data(40);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 7 + 1);
  return make_image(h.dump(), data);
}

Result<std::vector<SafetensorsTensor>> parse(const std::vector<uint8_t>& b) {
  return parse_safetensors(b.data(), b.size(), "test.safetensors");
}

// Expects an Error whose message names the file and contains `what`.
void expect_error(const std::vector<uint8_t>& b, const std::string& what) {
  auto r = parse(b);
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << what;
  EXPECT_NE(r.error().message.find("test.safetensors"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
}

std::vector<uint8_t> with_entry(const json& entry, size_t n_data = 40) {
  json h;
  h["x"] = entry;
  return make_image(h.dump(), std::vector<uint8_t>(n_data));
}

TEST(Safetensors, GoldenLlamaMatchesHeaderReadIndependently) {
  const std::string path = kGoldenDir + "/llama/model.safetensors";
  std::vector<uint8_t> bytes = read_bytes(path);
  ASSERT_GT(bytes.size(), 8u);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + long(header_len));

  auto file = open_safetensors(path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  const uint8_t* base = file->mapping.data() + 8 + header_len;
  EXPECT_EQ(file->tensors.size(), header.size() - 1);  // minus __metadata__
  for (const SafetensorsTensor& t : file->tensors) {
    SCOPED_TRACE(t.name);
    const json& e = header.at(t.name);
    EXPECT_EQ(e["dtype"], "F32");
    EXPECT_EQ(t.dtype, DType::kF32);
    EXPECT_EQ(json(t.shape), e["shape"]);
    const uint64_t begin = e["data_offsets"][0], end = e["data_offsets"][1];
    EXPECT_EQ(t.data, base + begin);
    EXPECT_EQ(t.n_bytes, end - begin);
    EXPECT_EQ(std::memcmp(t.data, bytes.data() + 8 + header_len + begin, t.n_bytes), 0);
  }
  // Sorted by name, metadata skipped.
  EXPECT_EQ(file->tensors.front().name, "lm_head.weight");
  EXPECT_EQ(file->tensors.front().shape, (std::vector<int64_t>{512, 64}));
}

TEST(Safetensors, EveryGoldenFileParses) {
  for (const auto& entry : fs::directory_iterator(kGoldenDir)) {
    if (!entry.is_directory()) continue;
    auto file = open_safetensors((entry.path() / "model.safetensors").string());
    EXPECT_TRUE(file.ok()) << entry.path() << ": " << file.error().message;
    if (file.ok()) {
      EXPECT_GT(file->tensors.size(), 5u);
    }
  }
}

TEST(Safetensors, SmallImageDtypesShapesAndPointers) {
  std::vector<uint8_t> b = small_image();
  auto r = parse(b);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->size(), 3u);
  const uint8_t* data = b.data() + b.size() - 40;
  EXPECT_EQ((*r)[0].dtype, DType::kF32);
  EXPECT_EQ((*r)[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ((*r)[0].data, data);
  EXPECT_EQ((*r)[1].dtype, DType::kF16);
  EXPECT_EQ((*r)[1].data, data + 24);
  EXPECT_EQ((*r)[1].n_bytes, 8u);
  EXPECT_EQ((*r)[2].dtype, DType::kBF16);
  EXPECT_EQ((*r)[2].data, data + 32);
}

TEST(Safetensors, ScalarsAndEmptyTensorsAreAllowed) {
  json h;
  h["s"] = {{"dtype", "F32"}, {"shape", json::array()}, {"data_offsets", {0, 4}}};
  h["e"] = {{"dtype", "F16"}, {"shape", {0, 5}}, {"data_offsets", {4, 4}}};
  auto r = parse(make_image(h.dump(), std::vector<uint8_t>(4)));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)[0].name, "e");
  EXPECT_EQ((*r)[0].n_bytes, 0u);
  EXPECT_EQ((*r)[1].n_bytes, 4u);
}

TEST(Safetensors, EveryTruncationIsAnError) {
  std::vector<uint8_t> b = small_image();
  for (size_t n = 0; n < b.size(); ++n) {
    std::vector<uint8_t> cut(b.begin(), b.begin() + long(n));
    auto r = parse(cut);
    ASSERT_FALSE(r.ok()) << "truncated to " << n << " bytes parsed";
    EXPECT_NE(r.error().message.find("test.safetensors"), std::string::npos);
  }
}

TEST(Safetensors, HeaderErrors) {
  expect_error({1, 2, 3}, "too short");
  std::vector<uint8_t> b = small_image();
  b[0] = 0xff;  // header length now past the end
  expect_error(b, "past the end of the file");
  std::vector<uint8_t> huge(16, 0);
  huge[7] = 0x7f;
  expect_error(huge, "100 MB");
  expect_error(make_image("{\"a\": ", {}), "not valid JSON");
  expect_error(make_image("[1, 2]", {}), "not a JSON object");
  expect_error(make_image("{\"a\": 5}", {}), "tensor 'a' entry is not an object");
}

// Integer index buffers (BERT's embeddings.position_ids) are left out, not refused.
TEST(Safetensors, IntegerIndexBuffersAreLeftOut) {
  json h;
  h["ids"] = {{"dtype", "I64"}, {"shape", {2}}, {"data_offsets", {0, 16}}};
  h["w"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {16, 24}}};
  const std::vector<uint8_t> b = make_image(h.dump(), std::vector<uint8_t>(24));
  auto r = parse_safetensors(b.data(), b.size(), "test.safetensors");
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].name, "w");
}

// U8 tensors are kept, one byte per element: MXFP4 checkpoints store their
// blocks and scales as U8 (loader/mxfp4_checkpoint.h); the other integer
// dtypes stay index buffers.
TEST(Safetensors, U8TensorsAreKeptOneBytePerElement) {
  json h;
  h["b"] = {{"dtype", "U8"}, {"shape", {2, 1, 16}}, {"data_offsets", {0, 32}}};
  h["i"] = {{"dtype", "I8"}, {"shape", {2}}, {"data_offsets", {32, 34}}};
  const std::vector<uint8_t> b = make_image(h.dump(), std::vector<uint8_t>(34, 7));
  auto r = parse(b);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].name, "b");
  EXPECT_TRUE((*r)[0].u8);
  EXPECT_EQ((*r)[0].n_bytes, 32u);
  EXPECT_EQ((*r)[0].data[31], 7);
  expect_error(with_entry({{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", {0, 8}}}),
               "tensor 'x' has 8 bytes but its shape and dtype need 4");
}

// F8_E4M3 / F8_E5M2 are one byte per element (loader/fp8_checkpoint.h
// gives them meaning); a byte count that assumes another size is refused.
TEST(Safetensors, Float8TensorsAreOneBytePerElement) {
  json h;
  h["q"] = {{"dtype", "F8_E4M3"}, {"shape", {2, 3}}, {"data_offsets", {0, 6}}};
  h["r"] = {{"dtype", "F8_E5M2"}, {"shape", {2}}, {"data_offsets", {6, 8}}};
  const std::vector<uint8_t> b = make_image(h.dump(), std::vector<uint8_t>(8));
  auto r = parse(b);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].float8, Float8::kE4M3);
  EXPECT_EQ((*r)[0].n_bytes, 6u);
  EXPECT_EQ((*r)[1].float8, Float8::kE5M2);
  expect_error(with_entry({{"dtype", "F8_E4M3"}, {"shape", {4}}, {"data_offsets", {0, 8}}}),
               "tensor 'x' has 8 bytes but its shape and dtype need 4");
}

TEST(Safetensors, EntryErrorsNameTheTensor) {
  expect_error(with_entry({{"dtype", "F64"}, {"shape", {1}}, {"data_offsets", {0, 8}}}),
               "tensor 'x' has unsupported dtype 'F64'");
  expect_error(with_entry({{"shape", {1}}, {"data_offsets", {0, 4}}}), "tensor 'x' has no string 'dtype'");
  expect_error(with_entry({{"dtype", "F32"}, {"data_offsets", {0, 4}}}), "tensor 'x' has no array 'shape'");
  expect_error(with_entry({{"dtype", "F32"}, {"shape", {"2"}}, {"data_offsets", {0, 8}}}), "shape entry");
  expect_error(with_entry({{"dtype", "F32"}, {"shape", {-1}}, {"data_offsets", {0, 4}}}), "shape entry");
  expect_error(with_entry({{"dtype", "F32"}, {"shape", {1}}}), "data_offsets");
  expect_error(with_entry({{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0}}}), "data_offsets");
  expect_error(with_entry({{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {-4, 0}}}), "non-negative");
  expect_error(with_entry({{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {8, 4}}}), "end < begin");
  expect_error(with_entry({{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {32, 48}}}),
               "past the end of the data section");
  expect_error(with_entry({{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 20}}}),
               "has 20 bytes but its shape and dtype need 24");
  // 2^32 * 2^32 elements overflows int64; 2^62 F32 elements overflow the byte count.
  expect_error(with_entry({{"dtype", "F32"}, {"shape", {4294967296ull, 4294967296ull}}, {"data_offsets", {0, 4}}}),
               "overflows");
  expect_error(with_entry({{"dtype", "F32"}, {"shape", {4611686018427387904ull}}, {"data_offsets", {0, 4}}}),
               "overflows");
  expect_error(with_entry({{"dtype", "F32"}, {"shape", {1, 1, 1, 1, 1, 1, 1, 1, 1}}, {"data_offsets", {0, 4}}}),
               "rank 9");
}

TEST(Safetensors, OverlappingTensorsAreAnError) {
  json h;
  h["a"] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}};
  h["b"] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {8, 24}}};
  expect_error(make_image(h.dump(), std::vector<uint8_t>(24)), "tensors 'a' and 'b' overlap");
}

TEST(Safetensors, OpenNamesThePath) {
  const fs::path dir = fs::temp_directory_path() / ("rill_st_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "bad.safetensors").string();
  std::vector<uint8_t> b = small_image();
  b.resize(b.size() - 1);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), long(b.size()));
  auto r = open_safetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message.rfind(path + ": tensor 'c'", 0), 0u) << r.error().message;
  auto missing = open_safetensors((dir / "nope.safetensors").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("nope.safetensors"), std::string::npos);
  fs::remove_all(dir);
}

TEST(SafetensorsIndex, ParsesAndRejectsBadShardNames) {
  auto ok = parse_safetensors_index(
      R"({"metadata": {"total_size": 8}, "weight_map": {"a": "s-1.safetensors", "b": "s-2.safetensors", "c": "s-1.safetensors"}})",
      "index.json");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->shards, (std::vector<std::string>{"s-1.safetensors", "s-2.safetensors"}));
  EXPECT_EQ(ok->weight_map.at("b"), "s-2.safetensors");

  for (const char* bad : {R"({"weight_map": {"a": "../x.safetensors"}})", R"({"weight_map": {"a": 3}})",
                          R"({"weight_map": {}})", R"({"metadata": {}})", R"([1])", R"({"weight_map": )"}) {
    auto r = parse_safetensors_index(bad, "index.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().message.rfind("index.json: ", 0), 0u) << r.error().message;
  }
}

}  // namespace
}  // namespace rill
