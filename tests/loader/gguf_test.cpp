// GgufFile against synthetic images (every value type, alignment, every
// corruption), against seeds written by the reference `gguf` Python writer,
// and against the reference reader's dump of the default model.
#include "loader/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "gguf_writer.h"

namespace rill {
namespace {

using testing::ByteSink;
using testing::GgufWriter;
using testing::parse_image;

constexpr uint32_t kF32 = 0, kF16 = 1, kQ8_0 = 8, kQ2_K = 10, kIQ2_XXS = 16;

std::vector<uint8_t> bytes_of(size_t n, uint8_t start = 0) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t(start + i);
  return b;
}

// Expects an Error whose message contains `needle`.
void expect_error(const std::vector<uint8_t>& image, const std::string& needle) {
  auto r = parse_image(image);
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << needle;
  EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
  EXPECT_EQ(r.error().message.rfind("x.gguf: ", 0), 0u) << r.error().message;
}

TEST(Gguf, EveryMetadataTypeRoundTrips) {
  GgufWriter w;
  w.add<uint8_t>("u8", GgufType::kU8, 255);
  w.add<int8_t>("i8", GgufType::kI8, -128);
  w.add<uint16_t>("u16", GgufType::kU16, 65535);
  w.add<int16_t>("i16", GgufType::kI16, -32768);
  w.add<uint32_t>("u32", GgufType::kU32, 4294967295u);
  w.add<int32_t>("i32", GgufType::kI32, INT32_MIN);
  w.add<uint64_t>("u64", GgufType::kU64, UINT64_MAX);
  w.add<int64_t>("i64", GgufType::kI64, INT64_MIN);
  w.add<float>("f32", GgufType::kF32, 1e-5f);
  w.add<double>("f64", GgufType::kF64, -2.5e300);
  w.add_bool("yes", true).add_bool("no", false);
  w.add_string("str", std::string("a\0b\xc3\xa9", 5)).add_string("empty", "");
  w.add_array<int32_t>("arr_i32", GgufType::kI32, {1, -2, 3});
  w.add_array<float>("arr_f32", GgufType::kF32, {0.5f, -1.0f});
  w.add_array<uint8_t>("arr_empty", GgufType::kU8, {});
  w.add_string_array("arr_str", {"x", "", "zz"});
  {
    // [[1, 2], [], [3]] as an array of u16 arrays.
    ByteSink v;
    v.put_type(GgufType::kArray).put<uint64_t>(3);
    v.put_type(GgufType::kU16).put<uint64_t>(2).put<uint16_t>(1).put<uint16_t>(2);
    v.put_type(GgufType::kU16).put<uint64_t>(0);
    v.put_type(GgufType::kU16).put<uint64_t>(1).put<uint16_t>(3);
    w.add_raw("nested", GgufType::kArray, v.bytes);
  }
  auto r = parse_image(w.build());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const GgufFile& f = **r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 19u);
  EXPECT_EQ(f.get_int("u8"), 255);
  EXPECT_EQ(f.get_int("i8"), -128);
  EXPECT_EQ(f.get_int("u16"), 65535);
  EXPECT_EQ(f.get_int("i16"), -32768);
  EXPECT_EQ(f.get_int("u32"), 4294967295ll);
  EXPECT_EQ(f.get_int("i32"), INT32_MIN);
  EXPECT_EQ(f.get_int("u64"), std::nullopt);  // does not fit int64
  EXPECT_EQ(std::get<uint64_t>(f.find("u64")->v), UINT64_MAX);
  EXPECT_EQ(f.get_int("i64"), INT64_MIN);
  EXPECT_EQ(f.get_float("f32"), double(1e-5f));
  EXPECT_EQ(f.get_float("f64"), -2.5e300);
  EXPECT_EQ(f.get_float("u8"), 255.0);
  EXPECT_EQ(f.get_int("yes"), 1);
  EXPECT_EQ(std::get<bool>(f.find("no")->v), false);
  EXPECT_EQ(f.get_string("str"), std::string("a\0b\xc3\xa9", 5));
  EXPECT_EQ(f.get_string("empty"), "");
  EXPECT_EQ(f.get_string("u8"), std::nullopt);
  EXPECT_EQ(f.get_int("str"), std::nullopt);
  EXPECT_EQ(f.get_int("missing"), std::nullopt);
  const char* kTypes[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "yes", "str", "arr_i32", "u64", "i64", "f64"};
  for (uint32_t t = 0; t < std::size(kTypes); ++t)
    EXPECT_EQ(f.find(kTypes[t])->type, static_cast<GgufType>(t)) << kTypes[t];

  const GgufArray* a = f.get_array("arr_i32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(f.find("arr_i32")->array_type, GgufType::kI32);
  ASSERT_EQ(a->size(), 3u);
  EXPECT_EQ((*a)[1].as_int(), -2);
  EXPECT_EQ((*a)[1].type, GgufType::kI32);
  EXPECT_EQ((*f.get_array("arr_f32"))[0].as_float(), 0.5);
  EXPECT_TRUE(f.get_array("arr_empty")->empty());
  const GgufArray* s = f.get_array("arr_str");
  ASSERT_EQ(s->size(), 3u);
  EXPECT_EQ(*(*s)[2].as_string(), "zz");
  EXPECT_EQ(*(*s)[1].as_string(), "");
  const GgufArray* n = f.get_array("nested");
  ASSERT_EQ(n->size(), 3u);
  EXPECT_EQ(f.find("nested")->array_type, GgufType::kArray);
  EXPECT_EQ((*n)[0].array_type, GgufType::kU16);
  EXPECT_EQ((*(*n)[0].as_array())[1].as_int(), 2);
  EXPECT_TRUE((*n)[1].as_array()->empty());
  EXPECT_EQ((*(*n)[2].as_array())[0].as_int(), 3);
  EXPECT_TRUE(f.tensors().empty());
}

TEST(Gguf, Version2IsAccepted) {
  GgufWriter w;
  w.version = 2;
  w.add_string("general.architecture", "llama");
  auto r = parse_image(w.build());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)->version(), 2u);
}

// A small file with one tensor of each kind; the last tensor's data ends the file.
GgufWriter tensor_file(uint32_t alignment = 0) {
  GgufWriter w;
  if (alignment) w.set_alignment(alignment);
  w.add_string("general.architecture", "llama");
  w.add_tensor("f32", kF32, {4, 3}, bytes_of(48));
  w.add_tensor("f16", kF16, {5}, bytes_of(10, 100));
  w.add_tensor("unsupported", kIQ2_XXS, {256}, bytes_of(66));
  w.add_tensor("q8", kQ8_0, {64, 2}, bytes_of(4 * 34, 7));
  return w;
}

TEST(Gguf, TensorInfosAndDataAreLocated) {
  for (uint32_t alignment : {0u, 1u, 8u, 64u, 4096u}) {
    SCOPED_TRACE(alignment);
    const auto image = tensor_file(alignment).build();
    auto r = parse_image(image);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const GgufFile& f = **r;
    const size_t a = alignment ? alignment : 32;
    EXPECT_EQ(f.alignment(), a);
    EXPECT_EQ(f.data_start() % a, 0u);
    ASSERT_EQ(f.tensors().size(), 4u);
    const GgufTensorInfo* t = f.find_tensor("f32");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->ne, (std::vector<int64_t>{4, 3}));
    EXPECT_EQ(t->n_elements(), 12);
    EXPECT_EQ(t->offset, 0u);
    EXPECT_EQ(t->n_bytes, 48u);
    EXPECT_EQ(t->data, image.data() + f.data_start());
    EXPECT_EQ(t->data[47], 47);
    const GgufTensorInfo* h = f.find_tensor("f16");
    EXPECT_EQ(h->offset % a, 0u);
    EXPECT_EQ(h->n_bytes, 10u);
    EXPECT_EQ(h->data[0], 100);
    const GgufTensorInfo* u = f.find_tensor("unsupported");
    EXPECT_EQ(u->type, kIQ2_XXS);
    EXPECT_EQ(u->data, nullptr);
    EXPECT_EQ(u->n_bytes, 0u);
    const GgufTensorInfo* q = f.find_tensor("q8");
    EXPECT_EQ(q->n_bytes, 136u);
    EXPECT_EQ(q->data + q->n_bytes, image.data() + image.size());
    EXPECT_EQ(q->data[0], 7);
    EXPECT_EQ(f.find_tensor("nope"), nullptr);
  }
}

TEST(Gguf, OpenMapsAFileAndReportsMissingOnes) {
  const auto image = tensor_file().build();
  const std::string path = testing::write_temp_file(image, "t.gguf");
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)->path(), path);
  EXPECT_EQ((*r)->find_tensor("q8")->data[1], 8);
  auto missing = GgufFile::open(path + ".missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find(".missing"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(Gguf, EveryTruncationIsAnError) {
  const auto image = tensor_file(64).build();
  for (size_t n = 0; n < image.size(); ++n) {
    std::vector<uint8_t> cut(image.begin(), image.begin() + static_cast<ptrdiff_t>(n));
    auto r = parse_image(cut);
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(r.error().message.rfind("x.gguf: ", 0), 0u) << r.error().message;
  }
  EXPECT_TRUE(parse_image(image).ok());
}

TEST(Gguf, HeaderErrors) {
  GgufWriter w;
  w.magic = 0x46554746;
  expect_error(w.build(), "bad magic (expected GGUF)");
  w = GgufWriter();
  w.version = 1;
  expect_error(w.build(), "version 1 is not supported");
  w.version = 4;
  expect_error(w.build(), "unsupported GGUF version 4");
  w.version = 0x03000000;
  expect_error(w.build(), "big-endian");
  expect_error({'G', 'G'}, "too short");
  expect_error({}, "too short");
}

TEST(Gguf, ImpossibleCountsAreRejectedBeforeAllocating) {
  ByteSink h;
  h.put<uint32_t>(0x46554747).put<uint32_t>(3).put<uint64_t>(UINT64_MAX).put<uint64_t>(0);
  expect_error(h.bytes, "tensor count 18446744073709551615 is impossible");
  h = ByteSink();
  h.put<uint32_t>(0x46554747).put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1ull << 40);
  expect_error(h.bytes, "metadata count 1099511627776 is impossible");

  // A key whose length is huge.
  h = ByteSink();
  h.put<uint32_t>(0x46554747).put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1);
  h.put<uint64_t>(1ull << 62).put<uint32_t>(0).put<uint8_t>(1);
  expect_error(h.bytes, "metadata key #0: string length 4611686018427387904");

  GgufWriter w;
  ByteSink v;
  v.put<uint64_t>(UINT64_MAX);
  w.add_raw("s", GgufType::kString, v.bytes);
  expect_error(w.build(), "metadata 's': string length 18446744073709551615");

  for (GgufType elem : {GgufType::kU8, GgufType::kString, GgufType::kArray, GgufType::kF64}) {
    w = GgufWriter();
    v = ByteSink();
    v.put_type(elem).put<uint64_t>(1ull << 62);
    w.add_raw("arr", GgufType::kArray, v.bytes);
    expect_error(w.build(), "metadata 'arr': array length 4611686018427387904 runs past the end");
  }
}

TEST(Gguf, MalformedValuesAreErrors) {
  GgufWriter w;
  w.add_raw("t", static_cast<GgufType>(13), {0});
  expect_error(w.build(), "metadata 't': unknown value type 13");

  w = GgufWriter();
  ByteSink v;
  v.put<uint32_t>(99).put<uint64_t>(0);
  w.add_raw("a", GgufType::kArray, v.bytes);
  expect_error(w.build(), "unknown array element type 99");

  w = GgufWriter();
  w.add<uint8_t>("b", GgufType::kBool, 2);
  expect_error(w.build(), "bool value 2");

  w = GgufWriter();
  w.add_u32("k", 1).add_u32("k", 2);
  expect_error(w.build(), "duplicate metadata key 'k'");

  // Arrays nested kGgufMaxArrayDepth deep parse; one more level does not.
  for (int depth : {kGgufMaxArrayDepth, kGgufMaxArrayDepth + 1}) {
    v = ByteSink();
    for (int d = 1; d < depth; ++d) v.put_type(GgufType::kArray).put<uint64_t>(1);
    v.put_type(GgufType::kU8).put<uint64_t>(1).put<uint8_t>(9);
    w = GgufWriter();
    w.add_raw("deep", GgufType::kArray, v.bytes);
    if (depth == kGgufMaxArrayDepth) {
      EXPECT_TRUE(parse_image(w.build()).ok());
    } else {
      expect_error(w.build(), "nested deeper than 8 levels");
    }
  }
}

TEST(Gguf, AlignmentMustBeAPowerOfTwo) {
  for (uint32_t a : {0u, 3u, 48u, 1u << 31}) {
    GgufWriter w;
    w.add_u32("general.alignment", a);
    expect_error(w.build(), "is not a power of two");
  }
  GgufWriter w;
  w.add_string("general.alignment", "32");
  expect_error(w.build(), "general.alignment must be an integer");
}

TEST(Gguf, TensorInfoErrors) {
  auto with_tensor = [](uint32_t type, std::vector<int64_t> ne, uint64_t offset) {
    GgufWriter w;
    w.add_tensor_at("blk.0.attn_q.weight", type, ne, offset);
    return w.build();
  };
  expect_error(with_tensor(kF32, {}, 0), "tensor 'blk.0.attn_q.weight': 0 dimensions (expected 1 to 4)");
  expect_error(with_tensor(kF32, {1, 1, 1, 1, 1}, 0), "5 dimensions");
  expect_error(with_tensor(kF32, {4, -1}, 0), "negative dimension -1");
  expect_error(with_tensor(kF32, {1ll << 32, 1ll << 32}, 0), "element count overflows");
  expect_error(with_tensor(kF32, {1ll << 62}, 0), "data size overflows");
  expect_error(with_tensor(kF32, {4}, 16), "data offset 16 is not a multiple of the alignment 32");
  expect_error(with_tensor(kQ8_0, {33}, 0), "row length 33 is not a multiple of Q8_0's block size 32");
  expect_error(with_tensor(kF32, {4}, UINT64_MAX - 31), "runs past the end of the file");

  // The exact message for data past the end.
  GgufWriter w;
  w.add_tensor("a", kF32, {8}, bytes_of(32));
  w.add_tensor_at("blk.0.attn_q.weight", kF16, {2048}, 64);
  const auto image = w.build();
  expect_error(image,
               "x.gguf: tensor 'blk.0.attn_q.weight': data [offset 64, 4096 bytes] runs past "
               "the end of the file (" +
                   std::to_string(image.size()) + " bytes)");

  w = GgufWriter();
  w.add_tensor("a", kF32, {8}, bytes_of(32));
  w.add_tensor("a", kF32, {8}, bytes_of(32));
  expect_error(w.build(), "duplicate tensor name 'a'");

  // An unsupported type is recorded (no data) but its offset is still checked.
  EXPECT_TRUE(parse_image(with_tensor(kIQ2_XXS, {256}, 1ull << 40)).ok());
  expect_error(with_tensor(kIQ2_XXS, {256}, 8), "not a multiple of the alignment");
  // Q2_K is supported: its data must lie inside the file.
  expect_error(with_tensor(kQ2_K, {256}, 1ull << 40), "runs past the end of the file");
}

// Seeds written by the reference Python writer (tools/make_gguf_fuzz_seeds.py).
std::vector<uint8_t> read_seed(const std::string& name) {
  std::ifstream in(std::string(RILL_SOURCE_DIR) + "/tests/fuzz/corpus/gguf/" + name, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(Gguf, ReadsFilesWrittenByTheReferenceWriter) {
  for (const char* name : {"all_types.gguf", "all_types_v2.gguf"}) {
    auto image = read_seed(name);
    ASSERT_FALSE(image.empty()) << name;
    auto r = parse_image(image);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const GgufFile& f = **r;
    EXPECT_EQ(f.version(), std::string(name) == "all_types.gguf" ? 3u : 2u);
    EXPECT_EQ(f.get_int("t.u8"), 200);
    EXPECT_EQ(f.get_int("t.i8"), -100);
    EXPECT_EQ(f.get_int("t.u16"), 60000);
    EXPECT_EQ(f.get_int("t.i16"), -30000);
    EXPECT_EQ(f.get_int("t.u32"), 4000000000ll);
    EXPECT_EQ(f.get_int("t.i32"), -2000000000);
    EXPECT_EQ(f.get_float("t.f32"), 0.5);
    EXPECT_EQ(f.get_int("t.bool"), 1);
    EXPECT_EQ(f.get_string("t.string"), "h\xc3\xa9llo");
    EXPECT_EQ(std::get<uint64_t>(f.find("t.u64")->v), (1ull << 63) + 5);
    EXPECT_EQ(f.get_int("t.i64"), -(1ll << 62));
    EXPECT_EQ(f.get_float("t.f64"), -1.25);
    EXPECT_EQ((*f.get_array("t.arr_i32"))[1].as_int(), -2);
    EXPECT_EQ(*(*f.get_array("t.arr_str"))[2].as_string(), "ccc");
    const GgufArray* nested = f.get_array("t.arr_nested");
    ASSERT_EQ(nested->size(), 2u);
    EXPECT_EQ((*(*nested)[1].as_array())[0].as_int(), 3);
  }
  auto r = parse_image(read_seed("qwen2_yarn.gguf"));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)->alignment(), 64u);
  EXPECT_EQ((*r)->data_start() % 64, 0u);
  const GgufTensorInfo* k = (*r)->find_tensor("blk.0.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->ne, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(k->offset, 2176u);
  EXPECT_EQ(k->n_bytes, 1024u);
  const GgufTensorInfo* q2 = (*r)->find_tensor("blk.0.ffn_up.weight");  // Q2_K: located since rill reads it
  EXPECT_EQ(q2->type, kQ2_K);
  EXPECT_NE(q2->data, nullptr);
  EXPECT_EQ(q2->n_bytes, 84u);
}

// The default model against the reference reader's dump (tools/make_gguf_golden.py).
TEST(Gguf, DefaultModelMatchesReferenceReader) {
  const std::string path = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is missing";
  std::ifstream in(std::string(RILL_TEST_DATA) + "/gguf/smollm2_summary.json");
  ASSERT_TRUE(in) << "missing golden";
  const nlohmann::json g = nlohmann::json::parse(in);
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const GgufFile& f = **r;
  EXPECT_EQ(f.mapping().size(), g["file_size"].get<size_t>());
  EXPECT_EQ(f.version(), g["version"].get<uint32_t>());
  EXPECT_EQ(f.alignment(), g["alignment"].get<size_t>());
  EXPECT_EQ(f.data_start(), g["data_start"].get<size_t>());
  EXPECT_EQ(f.metadata().size(), g["n_kv"].get<size_t>());
  for (const auto& [key, s] : g["scalars"].items()) {
    SCOPED_TRACE(key);
    const GgufValue* v = f.find(key);
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(static_cast<int>(v->type), s["type"].get<int>());
    const auto& want = s["value"];
    if (want.is_string())
      EXPECT_EQ(f.get_string(key), want.get<std::string>());
    else if (want.is_boolean())
      EXPECT_EQ(v->as_int(), want.get<bool>() ? 1 : 0);
    else if (want.is_number_float())
      EXPECT_EQ(v->as_float(), want.get<double>());
    else
      EXPECT_EQ(v->as_int(), want.get<int64_t>());
  }
  for (const auto& [key, a] : g["arrays"].items()) {
    SCOPED_TRACE(key);
    const GgufArray* arr = f.get_array(key);
    ASSERT_NE(arr, nullptr);
    EXPECT_EQ(static_cast<int>(f.find(key)->array_type), a["elem_type"].get<int>());
    ASSERT_EQ(arr->size(), a["length"].get<size_t>());
    if (a["first"].is_string()) {
      EXPECT_EQ(*arr->front().as_string(), a["first"].get<std::string>());
      EXPECT_EQ(*arr->back().as_string(), a["last"].get<std::string>());
    } else if (a.contains("first")) {
      EXPECT_EQ(arr->front().as_float(), a["first"].get<double>());
      EXPECT_EQ(arr->back().as_float(), a["last"].get<double>());
    }
  }
  const auto& tensors = g["tensors"];
  ASSERT_EQ(f.tensors().size(), tensors.size());
  ASSERT_EQ(f.tensors().size(), 272u);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, tensors[i]["name"].get<std::string>());
    EXPECT_EQ(t.type, tensors[i]["type"].get<uint32_t>());
    EXPECT_EQ(t.ne, tensors[i]["ne"].get<std::vector<int64_t>>());
    EXPECT_EQ(t.offset, tensors[i]["offset"].get<uint64_t>());
    EXPECT_EQ(t.n_bytes, tensors[i]["n_bytes"].get<size_t>());
    EXPECT_EQ(t.data, f.mapping().data() + f.data_start() + t.offset);
  }
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, kQ8_0);
  EXPECT_EQ(embd->ne, (std::vector<int64_t>{576, 49152}));
}

}  // namespace
}  // namespace rill
