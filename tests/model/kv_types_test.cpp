// KV type options (model/kv_types.h): names, the --kv-config file (errors
// name the file and line), per-layer resolution, the checks a cache's shape
// must pass, PagedKvCache's per-layer row bytes, and k4c's pair of types.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <utility>

#include "core/e4m3.h"
#include "model/kv_types.h"
#include "model/paged_kv_cache.h"

namespace rill {
namespace {
namespace fs = std::filesystem;

struct ConfigFile {
  fs::path path;
  explicit ConfigFile(const std::string& text) {
    path = fs::temp_directory_path() /
           ("rill_kv_config_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()) + ".conf");
    std::ofstream(path) << text;
  }
  ~ConfigFile() { fs::remove(path); }
};

TEST(KvTypes, NamesRoundTrip) {
  for (const char* n :
       {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_0h", "q8_0h", "iq4_nlh", "fp8"}) {
    const auto t = parse_kv_type(n);
    ASSERT_TRUE(t) << n;
    EXPECT_EQ(kv_type_name(*t), n);
  }
  EXPECT_FALSE(parse_kv_type("q4_K"));
  EXPECT_FALSE(parse_kv_type("fp8_e5m2"));
  // fp8: e4m3 bytes (core/e4m3.h), a byte per element, not quantized in blocks.
  EXPECT_EQ(parse_kv_type("fp8")->group_size(), 1);
  EXPECT_EQ(row_bytes(parse_kv_type("fp8")->dtype, 128), 128u);
  EXPECT_EQ(dtype_name(parse_kv_type("fp8")->dtype), "F8_E4M3");
  EXPECT_EQ(describe_kv_types({{*parse_kv_type("fp8"), *parse_kv_type("fp8")}}, DType::kF16), "kv=fp8");
  EXPECT_TRUE(parse_kv_type("q4_0h")->rotated);
  EXPECT_EQ(*parse_kv_type("q8_0h"), (KvType{DType::kQ8_0, true}));
  // iq4_nlh: GGML's IQ4_NL blocks (18 bytes per 32, as q4_0h) of rotated
  // heads; plain iq4_nl is not a KV type (no GGML encoder here).
  EXPECT_EQ(*parse_kv_type("iq4_nlh"), (KvType{DType::kIQ4_NL, true}));
  EXPECT_EQ(row_bytes(DType::kIQ4_NL, 64), row_bytes(DType::kQ4_0, 64));
  EXPECT_FALSE(parse_kv_type("iq4_nl"));
  EXPECT_EQ(describe_kv_types({{*parse_kv_type("iq4_nlh"), *parse_kv_type("iq4_nlh")}}, DType::kF16), "kv=iq4_nlh#2");
  const KvType plain_nl{DType::kIQ4_NL, false};
  const Status refused = check_kv_layer_types(0, {plain_nl, plain_nl}, 3, 64);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("iq4_nlh"), std::string::npos) << refused.error().message;
  EXPECT_TRUE(check_kv_layer_types(0, {*parse_kv_type("iq4_nlh"), *parse_kv_type("iq4_nlh")}, 3, 64).ok());
}

// q8_0h64: rotated q8_0 in blocks of 64 with one f16 scale (66 bytes per
// 64 values: 1.939x f16's tokens per GiB, q8_0's 34 per 32 1.882x); rotated
// only, and only on heads of whole blocks of 64 (refused by name otherwise).
TEST(KvTypes, Q8_0h64NameBytesAndRules) {
  const std::optional<KvType> t = parse_kv_type("q8_0h64");
  ASSERT_TRUE(t);
  EXPECT_EQ(*t, (KvType{kKvQ8_0x64, true}));
  EXPECT_EQ(kv_type_name(*t), "q8_0h64");
  EXPECT_EQ(t->group_size(), 64);
  EXPECT_TRUE(t->quantized());
  EXPECT_EQ(dtype_name(kKvQ8_0x64), "Q8_0_64");
  EXPECT_EQ(*parse_kv_pair("q8_0h64"), (KvLayerTypes{*t, *t}));
  EXPECT_NE(kv_type_names().find("q8_0h64"), std::string::npos) << kv_type_names();
  EXPECT_FALSE(parse_kv_type("q8_064"));
  // A row of 192 (3 heads of 64): 3 blocks of 66 bytes, against q8_0's 6 of 34.
  EXPECT_EQ(row_bytes(kKvQ8_0x64, 192), 198u);
  EXPECT_EQ(row_bytes(DType::kQ8_0, 192), 204u);
  const double f16 = static_cast<double>(row_bytes(DType::kF16, 192));
  EXPECT_NEAR(f16 / static_cast<double>(row_bytes(kKvQ8_0x64, 192)), 1.939, 1e-3);
  EXPECT_LT(f16 / static_cast<double>(row_bytes(DType::kQ8_0, 192)), 1.9);
  EXPECT_EQ(describe_kv_types({{*t, *t}}, DType::kF16), "kv=q8_0h64#2");
  EXPECT_EQ(describe_kv_types({{*t, KvType{DType::kF16, false}}}, DType::kF16), "kv=k:q8_0h64#2/v:f16");
  for (const int64_t hd : {64, 128, 256, 512}) EXPECT_TRUE(check_kv_layer_types(0, {*t, *t}, 3, hd).ok()) << hd;
  // Heads of 32 (two of them fill a block of 64) and of 96 (not a power of
  // two, and 1.5 blocks): refused, naming the type and the head_dim.
  for (const auto& [n_head, hd] : {std::pair<int64_t, int64_t>{2, 32}, {4, 32}, {2, 96}}) {
    const Status s = check_kv_layer_types(3, {KvType{DType::kF16, false}, *t}, n_head, hd);
    ASSERT_FALSE(s.ok()) << n_head << " x " << hd;
    EXPECT_NE(s.error().message.find("KV layer 3 V type q8_0h64"), std::string::npos) << s.error().message;
  }
  const Status hd32 = check_kv_layer_types(0, {*t, *t}, 2, 32);
  ASSERT_FALSE(hd32.ok());
  EXPECT_NE(hd32.error().message.find("head_dim 32 is not a multiple of 64"), std::string::npos)
      << hd32.error().message;
  const Status plain = check_kv_layer_types(0, {KvType{kKvQ8_0x64, false}, *t}, 3, 64);
  ASSERT_FALSE(plain.ok());
  EXPECT_NE(plain.error().message.find("rotated only (q8_0h64)"), std::string::npos) << plain.error().message;
  // From a --kv-config line, per side.
  ConfigFile f("0-1 k=q8_0h64 v=q8_0\n");
  KvTypeOptions o;
  ASSERT_TRUE(load_kv_config(f.path.string(), o).ok());
  auto r = o.resolve(3, DType::kF16);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)[1].k, *t);
  EXPECT_EQ((*r)[1].v, (KvType{DType::kQ8_0, false}));
  EXPECT_EQ((*r)[2].k, (KvType{DType::kF16, false}));
}

TEST(KvTypes, ConfigResolvesPerLayer) {
  ConfigFile f("# first and last layers at 8 bits\n0 q8_0\n-1   q8_0  # the last\n\n2-3 k=q5_1 v=q4_0h\n");
  KvTypeOptions o;
  o.k = o.v = parse_kv_type("q4_0h");
  ASSERT_TRUE(load_kv_config(f.path.string(), o).ok());
  auto r = o.resolve(6, DType::kF16);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const KvType q8{DType::kQ8_0, false}, q4h{DType::kQ4_0, true}, q51{DType::kQ5_1, false};
  EXPECT_EQ((*r)[0], (KvLayerTypes{q8, q8}));
  EXPECT_EQ((*r)[1], (KvLayerTypes{q4h, q4h}));
  EXPECT_EQ((*r)[2], (KvLayerTypes{q51, q4h}));
  EXPECT_EQ((*r)[3], (KvLayerTypes{q51, q4h}));
  EXPECT_EQ((*r)[5], (KvLayerTypes{q8, q8}));
  // Rotated types carry their encoder's revision (cpu::kKvRotatedEncoder),
  // so KV files stored by another revision are refused.
  EXPECT_EQ(describe_kv_types(*r, DType::kF16), "kv=q8_0,q4_0h#2,k:q5_1/v:q4_0h#2,k:q5_1/v:q4_0h#2,q4_0h#2,q8_0");
  // No option: the model's own type, described as nothing.
  auto plain = KvTypeOptions{}.resolve(3, DType::kF32);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)[1], (KvLayerTypes{{DType::kF32, false}, {DType::kF32, false}}));
  EXPECT_EQ(describe_kv_types(*plain, DType::kF32), "");
}

TEST(KvTypes, ConfigErrorsNameFileAndLine) {
  struct Case {
    const char* text;
    const char* want;
  };
  const Case cases[] = {
      {"0 q8_0\n1 q3_0\n", ":2: unknown KV type 'q3_0'"},
      {"x q8_0\n", ":1: 'x' is not a layer"},
      {"3-1 q8_0\n", ":1: '3-1' is not a layer"},
      {"0\n", ":1: layer '0' names no KV type"},
      {"0 q8_0 k=q4_0\n", ":1: give one type for both sides"},
      {"0 k=q8_0 k=q4_0\n", ":1: k= given twice"},
  };
  for (const Case& c : cases) {
    ConfigFile f(c.text);
    KvTypeOptions o;
    Status st = load_kv_config(f.path.string(), o);
    ASSERT_FALSE(st.ok()) << c.text;
    EXPECT_NE(st.error().message.find(f.path.string() + c.want), std::string::npos) << st.error().message;
  }
  KvTypeOptions o;
  EXPECT_FALSE(load_kv_config("/nonexistent/kv.conf", o).ok());
  const Status folder = load_kv_config(std::filesystem::temp_directory_path().string(), o);
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.error().message.find("folder"), std::string::npos) << folder.error().message;
  // A layer beyond the model is caught when the model's layer count is known.
  ConfigFile f("\n7 q8_0\n");
  ASSERT_TRUE(load_kv_config(f.path.string(), o).ok());
  auto r = o.resolve(6, DType::kF16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(f.path.string() + ":2: layer 7 is outside the model's 6 KV layers"),
            std::string::npos)
      << r.error().message;
}

TEST(KvTypes, ChecksRowShape) {
  const KvType q8{DType::kQ8_0, false}, q4h{DType::kQ4_0, true};
  EXPECT_TRUE(check_kv_types({{q8, q8}}, 2, 64).ok());
  EXPECT_TRUE(check_kv_types({{q8, q8}}, 2, 16).ok());     // heads share blocks
  EXPECT_FALSE(check_kv_types({{q8, q8}}, 1, 16).ok());    // a row of half a block
  EXPECT_FALSE(check_kv_types({{q4h, q4h}}, 1, 96).ok());  // rotation needs a power of two
  EXPECT_TRUE(check_kv_types({{q4h, q4h}}, 1, 128).ok());
}

TEST(KvTypes, CacheRowBytesPerLayerAndSide) {
  const KvType f16{DType::kF16, false}, q8{DType::kQ8_0, false}, q4h{DType::kQ4_0, true};
  auto c = PagedKvCache::create(4, 16, 3, 64, {{q8, q8}, {f16, q4h}});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->k_row_bytes(0), 6u * 34);
  EXPECT_EQ(c->v_row_bytes(1), 6u * 18);
  EXPECT_EQ(c->k_row_bytes(1), 192u * 2);
  EXPECT_EQ(c->bytes_per_token(), 6u * 34 * 2 + 192u * 2 + 6u * 18);
  const KvCacheView v = c->layer_view(1);
  EXPECT_EQ(v.dtype, DType::kF16);
  EXPECT_EQ(v.v_type(), DType::kQ4_0);
  EXPECT_TRUE(v.v_rotated && !v.k_rotated && !v.plain());
  // Stored rows read back through the block table (the quantized bytes).
  std::vector<float> k(192), vv(192);
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i % 7) - 3.0f, vv[i] = 0.5f;
  const std::vector<int32_t> table = {2};
  const int32_t pos = 5;
  c->store(0, table, k.data(), vv.data(), &pos, 1, 192);
  std::vector<uint8_t> kb(16 * c->k_row_bytes(0)), vb(16 * c->v_row_bytes(0));
  c->copy_block_out(0, 2, kb.data(), vb.data());
  const auto* blk = reinterpret_cast<const int8_t*>(kb.data() + 5 * c->k_row_bytes(0));
  EXPECT_EQ(blk[2 + 3], 0);    // element 3: 3 % 7 - 3 = 0
  EXPECT_EQ(blk[2 + 6], 127);  // element 6: +3, the block's maximum
}

// Layers of their own shape (Gemma 4: full layers wider than sliding ones)
// and their own types: each layer's rows are sized by its own heads, sit at
// their own offsets, and its types are checked against its own head_dim.
TEST(KvTypes, CacheLayersOfTheirOwnShapeAndTypes) {
  const KvType f16{DType::kF16, false}, q8{DType::kQ8_0, false}, q4h{DType::kQ4_0, true};
  using Spec = PagedKvCache::LayerSpec;
  auto c = PagedKvCache::create_layers({Spec{2, 16, {q8, q8}}, Spec{2, 32, {q4h, q8}}, Spec{4, 16, {f16, f16}}}, 4, 16);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->width(0), 32);
  EXPECT_EQ(c->width(1), 64);
  EXPECT_EQ(c->k_row_bytes(0), 34u);
  EXPECT_EQ(c->k_row_bytes(1), 2u * 18);
  EXPECT_EQ(c->v_row_bytes(1), 2u * 34);
  EXPECT_EQ(c->k_row_bytes(2), 64u * 2);
  EXPECT_EQ(c->bytes_per_token(), 34u * 2 + 36 + 68 + 128 * 2);
  EXPECT_TRUE(c->layer_view(1).k_rotated);
  // Writing the wide layer leaves the narrow one's rows of the same block alone.
  std::vector<float> k(64), v(64);
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i % 5) - 2.0f, v[i] = 1.0f;
  const std::vector<int32_t> table = {1};
  const int32_t pos = 3;
  c->store(0, table, k.data(), v.data(), &pos, 1, 64);
  std::vector<uint8_t> k0(16 * 34), v0(16 * 34);
  c->copy_block_out(0, 1, k0.data(), v0.data());
  for (float& x : k) x = 9.0f;
  c->store(1, table, k.data(), v.data(), &pos, 1, 64);
  std::vector<uint8_t> k0b(16 * 34), v0b(16 * 34);
  c->copy_block_out(0, 1, k0b.data(), v0b.data());
  EXPECT_EQ(k0, k0b);
  EXPECT_EQ(v0, v0b);
  const auto* blk = reinterpret_cast<const int8_t*>(k0.data() + 3 * 34);
  EXPECT_EQ(blk[2 + 2], 0);    // element 2: 2 % 5 - 2 = 0
  EXPECT_EQ(blk[2 + 4], 127);  // element 4: +2, the block's maximum
  // Types are checked against each layer's own head_dim, naming the layer.
  auto bad = PagedKvCache::create_layers({Spec{2, 32, {q4h, q4h}}, Spec{1, 48, {q4h, q4h}}}, 4, 16);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("KV layer 1"), std::string::npos) << bad.error().message;
  // Plain types have no head_dim limit (width-only layers are one wide head).
  EXPECT_TRUE(PagedKvCache::create_layers(std::vector<int64_t>{2048, 4096}, 2, 16, DType::kF16).ok());
}

// k4c: a pair of types (K per channel over a block's 32 tokens, V rotated
// iq4_nl in blocks of 64 with an e4m3 scale), named as one for both sides;
// q4c only on K, iq4_nlh64 only rotated, q4c pools only with blocks of 32.
TEST(KvTypes, K4cPairAndItsRules) {
  const auto pair = parse_kv_pair("k4c");
  ASSERT_TRUE(pair);
  EXPECT_EQ(pair->k, (KvType{kKvQ4Chan, false}));
  EXPECT_EQ(pair->v, (KvType{kKvIq4Nl64, true}));
  EXPECT_FALSE(parse_kv_type("k4c")) << "a pair, not one side's type";
  EXPECT_EQ(kv_type_name(pair->k), "q4c");
  EXPECT_EQ(kv_type_name(pair->v), "iq4_nlh64");
  EXPECT_EQ(*parse_kv_pair("q8_0"), (KvLayerTypes{*parse_kv_type("q8_0"), *parse_kv_type("q8_0")}));
  EXPECT_NE(kv_type_names().find("k4c (k=q4c v=iq4_nlh64)"), std::string::npos) << kv_type_names();
  // Bytes per token of a row of 192 (3 heads of 64): K 19 per channel per
  // 32 tokens, V 33 per 64 values.
  EXPECT_EQ(row_bytes(kKvQ4Chan, 192), 114u);
  EXPECT_EQ(row_bytes(kKvIq4Nl64, 192), 99u);
  EXPECT_EQ(describe_kv_types({*pair}, DType::kF16), "kv=k:q4c#3/v:iq4_nlh64#2");
  EXPECT_TRUE(check_kv_layer_types(0, *pair, 3, 64).ok());
  const Status v_chan = check_kv_layer_types(0, {pair->v, pair->k}, 3, 64);
  ASSERT_FALSE(v_chan.ok());
  EXPECT_NE(v_chan.error().message.find("V type q4c"), std::string::npos) << v_chan.error().message;
  EXPECT_FALSE(check_kv_layer_types(0, {pair->k, KvType{kKvIq4Nl64, false}}, 3, 64).ok());
  EXPECT_FALSE(check_kv_layer_types(0, *pair, 1, 32).ok()) << "a V row of half a block of 64";
  // attention_chan works head by head: whole rows of whole blocks are not
  // enough (2 heads of 32 fill a V block of 64 but each head is half of it).
  const Status half_head = check_kv_layer_types(0, *pair, 2, 32);
  ASSERT_FALSE(half_head.ok());
  EXPECT_NE(half_head.error().message.find("head_dim a multiple of 16 and of V's block of 64, not 32"),
            std::string::npos)
      << half_head.error().message;
  const KvType f16{DType::kF16, false};
  EXPECT_FALSE(check_kv_layer_types(0, {pair->k, f16}, 4, 40).ok()) << "q4c K reads channels 16 at a time";
  EXPECT_TRUE(check_kv_layer_types(0, {pair->k, f16}, 4, 48).ok());
  EXPECT_TRUE(check_kv_layer_types(0, {pair->k, f16}, 2, 16).ok()) << "two heads of 16 share a tail block";
  const Status row_16 = check_kv_layer_types(0, {pair->k, f16}, 1, 16);
  ASSERT_FALSE(row_16.ok()) << "a KV row of 16 is half a block of the tail's q8_0 rows";
  EXPECT_NE(row_16.error().message.find("a KV row of 1 heads of 16 is not whole blocks of 32"), std::string::npos)
      << row_16.error().message;
  EXPECT_FALSE(check_kv_layer_types(0, {pair->k, *parse_kv_type("q8_0")}, 4, 48).ok()) << "a q8_0 block of 32";
  // The pool: blocks of 32 only; its layer view names the tail.
  auto bad = PagedKvCache::create(4, 16, 3, 64, {*pair});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("not 16"), std::string::npos) << bad.error().message;
  auto c = PagedKvCache::create(4, 32, 3, 64, {*pair, {{DType::kF16, false}, {DType::kF16, false}}});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->bytes_per_token(), 114u + 99u + 2 * 384u);
  ASSERT_TRUE(c->create_tails(3).ok());
  EXPECT_EQ(c->tails().n_slots(), 3);
  // A 64-byte head, then 32 K and 32 V rows of 192 in q8_0 (6 blocks of 34 bytes).
  EXPECT_EQ(c->tails().bytes(), 3u * (64 + 2 * 32 * 6 * 34)) << "one layer keeps a tail";
  const KvCacheView v = c->layer_view(0);
  EXPECT_NE(v.tail, nullptr);
  EXPECT_EQ(v.tail_stride, 64u + 2 * 32 * 6 * 34);
  EXPECT_EQ(c->layer_view(1).tail, nullptr);
  // A --kv-config line names the pair for both sides.
  ConfigFile f("1 k4c\n");
  KvTypeOptions o;
  ASSERT_TRUE(load_kv_config(f.path.string(), o).ok());
  auto r = o.resolve(2, DType::kF16);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)[1], *pair);
  EXPECT_EQ((*r)[0].k, (KvType{DType::kF16, false}));
}

// k4a: k4c with q4a's K (each channel at its own width, the same bytes);
// q4a only on K, with k4c's rules, and named in the numerics with k4c's
// encoder revision (its widths join them in CpuPagedModel::kv_numerics).
TEST(KvTypes, K4aPairAndItsRules) {
  const auto pair = parse_kv_pair("k4a");
  ASSERT_TRUE(pair);
  EXPECT_EQ(pair->k, (KvType{kKvQ4Alloc, false}));
  EXPECT_EQ(pair->v, (KvType{kKvIq4Nl64, true}));
  EXPECT_EQ(kv_type_name(pair->k), "q4a");
  EXPECT_EQ(*parse_kv_type("q4a"), pair->k);
  EXPECT_NE(kv_type_names().find("k4a (k=q4a v=iq4_nlh64)"), std::string::npos) << kv_type_names();
  EXPECT_EQ(row_bytes(kKvQ4Alloc, 192), row_bytes(kKvQ4Chan, 192));
  EXPECT_EQ(describe_kv_types({*pair}, DType::kF16), "kv=k:q4a#3/v:iq4_nlh64#2");
  EXPECT_TRUE(check_kv_layer_types(0, *pair, 3, 64).ok());
  const Status v_alloc = check_kv_layer_types(0, {pair->v, pair->k}, 3, 64);
  ASSERT_FALSE(v_alloc.ok());
  EXPECT_NE(v_alloc.error().message.find("V type q4a"), std::string::npos) << v_alloc.error().message;
  EXPECT_NE(v_alloc.error().message.find("k4a: k=q4a v=iq4_nlh64"), std::string::npos) << v_alloc.error().message;
  EXPECT_FALSE(check_kv_layer_types(0, *pair, 1, 32).ok()) << "a V row of half a block of 64";
  KvTypeOptions o;
  EXPECT_FALSE(o.mentions(kKvQ4Alloc));
  o.layers.push_back({3, 3, pair->k, std::nullopt, "f:1"});
  EXPECT_TRUE(o.mentions(kKvQ4Alloc));
  // A pool holding q4a has blocks of 32, and starts every layer at 4 bits.
  EXPECT_FALSE(PagedKvCache::create(4, 16, 3, 64, {*pair}).ok());
  auto c = PagedKvCache::create(4, 32, 3, 64, {*pair});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->k_widths(0), std::vector<uint8_t>(192, 4));
  EXPECT_EQ(c->layer_view(0).k_widths, c->k_widths(0).data());
  EXPECT_EQ(c->layer_view(0).calibration, nullptr);
}

}  // namespace
}  // namespace rill
