// kv/kv_dir: the directory lock excludes a second owner (and DiskTier's
// open), listing reads headers without the lock (a running server's
// directory can be listed, corrupt files are shown as such), clearing
// removes `.rkv` and `.tmp` files only and is refused while the lock is held.
#include "kv/kv_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "kv/disk_tier.h"
#include "kv/kv_file.h"

namespace rill {
namespace {
namespace fs = std::filesystem;

struct TmpDir {
  fs::path path;
  TmpDir() {
    path = fs::temp_directory_path() /
           ("rill_kvdir_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

// One 32-token run: a layer of K and V, 32 x 8 f16.
void write_run(const fs::path& path) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 32; ++i) tokens.push_back(7 + i);
  std::vector<uint8_t> k(32 * 8 * 2, 0x11), v(32 * 8 * 2, 0x22);
  KvLayerData layer;
  layer.tensors.push_back({"k", {32, 8}, DType::kF16, k});
  layer.tensors.push_back({"v", {32, 8}, DType::kF16, v});
  Status st = write_kv_file(path.string(), KvFileIdentity{"m", "c", 1, 2, "cpu"}, tokens, std::span(&layer, 1));
  ASSERT_TRUE(st.ok()) << st.error().message;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(KvDir, LockExcludesASecondOwner) {
  TmpDir dir;
  EXPECT_FALSE(kv_dir_locked(dir.path.string()));
  {
    auto lock = KvDirLock::acquire(dir.path.string());
    ASSERT_TRUE(lock.ok()) << lock.error().message;
    EXPECT_TRUE(kv_dir_locked(dir.path.string()));
    auto second = KvDirLock::acquire(dir.path.string());
    ASSERT_FALSE(second.ok());
    EXPECT_NE(second.error().message.find("in use by another rill process"), std::string::npos);
    EXPECT_NE(second.error().message.find(dir.path.string()), std::string::npos);
    DiskTierOptions o;
    o.dir = dir.path.string();
    o.cap_bytes = 1 << 20;
    EXPECT_FALSE(DiskTier::open(o).ok()) << "the disk tier takes the same lock";
  }
  EXPECT_FALSE(kv_dir_locked(dir.path.string()));
  EXPECT_TRUE(KvDirLock::acquire(dir.path.string()).ok());
}

TEST(KvDir, ListReadsHeadersWithoutTheLock) {
  TmpDir dir;
  write_run(dir.path / "00000000000000aa.rkv");
  write_text(dir.path / "00000000000000bb.rkv", "not a kv file");
  write_text(dir.path / "notes.txt", "kept");
  auto lock = KvDirLock::acquire(dir.path.string());
  ASSERT_TRUE(lock.ok());
  auto entries = list_kv_dir(dir.path.string());
  ASSERT_TRUE(entries.ok()) << entries.error().message;
  ASSERT_EQ(entries->size(), 2u);
  const KvDirEntry& good = (*entries)[0];
  EXPECT_EQ(good.file, "00000000000000aa.rkv");
  EXPECT_EQ(good.tokens, 32);
  EXPECT_EQ(good.bytes, fs::file_size(dir.path / good.file));
  EXPECT_GT(good.created_at, 1700000000);
  EXPECT_TRUE(good.error.empty()) << good.error;
  const KvDirEntry& bad = (*entries)[1];
  EXPECT_EQ(bad.file, "00000000000000bb.rkv");
  EXPECT_FALSE(bad.error.empty());
  EXPECT_FALSE(list_kv_dir((dir.path / "missing").string()).ok());
}

TEST(KvDir, ClearRemovesEntriesAndOrphansOnlyWithoutAnOwner) {
  TmpDir dir;
  write_run(dir.path / "00000000000000aa.rkv");
  write_text(dir.path / "00000000000000cc.rkv.tmp", "half written");
  write_text(dir.path / "notes.txt", "kept");
  {
    auto lock = KvDirLock::acquire(dir.path.string());
    ASSERT_TRUE(lock.ok());
    auto refused = clear_kv_dir(dir.path.string());
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("in use"), std::string::npos) << refused.error().message;
    EXPECT_TRUE(fs::exists(dir.path / "00000000000000aa.rkv"));
  }
  auto n = clear_kv_dir(dir.path.string());
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(*n, 2);
  EXPECT_FALSE(fs::exists(dir.path / "00000000000000aa.rkv"));
  EXPECT_FALSE(fs::exists(dir.path / "00000000000000cc.rkv.tmp"));
  EXPECT_TRUE(fs::exists(dir.path / "notes.txt"));
  EXPECT_TRUE(list_kv_dir(dir.path.string())->empty());
}

}  // namespace
}  // namespace rill
