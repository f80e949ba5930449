// DiskWriter: queued runs are written off the caller's thread, held
// (covers) until collected, indexed in the disk tier by collect()/flush(),
// finished by the destructor (a reopened tier finds them), and a failed
// write comes back as an error naming the file; try_push never waits and
// drops beyond its limit; close() drains with a deadline, then refuses.
#include "kv/disk_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>

#include "kv/prefix_tree.h"

namespace rill {
namespace {
namespace fs = std::filesystem;

constexpr int32_t kBs = 4;
constexpr uint64_t kNs = 5;

struct TmpDir {
  fs::path path;
  TmpDir() {
    path = fs::temp_directory_path() /
           ("rill_diskwriter_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
  }
  ~TmpDir() { fs::remove_all(path); }
};

DiskTierOptions options(const fs::path& dir) {
  DiskTierOptions o;
  o.dir = dir.string();
  o.cap_bytes = size_t{1} << 30;
  o.identity = {"model", "config", 0, 42, "cpu"};
  o.block_size = kBs;
  return o;
}

// One full layer of 2-byte rows over `n_blocks` blocks of tokens from `start`.
KvRunPtr make_run(int n_blocks, int start) {
  auto r = std::make_shared<KvRun>();
  r->ns = kNs;
  r->block_size = kBs;
  for (int i = 0; i < n_blocks * kBs; ++i) r->tokens.push_back(start + i);
  r->keys = PrefixTree::chain_keys(kNs, r->tokens, kBs);
  const size_t tensor = r->tokens.size() * 2;
  r->storage.assign(2 * tensor, static_cast<uint8_t>(start));
  r->kinds = {LayerKind::kFull};
  r->windows = {0};
  r->first_block = {0};
  r->dtypes = {DType::kF16};
  r->row_bytes = {2};
  r->k = {std::span<const uint8_t>(r->storage.data(), tensor)};
  r->v = {std::span<const uint8_t>(r->storage.data() + tensor, tensor)};
  return r;
}

TEST(DiskWriter, WritesOffThreadAndIndexesOnCollect) {
  TmpDir dir;
  const KvRunPtr a = make_run(3, 10), b = make_run(2, 500);
  {
    auto tier = DiskTier::open(options(dir.path));
    ASSERT_TRUE(tier.ok()) << tier.error().message;
    DiskWriter w(**tier, size_t{1} << 20);
    w.push(a);
    w.push(b);
    EXPECT_TRUE(w.covers(a->keys[1])) << "a queued run counts as held";
    EXPECT_TRUE(w.covers(b->keys.back()));
    EXPECT_TRUE(w.flush().empty());
    EXPECT_FALSE(w.covers(a->keys[1]));
    EXPECT_EQ(w.pending_bytes(), 0u);
    EXPECT_EQ((*tier)->stats().entries, 2);
    auto hit = (*tier)->find(a->keys, kNs);
    ASSERT_TRUE(hit.has_value());
    EXPECT_EQ(hit->second, 3);
    EXPECT_TRUE(std::equal(hit->first->k[0].begin(), hit->first->k[0].end(), a->k[0].begin()));
    w.push(make_run(4, 900));  // still queued when the writer goes: written anyway
  }
  auto reopened = DiskTier::open(options(dir.path));
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->stats().entries, 3);
}

TEST(DiskWriter, AFailedWriteIsAnErrorNamingTheFile) {
  TmpDir dir;
  auto tier = DiskTier::open(options(dir.path));
  ASSERT_TRUE(tier.ok());
  DiskWriter w(**tier, 0);   // every push waits for the previous write
  fs::remove_all(dir.path);  // the directory is gone: the write fails
  w.push(make_run(2, 1));
  const auto errors = w.flush();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find(".rkv"), std::string::npos) << errors[0].message;
  EXPECT_EQ((*tier)->stats().entries, 0);
}

// Write-behind's push: never waits, queues only within its limit (one run
// always fits an empty queue; pending bytes last until collect). close()
// waits for the queue and then drops whatever is pushed later.
TEST(DiskWriter, TryPushNeverWaitsAndCloseDrainsThenRefuses) {
  TmpDir dir;
  const KvRunPtr a = make_run(3, 10), b = make_run(2, 500), c = make_run(2, 900);
  {
    auto tier = DiskTier::open(options(dir.path));
    ASSERT_TRUE(tier.ok());
    DiskWriter w(**tier, size_t{1} << 20);
    EXPECT_TRUE(w.has_room(a->bytes(), 1));
    EXPECT_TRUE(w.try_push(a, 1)) << "an empty queue takes one run of any size";
    EXPECT_FALSE(w.has_room(b->bytes(), 1));
    EXPECT_FALSE(w.try_push(b, 1)) << "a is pending until collected";
    EXPECT_FALSE(w.covers(b->keys.back()));
    EXPECT_TRUE(w.try_push(b, size_t{1} << 20));
    EXPECT_TRUE(w.covers(b->keys.back()));
    EXPECT_EQ(w.close(std::chrono::steady_clock::now() + std::chrono::seconds(60)), 0);
    EXPECT_EQ(w.queue_depth(), 0);
    EXPECT_EQ(w.n_written(), 2) << "both on disk before close returned";
    EXPECT_FALSE(w.try_push(c, size_t{1} << 20)) << "closed";
    w.push(c);  // a spill after close: dropped, not written
    EXPECT_EQ(w.n_dropped(), 1);
    EXPECT_TRUE(w.collect().empty());
    EXPECT_FALSE(w.covers(c->keys.back()));
    EXPECT_EQ((*tier)->stats().entries, 2);
  }
  auto reopened = DiskTier::open(options(dir.path));
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->stats().entries, 2);
}

// A deadline already past: what is still queued is dropped (the write in
// progress finishes), so what reaches disk is exactly what was not dropped.
TEST(DiskWriter, CloseAtADeadlineDropsWhatIsStillQueued) {
  TmpDir dir;
  int64_t dropped = 0;
  {
    auto tier = DiskTier::open(options(dir.path));
    ASSERT_TRUE(tier.ok());
    DiskWriter w(**tier, size_t{1} << 20);
    for (int i = 0; i < 6; ++i) w.push(make_run(8, 1000 * (i + 1)));
    dropped = w.close(std::chrono::steady_clock::now());
    EXPECT_EQ(w.n_dropped(), dropped);
    EXPECT_EQ(w.queue_depth() <= 1, true) << "at most the write in progress";
  }
  auto reopened = DiskTier::open(options(dir.path));
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->stats().entries, 6 - dropped);
}

}  // namespace
}  // namespace rill
