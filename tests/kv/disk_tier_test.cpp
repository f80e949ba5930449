// DiskTier: runs written as KV files are found by their chain keys (longest
// prefix), survive reopening, are evicted LRU beyond the cap; opening reaps
// `.tmp` orphans and removes corrupt, foreign and misnamed files; a file
// that fails when loaded (tensor hash, always checked) is removed and the
// lookup is a miss; --kv-verify removes such files at open; a run holding
// another's whole chain replaces it; the directory is locked against a second owner.
#include "kv/disk_tier.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "kv/prefix_tree.h"

namespace rill {
namespace {
namespace fs = std::filesystem;

constexpr int32_t kBs = 4;
constexpr uint64_t kNs = 77;

struct TmpDir {
  fs::path path;
  TmpDir() {
    path = fs::temp_directory_path() /
           ("rill_disktier_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
  }
  ~TmpDir() { fs::remove_all(path); }
};

DiskTierOptions options(const fs::path& dir, size_t cap = size_t{1} << 30) {
  DiskTierOptions o;
  o.dir = dir.string();
  o.cap_bytes = cap;
  o.identity = {"model", "config", 0, 42, "cpu"};
  o.block_size = kBs;
  return o;
}

// A run of n_blocks blocks, one layer of 2-byte rows, KV bytes from seed.
KvRunPtr make_run(std::vector<int32_t> tokens, uint8_t seed) {
  auto r = std::make_shared<KvRun>();
  r->ns = kNs;
  r->block_size = kBs;
  r->tokens = std::move(tokens);
  r->keys = PrefixTree::chain_keys(kNs, r->tokens, kBs);
  const size_t tensor = r->tokens.size() * 2;
  r->storage.resize(2 * tensor);
  for (size_t i = 0; i < r->storage.size(); ++i) r->storage[i] = static_cast<uint8_t>(seed + i);
  r->kinds = {LayerKind::kFull};
  r->windows = {0};
  r->first_block = {0};
  r->dtypes = {DType::kF16};
  r->row_bytes = {2};
  r->k = {std::span<const uint8_t>(r->storage.data(), tensor)};
  r->v = {std::span<const uint8_t>(r->storage.data() + tensor, tensor)};
  return r;
}

std::vector<int32_t> seq(int n, int start = 0) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(start + i);
  return t;
}

TEST(DiskTier, FindsTheLongestPrefixAndSurvivesReopening) {
  TmpDir dir;
  const KvRunPtr run = make_run(seq(12), 1);  // 3 blocks
  {
    auto tier = DiskTier::open(options(dir.path));
    ASSERT_TRUE(tier.ok()) << tier.error().message;
    ASSERT_TRUE((*tier)->put(*run).ok());
    EXPECT_TRUE((*tier)->covers(run->keys[1]));
  }
  auto tier = DiskTier::open(options(dir.path));
  ASSERT_TRUE(tier.ok()) << tier.error().message;
  EXPECT_EQ((*tier)->stats().entries, 1);
  // A prompt sharing the first two blocks, then diverging.
  std::vector<int32_t> prompt = seq(8);
  for (int i = 0; i < 8; ++i) prompt.push_back(500 + i);
  const auto keys = PrefixTree::chain_keys(kNs, prompt, kBs);
  auto hit = (*tier)->find(keys, kNs);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->second, 2);
  const KvRun& got = *hit->first;
  EXPECT_EQ(got.tokens, run->tokens);
  ASSERT_EQ(got.k.size(), 1u);
  EXPECT_TRUE(std::equal(got.k[0].begin(), got.k[0].end(), run->k[0].begin()));
  EXPECT_TRUE(std::equal(got.v[0].begin(), got.v[0].end(), run->v[0].begin()));
  EXPECT_EQ((*tier)->stats().hits, 1);
  EXPECT_FALSE((*tier)->find(PrefixTree::chain_keys(kNs + 1, prompt, kBs), kNs + 1).has_value());
  EXPECT_EQ((*tier)->stats().misses, 1);
}

// A run whose sliding layer kept only its window (window 4: resuming at 3
// blocks of 4 reads positions 9..12, so block 2 only) resumes only at its
// end, before and after reopening; its other keys still count as held.
TEST(DiskTier, AWindowOnlyRunResumesOnlyAtItsEnd) {
  TmpDir dir;
  auto r = std::const_pointer_cast<KvRun>(make_run(seq(12), 3));
  const size_t block = kBs * 2;  // one block's rows of the run's 2-byte layer
  r->kinds = {LayerKind::kSliding};
  r->windows = {4};
  r->first_block = {2};
  r->k = {std::span<const uint8_t>(r->storage.data() + 2 * block, block)};  // K's block 2
  r->v = {std::span<const uint8_t>(r->storage.data() + 5 * block, block)};  // V's block 2
  ASSERT_EQ(r->min_resume_blocks(), 3);
  std::vector<int32_t> shares_two = seq(8);
  for (int i = 0; i < 8; ++i) shares_two.push_back(700 + i);
  for (int reopen = 0; reopen < 2; ++reopen) {
    auto tier = DiskTier::open(options(dir.path));
    ASSERT_TRUE(tier.ok()) << tier.error().message;
    if (reopen == 0) {
      ASSERT_TRUE((*tier)->put(*r).ok());
    }
    EXPECT_TRUE((*tier)->covers(r->keys[1]));
    EXPECT_FALSE((*tier)->find(PrefixTree::chain_keys(kNs, shares_two, kBs), kNs).has_value());
    auto hit = (*tier)->find(r->keys, kNs);
    ASSERT_TRUE(hit.has_value());
    EXPECT_EQ(hit->second, 3);
    const KvRun& got = *hit->first;
    EXPECT_EQ(got.first_block, (std::vector<int32_t>{2}));
    EXPECT_EQ(got.windows, (std::vector<int32_t>{4}));
    ASSERT_EQ(got.k[0].size(), block);
    EXPECT_TRUE(std::equal(got.k[0].begin(), got.k[0].end(), r->k[0].begin()));
  }
}

TEST(DiskTier, OpenRemovesOrphansCorruptForeignAndMisnamedFiles) {
  TmpDir dir;
  const KvRunPtr good = make_run(seq(8), 1), corrupt = make_run(seq(8, 100), 2), foreign = make_run(seq(8, 200), 3);
  {
    auto tier = DiskTier::open(options(dir.path));
    ASSERT_TRUE(tier.ok());
    ASSERT_TRUE((*tier)->put(*good).ok());
    ASSERT_TRUE((*tier)->put(*corrupt).ok());
    DiskTierOptions other = options(dir.path);
    other.identity.model_id = "another-model";
  }
  {  // a file of another model, written by a tier with that identity
    DiskTierOptions o = options(dir.path / "sub");
    o.identity.model_id = "another-model";
    auto other = DiskTier::open(o);
    ASSERT_TRUE(other.ok());
    ASSERT_TRUE((*other)->put(*foreign).ok());
  }
  const fs::path foreign_file = dir.path / kv_run_file_name(foreign->keys.back());
  fs::rename(dir.path / "sub" / kv_run_file_name(foreign->keys.back()), foreign_file);
  const fs::path corrupt_file = dir.path / kv_run_file_name(corrupt->keys.back());
  {  // flip a header byte
    std::fstream f(corrupt_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('#');
  }
  { std::ofstream(dir.path / "deadbeef.rkv.tmp") << "half written"; }
  fs::copy_file(dir.path / kv_run_file_name(good->keys.back()), dir.path / "0000000000000001.rkv");  // misnamed
  auto tier = DiskTier::open(options(dir.path));
  ASSERT_TRUE(tier.ok()) << tier.error().message;
  EXPECT_EQ((*tier)->removed_at_open(), 4);
  EXPECT_EQ((*tier)->stats().entries, 1);
  EXPECT_TRUE(fs::exists(dir.path / kv_run_file_name(good->keys.back())));
  EXPECT_FALSE(fs::exists(corrupt_file));
  EXPECT_FALSE(fs::exists(foreign_file));
  EXPECT_FALSE(fs::exists(dir.path / "deadbeef.rkv.tmp"));
  EXPECT_FALSE(fs::exists(dir.path / "0000000000000001.rkv"));
}

// Every load checks the tensor hashes (no option): corrupt KV data is a
// miss, named in the error, counted, and the file is gone.
// KV computed by another device (or instruction set) is not this model's:
// a tier of other numerics removes the file at open, as a foreign model's.
TEST(DiskTier, OpenRemovesFilesOfOtherNumerics) {
  TmpDir dir;
  const KvRunPtr run = make_run(seq(8), 1);
  {
    DiskTierOptions o = options(dir.path);
    o.identity.numerics = "cpu avx512";
    auto tier = DiskTier::open(o);
    ASSERT_TRUE(tier.ok());
    ASSERT_TRUE((*tier)->put(*run).ok());
  }
  DiskTierOptions o = options(dir.path);
  o.identity.numerics = "cpu avx512";
  {  // the same numerics: kept
    auto tier = DiskTier::open(o);
    ASSERT_TRUE(tier.ok());
    EXPECT_EQ((*tier)->stats().entries, 1);
    EXPECT_TRUE((*tier)->find(run->keys, kNs).has_value());
  }
  o.identity.numerics = "cuda sm_90 act=bf16";
  auto tier = DiskTier::open(o);
  ASSERT_TRUE(tier.ok());
  EXPECT_EQ((*tier)->removed_at_open(), 1);
  EXPECT_EQ((*tier)->stats().entries, 0);
  EXPECT_FALSE((*tier)->find(run->keys, kNs).has_value());
  EXPECT_FALSE(fs::exists(dir.path / kv_run_file_name(run->keys.back())));
}

TEST(DiskTier, CorruptTensorIsAMissAndIsRemovedWithoutAnyOption) {
  TmpDir dir;
  const KvRunPtr run = make_run(seq(8), 9);
  DiskTierOptions o = options(dir.path);
  auto tier = DiskTier::open(o);
  ASSERT_TRUE(tier.ok());
  ASSERT_TRUE((*tier)->put(*run).ok());
  const fs::path file = dir.path / kv_run_file_name(run->keys.back());
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(kKvFileAlignment + 3));  // inside the first tensor
    f.put('\x7f');
  }
  EXPECT_FALSE((*tier)->find(run->keys, kNs).has_value());
  EXPECT_EQ((*tier)->stats().errors, 1);
  EXPECT_NE((*tier)->last_error().find(file.filename().string()), std::string::npos) << (*tier)->last_error();
  EXPECT_NE((*tier)->last_error().find("hash"), std::string::npos) << (*tier)->last_error();
  EXPECT_FALSE(fs::exists(file));
  EXPECT_EQ((*tier)->stats().entries, 0);
  EXPECT_FALSE((*tier)->find(run->keys, kNs).has_value()) << "a plain miss now";
  EXPECT_EQ((*tier)->stats().errors, 1) << "logged and counted once";
}

// --kv-verify: open reads every file and removes one whose tensor fails;
// without it open reads headers only (the load catches it, above).
TEST(DiskTier, VerifyAtOpenRemovesAFileWithACorruptTensor) {
  TmpDir dir;
  const KvRunPtr run = make_run(seq(8), 9);
  const fs::path file = dir.path / kv_run_file_name(run->keys.back());
  {
    auto tier = DiskTier::open(options(dir.path));
    ASSERT_TRUE(tier.ok());
    ASSERT_TRUE((*tier)->put(*run).ok());
  }
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(kKvFileAlignment + 1));
    f.put('\x01');
  }
  {
    auto lazy = DiskTier::open(options(dir.path));
    ASSERT_TRUE(lazy.ok());
    EXPECT_EQ((*lazy)->stats().entries, 1) << "headers only";
  }
  DiskTierOptions o = options(dir.path);
  o.verify_at_open = true;
  auto eager = DiskTier::open(o);
  ASSERT_TRUE(eager.ok());
  EXPECT_EQ((*eager)->stats().entries, 0);
  EXPECT_EQ((*eager)->removed_at_open(), 1);
  EXPECT_FALSE(fs::exists(file));
}

// A newer run holding an older run's whole chain replaces its file (a
// conversation written behind turn after turn keeps one file); a run that
// only shares part of a chain does not.
TEST(DiskTier, ARunHoldingAnotherRunsWholeChainReplacesIt) {
  TmpDir dir;
  auto tier = DiskTier::open(options(dir.path));
  ASSERT_TRUE(tier.ok());
  const KvRunPtr short_run = make_run(seq(8), 1);
  std::vector<int32_t> other = seq(8);
  other[6] = 999;  // shares the first block only
  const KvRunPtr sibling = make_run(other, 2);
  const KvRunPtr long_run = make_run(seq(16), 3);
  ASSERT_TRUE((*tier)->put(*short_run).ok());
  ASSERT_TRUE((*tier)->put(*sibling).ok());
  ASSERT_TRUE((*tier)->put(*long_run).ok());
  EXPECT_FALSE(fs::exists(dir.path / kv_run_file_name(short_run->keys.back())));
  EXPECT_TRUE(fs::exists(dir.path / kv_run_file_name(sibling->keys.back())));
  EXPECT_EQ((*tier)->stats().entries, 2);
  EXPECT_EQ((*tier)->stats().replaced, 1);
  auto hit = (*tier)->find(short_run->keys, kNs);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->second, 2);
  EXPECT_EQ(hit->first->tokens.size(), 16u) << "served by the longer run";
}

TEST(DiskTier, EvictsLeastRecentlyUsedBeyondTheCap) {
  TmpDir dir;
  const KvRunPtr a = make_run(seq(8), 1), b = make_run(seq(8, 50), 2), c = make_run(seq(8, 90), 3);
  auto probe = DiskTier::open(options(dir.path / "probe"));
  ASSERT_TRUE(probe.ok());
  ASSERT_TRUE((*probe)->put(*a).ok());
  const auto one_file = static_cast<size_t>((*probe)->stats().bytes);
  auto tier = DiskTier::open(options(dir.path / "capped", 2 * one_file + 10));
  ASSERT_TRUE(tier.ok());
  ASSERT_TRUE((*tier)->put(*a).ok());
  ASSERT_TRUE((*tier)->put(*b).ok());
  ASSERT_TRUE((*tier)->find(a->keys, kNs).has_value());  // a is now the most recent
  ASSERT_TRUE((*tier)->put(*c).ok());                    // evicts b
  EXPECT_EQ((*tier)->stats().entries, 2);
  EXPECT_EQ((*tier)->stats().evictions, 1);
  EXPECT_TRUE((*tier)->covers(a->keys.back()));
  EXPECT_FALSE((*tier)->covers(b->keys.back()));
  EXPECT_TRUE((*tier)->covers(c->keys.back()));
}

TEST(DiskTier, TheDirectoryHasOneOwner) {
  TmpDir dir;
  auto first = DiskTier::open(options(dir.path));
  ASSERT_TRUE(first.ok());
  auto second = DiskTier::open(options(dir.path));
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().message.find("in use"), std::string::npos) << second.error().message;
  EXPECT_NE(second.error().message.find(dir.path.string()), std::string::npos);
  first->reset();
  EXPECT_TRUE(DiskTier::open(options(dir.path)).ok());
}

}  // namespace
}  // namespace rill
