// KV file format v2: round trip, and every fault named in the format's
// contract is refused with an error naming the file: a flipped header byte,
// a flipped tensor byte (with verification on), a truncated file, an empty
// file, bad magic, another model / config / namespace / tokenizer. A writer
// stopped and killed mid-write (SIGKILL) leaves only a `.tmp`, never an entry.
#include "kv/kv_file.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <thread>
#include <tuple>

#include "core/e4m3.h"
#include "core/hash.h"

namespace rill {
namespace {
namespace fs = std::filesystem;

struct TmpDir {
  fs::path path;
  TmpDir() {
    path = fs::temp_directory_path() /
           ("rill_kvfile_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

KvFileIdentity identity() {
  return {"model-abc", "config-123", 0x1122334455667788ull, 0x99aabbccddeeff00ull, "cpu avx512"};
}

std::vector<uint8_t> bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> b(n);
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// Two layers, K and V of 32 tokens x 8 f16 each.
struct Sample {
  std::vector<int32_t> tokens;
  std::vector<std::vector<uint8_t>> data;
  std::vector<KvLayerData> layers;
  Sample() {
    for (int i = 0; i < 32; ++i) tokens.push_back(100 + i);
    for (int i = 0; i < 4; ++i) data.push_back(bytes(32 * 8 * 2, static_cast<uint32_t>(i + 1)));
    for (int l = 0; l < 2; ++l) {
      KvLayerData d;
      d.kind = l == 0 ? LayerKind::kFull : LayerKind::kSliding;
      d.tensors.push_back({"k", {32, 8}, DType::kF16, data[2 * l]});
      d.tensors.push_back({"v", {32, 8}, DType::kF16, data[2 * l + 1]});
      layers.push_back(std::move(d));
    }
  }
};

std::string write_sample(const fs::path& dir, const Sample& s) {
  const std::string path = (dir / "run.rkv").string();
  Status st = write_kv_file(path, identity(), s.tokens, s.layers);
  EXPECT_TRUE(st.ok()) << st.error().message;
  return path;
}

void flip_byte(const std::string& path, uint64_t off) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(off));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(static_cast<std::streamoff>(off));
  f.write(&c, 1);
}

TEST(KvFile, RoundTripKeepsEveryTensorAndField) {
  TmpDir dir;
  Sample s;
  const std::string path = write_sample(dir.path, s);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  auto f = KvFile::open(path, nullptr, /*verify_tensors=*/true);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const KvFileHeader& h = f->header();
  EXPECT_EQ(h.identity, identity());
  EXPECT_EQ(h.tokens, s.tokens);
  EXPECT_GT(h.created_at, 0);
  ASSERT_EQ(h.layers.size(), 2u);
  EXPECT_EQ(h.layers[0].kind, LayerKind::kFull);
  EXPECT_EQ(h.layers[1].kind, LayerKind::kSliding);
  for (size_t l = 0; l < 2; ++l) {
    for (size_t t = 0; t < 2; ++t) {
      const KvTensorDesc& d = h.layers[l].tensors[t];
      EXPECT_EQ(d.off % kKvFileAlignment, 0u);
      EXPECT_EQ(d.shape, (std::vector<int64_t>{32, 8}));
      const auto span = f->tensor(l, t);
      ASSERT_EQ(span.size(), s.data[2 * l + t].size());
      EXPECT_EQ(0, std::memcmp(span.data(), s.data[2 * l + t].data(), span.size()));
    }
  }
  auto header_only = read_kv_header(path);
  ASSERT_TRUE(header_only.ok()) << header_only.error().message;
  EXPECT_EQ(header_only->tokens, s.tokens);
  const KvFileIdentity want = identity();
  EXPECT_TRUE(KvFile::open(path, &want, false).ok());
}

// fp8 KV (kF8E4M3, a byte per element, no block): its tensors keep their
// dtype ("F8_E4M3", no groupSize) and bytes through a file.
TEST(KvFile, Fp8TensorsRoundTripWithTheirDtype) {
  TmpDir dir;
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  const std::vector<uint8_t> k = bytes(4 * 16, 5), v = bytes(4 * 16, 6);
  KvLayerData d;
  d.kind = LayerKind::kFull;
  d.tensors.push_back({"k", {4, 16}, kF8E4M3, k});
  d.tensors.push_back({"v", {4, 16}, kF8E4M3, v});
  const std::string path = (dir.path / "fp8.rkv").string();
  const std::vector<KvLayerData> layers = {d};
  ASSERT_TRUE(write_kv_file(path, identity(), tokens, layers).ok());
  auto f = KvFile::open(path, nullptr, /*verify_tensors=*/true);
  ASSERT_TRUE(f.ok()) << f.error().message;
  ASSERT_EQ(f->header().layers.size(), 1u);
  for (size_t t = 0; t < 2; ++t) {
    EXPECT_EQ(f->header().layers[0].tensors[t].dtype, kF8E4M3);
    const auto span = f->tensor(0, t);
    ASSERT_EQ(span.size(), 64u);
    EXPECT_EQ(0, std::memcmp(span.data(), (t == 0 ? k : v).data(), 64));
  }
}

// A sliding layer that keeps only its window: "window" and "firstToken" in
// its layer record round-trip; a firstToken beyond the tokens is refused.
TEST(KvFile, SlidingLayerWindowAndFirstTokenRoundTrip) {
  TmpDir dir;
  Sample s;
  const auto window_k = bytes(16 * 8 * 2, 7), window_v = bytes(16 * 8 * 2, 8);
  s.layers[1].window = 4;
  s.layers[1].first_token = 16;
  s.layers[1].tensors[0] = {"k", {16, 8}, DType::kF16, window_k};
  s.layers[1].tensors[1] = {"v", {16, 8}, DType::kF16, window_v};
  const std::string path = write_sample(dir.path, s);
  auto h = read_kv_header(path);
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(h->layers[0].window, 0);
  EXPECT_EQ(h->layers[0].first_token, 0);
  EXPECT_EQ(h->layers[1].window, 4);
  EXPECT_EQ(h->layers[1].first_token, 16);
  EXPECT_EQ(h->layers[1].tensors[0].shape, (std::vector<int64_t>{16, 8}));
  auto f = KvFile::open(path, nullptr, /*verify_tensors=*/true);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(0, std::memcmp(f->tensor(1, 0).data(), window_k.data(), window_k.size()));

  s.layers[1].first_token = 33;  // past the 32 tokens
  const std::string bad_path = write_sample(dir.path, s);
  auto bad = read_kv_header(bad_path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("firstToken"), std::string::npos) << bad.error().message;
}

// A long prompt makes the header much smaller than the writer's first size
// bound: the tensors must still sit exactly where the header says.
TEST(KvFile, LongTokenListKeepsThePromisedOffsets) {
  TmpDir dir;
  std::vector<int32_t> tokens(3000, 7);
  const auto k = bytes(3000 * 4, 1), v = bytes(3000 * 4, 2);
  KvLayerData l;
  l.tensors.push_back({"k", {3000, 2}, DType::kF16, k});
  l.tensors.push_back({"v", {3000, 2}, DType::kF16, v});
  const KvLayerData layers[1] = {l};
  const std::string path = (dir.path / "long.rkv").string();
  ASSERT_TRUE(write_kv_file(path, identity(), tokens, layers).ok());
  auto f = KvFile::open(path, nullptr, /*verify_tensors=*/true);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(0, std::memcmp(f->tensor(0, 1).data(), v.data(), v.size()));
}

TEST(KvFile, FlippedHeaderByteIsRefused) {
  TmpDir dir;
  Sample s;
  const std::string path = write_sample(dir.path, s);
  flip_byte(path, 24 + 10);  // inside the JSON
  auto f = KvFile::open(path, nullptr, false);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find(path), std::string::npos);
  EXPECT_NE(f.error().message.find("header hash"), std::string::npos) << f.error().message;
  EXPECT_FALSE(read_kv_header(path).ok());
}

TEST(KvFile, FlippedTensorByteIsRefusedWhenVerifying) {
  TmpDir dir;
  Sample s;
  const std::string path = write_sample(dir.path, s);
  auto ok = KvFile::open(path, nullptr, false);
  ASSERT_TRUE(ok.ok());
  const uint64_t off = ok->header().layers[1].tensors[1].off + 5;
  flip_byte(path, off);
  auto lazy = KvFile::open(path, nullptr, /*verify_tensors=*/false);
  EXPECT_TRUE(lazy.ok()) << "without verification only the header is checked";
  auto f = KvFile::open(path, nullptr, /*verify_tensors=*/true);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("tensor v of layer 1"), std::string::npos) << f.error().message;
}

TEST(KvFile, TruncatedEmptyAndForeignFilesAreRefused) {
  TmpDir dir;
  Sample s;
  const std::string path = write_sample(dir.path, s);
  const auto size = fs::file_size(path);
  fs::resize_file(path, size - 100);
  EXPECT_FALSE(KvFile::open(path, nullptr, false).ok());
  fs::resize_file(path, 30);
  EXPECT_FALSE(KvFile::open(path, nullptr, false).ok());
  EXPECT_FALSE(read_kv_header(path).ok());
  fs::resize_file(path, 0);
  auto empty = KvFile::open(path, nullptr, false);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find(path), std::string::npos);
  { std::ofstream(path, std::ios::binary) << "GGUF this is another format entirely, padded to be long enough"; }
  auto magic = KvFile::open(path, nullptr, false);
  ASSERT_FALSE(magic.ok());
  EXPECT_NE(magic.error().message.find("magic"), std::string::npos);
}

TEST(KvFile, AnotherIdentityIsRefusedNamingTheField) {
  TmpDir dir;
  Sample s;
  const std::string path = write_sample(dir.path, s);
  struct Case {
    KvFileIdentity id;
    const char* field;
  };
  std::vector<Case> cases;
  KvFileIdentity id = identity();
  id.model_id = "other";
  cases.push_back({id, "modelId"});
  id = identity();
  id.config_fingerprint = "other";
  cases.push_back({id, "configFingerprint"});
  id = identity();
  id.numerics = "cuda sm_90 act=bf16";
  cases.push_back({id, "numerics"});
  id = identity();
  id.ns ^= 1;
  cases.push_back({id, "ns"});
  id = identity();
  id.tokenizer_hash ^= 1;
  cases.push_back({id, "tokenizerHash"});
  for (const Case& c : cases) {
    auto f = KvFile::open(path, &c.id, false);
    ASSERT_FALSE(f.ok()) << c.field;
    EXPECT_NE(f.error().message.find(c.field), std::string::npos) << f.error().message;
  }
}

TEST(KvFile, WriterKilledMidWriteLeavesOnlyATmp) {
  TmpDir dir;
  const std::string path = (dir.path / "big.rkv").string();
  // 256 MiB of zero pages: long enough to write that the parent catches the
  // child inside write_kv_file.
  const size_t n = size_t{256} << 20;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    void* p = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) ::_exit(3);
    std::vector<int32_t> tokens(16, 1);
    KvLayerData l;
    l.tensors.push_back({"k", {static_cast<int64_t>(n / 2)}, DType::kF16, {static_cast<const uint8_t*>(p), n}});
    const KvLayerData layers[1] = {l};
    (void)write_kv_file(path, identity(), tokens, layers);
    ::_exit(0);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool caught = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(path + ".tmp")) {
      ::kill(child, SIGSTOP);  // freeze it mid-write, then kill it there
      caught = fs::exists(path + ".tmp") && !fs::exists(path);
      ::kill(child, SIGKILL);
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(caught) << "the writer finished before it could be killed";
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_FALSE(fs::exists(path)) << "a killed writer must leave no visible entry";
  EXPECT_TRUE(fs::exists(path + ".tmp"));
}

// The fuzz seed corpus (tests/fuzz/corpus/kv_file/) holds a real file of
// the current format, so mutations start from the accepted shape; if the
// format changes, rewrite it with write_kv_file (16 tokens, one full layer
// of K and V, 16 x 4 f16).
TEST(KvFile, FuzzSeedIsAValidFile) {
  const std::string dir = std::string(RILL_SOURCE_DIR) + "/tests/fuzz/corpus/kv_file/";
  auto h = read_kv_header(dir + "valid.rkv");
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(h->tokens.size(), 16u);
  ASSERT_EQ(h->layers.size(), 1u);
  EXPECT_EQ(h->layers[0].tensors.size(), 2u);
  auto f = KvFile::open(dir + "valid.rkv", nullptr, /*verify_tensors=*/true);
  EXPECT_TRUE(f.ok()) << f.error().message;
  EXPECT_FALSE(read_kv_header(dir + "flipped_header_byte.rkv").ok());
  EXPECT_FALSE(read_kv_header(dir + "header_only_truncated.rkv").ok());
}

// k4c's tensor kinds (K per channel over 32-token blocks, V rotated iq4_nl
// in blocks of 64) round trip with their group sizes, and the fuzz corpus
// holds one such file (channel_types.rkv) so mutations reach them. The seed
// was written by this test: RILL_KV_SEED_OUT=PATH copies the file it writes
// to PATH (tests/fuzz/corpus/kv_file/channel_types.rkv).
TEST(KvFile, ChannelAndIq4Nl64TensorsRoundTripAndSeedTheFuzzer) {
  TmpDir dir;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 32; ++i) tokens.push_back(200 + i);
  const auto k = bytes(32 * 64 / 32 * 19, 7), v = bytes(32 * 64 / 64 * 33, 8);
  KvLayerData layer;
  layer.tensors.push_back({"k", {32, 64}, kKvQ4Chan, k});
  layer.tensors.push_back({"v", {32, 64}, kKvIq4Nl64, v});
  const std::string path = (dir.path / "k4c.rkv").string();
  ASSERT_TRUE(write_kv_file(path, identity(), tokens, {&layer, 1}).ok());
  auto f = KvFile::open(path, nullptr, /*verify_tensors=*/true);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const auto& t = f->header().layers.at(0).tensors;
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].dtype, kKvQ4Chan);
  EXPECT_EQ(t[0].bytes, k.size());
  EXPECT_EQ(t[1].dtype, kKvIq4Nl64);
  EXPECT_EQ(t[1].bytes, v.size());
  if (const char* out = std::getenv("RILL_KV_SEED_OUT")) fs::copy_file(path, out, fs::copy_options::overwrite_existing);
  const std::string seed = std::string(RILL_SOURCE_DIR) + "/tests/fuzz/corpus/kv_file/channel_types.rkv";
  auto h = read_kv_header(seed);
  ASSERT_TRUE(h.ok()) << h.error().message;
  ASSERT_EQ(h->layers.size(), 1u);
  EXPECT_EQ(h->layers[0].tensors.at(0).dtype, kKvQ4Chan);
  EXPECT_EQ(h->layers[0].tensors.at(1).dtype, kKvIq4Nl64);
  EXPECT_TRUE(KvFile::open(seed, nullptr, /*verify_tensors=*/true).ok());
}

// q8_0h64's tensors (Q8_0_64: 66 bytes per 64 values) round trip with
// groupSize 64 and their bytes as written, and the fuzz corpus holds one
// such file (q8_0h64.rkv, written by this test with RILL_KV_SEED_OUT=PATH as
// channel_types.rkv was) so mutations reach the type.
TEST(KvFile, Q8_0x64TensorsRoundTripAndSeedTheFuzzer) {
  TmpDir dir;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 16; ++i) tokens.push_back(300 + i);
  const auto k = bytes(16 * 128 / 64 * 66, 9), v = bytes(16 * 128 / 64 * 66, 10);
  KvLayerData layer;
  layer.tensors.push_back({"k", {16, 128}, kKvQ8_0x64, k});
  layer.tensors.push_back({"v", {16, 128}, kKvQ8_0x64, v});
  const std::string path = (dir.path / "q8_0h64.rkv").string();
  ASSERT_TRUE(write_kv_file(path, identity(), tokens, {&layer, 1}).ok());
  auto f = KvFile::open(path, nullptr, /*verify_tensors=*/true);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const auto& t = f->header().layers.at(0).tensors;
  ASSERT_EQ(t.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(t[i].dtype, kKvQ8_0x64);
    EXPECT_EQ(t[i].bytes, k.size());
    EXPECT_EQ(t[i].shape, (std::vector<int64_t>{16, 128}));
  }
  const std::span<const uint8_t> kd = f->tensor(0, 0), vd = f->tensor(0, 1);
  EXPECT_TRUE(std::equal(kd.begin(), kd.end(), k.begin(), k.end()));
  EXPECT_TRUE(std::equal(vd.begin(), vd.end(), v.begin(), v.end()));
  if (const char* out = std::getenv("RILL_KV_SEED_OUT")) fs::copy_file(path, out, fs::copy_options::overwrite_existing);
  const std::string seed = std::string(RILL_SOURCE_DIR) + "/tests/fuzz/corpus/kv_file/q8_0h64.rkv";
  auto h = read_kv_header(seed);
  ASSERT_TRUE(h.ok()) << h.error().message;
  ASSERT_EQ(h->layers.size(), 1u);
  EXPECT_EQ(h->layers[0].tensors.at(0).dtype, kKvQ8_0x64);
  EXPECT_EQ(h->layers[0].tensors.at(1).dtype, kKvQ8_0x64);
  EXPECT_TRUE(KvFile::open(seed, nullptr, /*verify_tensors=*/true).ok());
}

// A q8_0h64 header that lies about its tensors is refused naming what it
// lies about, its hash recomputed so the field checks (not the hash) decide:
// q8_0's group of 32, and q8_0's 34 bytes per 32 values (2,176 for 16 x 128).
TEST(KvFile, Q8_0x64TensorsWithAnotherGroupOrSizeAreRefused) {
  const std::string seed = std::string(RILL_SOURCE_DIR) + "/tests/fuzz/corpus/kv_file/q8_0h64.rkv";
  std::ifstream in(seed, std::ios::binary);
  const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(file.size(), 24u);
  uint32_t hlen = 0;
  std::memcpy(&hlen, file.data() + 8, 4);
  ASSERT_TRUE(parse_kv_header(file, file.size(), "seed").ok());
  for (const auto& [from, to, why] : {std::tuple{"\"groupSize\":64", "\"groupSize\":32", "groupSize"},
                                      std::tuple{"\"bytes\":2112", "\"bytes\":2176", "bytes do not match"}}) {
    std::vector<uint8_t> bad = file;
    std::string header(reinterpret_cast<const char*>(bad.data() + 24), hlen);
    const size_t at = header.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    header.replace(at, std::strlen(from), to);
    ASSERT_EQ(header.size(), hlen);
    std::memcpy(bad.data() + 24, header.data(), hlen);
    const uint64_t hh = hash64(header);
    std::memcpy(bad.data() + 16, &hh, 8);
    auto h = parse_kv_header(bad, bad.size(), "lying.rkv");
    ASSERT_FALSE(h.ok()) << to;
    EXPECT_NE(h.error().message.find(why), std::string::npos) << h.error().message;
    EXPECT_NE(h.error().message.find("lying.rkv"), std::string::npos) << h.error().message;
  }
}

// A file written before "numerics" existed (the fuzz seed is one) reads as
// numerics "", so no model's identity matches it: it is refused, never
// resumed by a device whose numbers may differ from the one that wrote it.
TEST(KvFile, AFileWithoutNumericsIsRefusedNamingNumerics) {
  const std::string path = std::string(RILL_SOURCE_DIR) + "/tests/fuzz/corpus/kv_file/valid.rkv";
  auto h = read_kv_header(path);
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(h->identity.numerics, "");
  KvFileIdentity want = h->identity;
  want.numerics = "cpu avx512";
  auto f = KvFile::open(path, &want, false);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("numerics"), std::string::npos) << f.error().message;
}

}  // namespace
}  // namespace rill
