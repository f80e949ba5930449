// artifact_fingerprint keys the disk tier's KV files, so it must change
// when any weight byte changes (not only a tensor's first and last bytes),
// and its sidecar must serve a restart on unchanged files without a rehash
// and rehash a file that was rewritten.
#include "model/fingerprint.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "loader/gguf.h"

namespace rill {
namespace {
namespace fs = std::filesystem;

const std::string kSmol = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

struct TmpDir {
  fs::path path;
  TmpDir() {
    path = fs::temp_directory_path() /
           ("rill_fingerprint_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

// A hand-built artifact over `bytes`: two tensors, the second of 4096 bytes.
ModelFiles table(const std::vector<uint8_t>& bytes, const std::string& file) {
  ModelFiles f;
  f.path = file;
  TensorRef a{"a.weight", file, DType::kF32, {4}, bytes.data(), 16};
  TensorRef b{"b.weight", file, DType::kF32, {1024}, bytes.data() + 16, 4096};
  f.tensors.emplace(a.name, a);
  f.tensors.emplace(b.name, b);
  return f;
}

TEST(Fingerprint, ChangesWhenOneByteInsideATensorChanges) {
  std::vector<uint8_t> bytes(16 + 4096, 7);
  const std::string before = artifact_fingerprint(table(bytes, "x.gguf"));
  EXPECT_EQ(before, artifact_fingerprint(table(bytes, "x.gguf"), 1)) << "the same on any number of threads";
  bytes[16 + 2048] ^= 1;  // the middle of b: far from its first and last 64 bytes
  EXPECT_NE(before, artifact_fingerprint(table(bytes, "x.gguf")));
}

// The case as it happened: two model files, one byte apart in the middle of
// a tensor, must not share cache entries.
TEST(Fingerprint, TwoModelFilesOneByteApartInATensorDiffer) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  TmpDir dir;
  const fs::path copy = dir.path / "copy.gguf";
  fs::copy_file(kSmol, copy);
  uint64_t off = 0;
  {
    auto files = open_model_files(kSmol);
    ASSERT_TRUE(files.ok()) << files.error().message;
    const TensorRef* biggest = nullptr;
    for (const auto& [name, t] : (*files)->tensors) {
      if (!biggest || t.n_bytes > biggest->n_bytes) biggest = &t;
    }
    ASSERT_NE(biggest, nullptr);
    ASSERT_GT(biggest->n_bytes, 1024u);
    off = static_cast<uint64_t>(biggest->data - (*files)->gguf->mapping().data()) + biggest->n_bytes / 2;
  }
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(off));
    const int c = f.get();
    f.seekp(static_cast<std::streamoff>(off));
    f.put(static_cast<char>(c ^ 0x10));
  }
  auto a = open_model_files(kSmol);
  auto b = open_model_files(copy.string());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(artifact_fingerprint(**a), artifact_fingerprint(**b));
}

TEST(Fingerprint, SidecarServesUnchangedFilesAndRehashesARewrittenOne) {
  TmpDir dir;
  const std::string file = (dir.path / "w.bin").string();
  const std::string sidecar = (dir.path / "fingerprints.json").string();
  std::vector<uint8_t> bytes(16 + 4096, 3);
  auto write = [&] {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  };
  write();
  bool rehashed = false;
  const std::string first = artifact_fingerprint_cached(table(bytes, file), sidecar, &rehashed);
  EXPECT_TRUE(rehashed);
  EXPECT_EQ(first, artifact_fingerprint(table(bytes, file)));
  EXPECT_EQ(artifact_fingerprint_cached(table(bytes, file), sidecar, &rehashed), first);
  EXPECT_FALSE(rehashed) << "a restart on the same file reads the sidecar";
  // Rewritten in place, same size. (Timestamps tick coarsely: set the
  // mtime apart, as any rewrite later than the clock's tick would be.)
  const auto mtime = fs::last_write_time(file);
  bytes[16 + 1000] ^= 1;
  write();
  fs::last_write_time(file, mtime + std::chrono::seconds(2));
  const std::string second = artifact_fingerprint_cached(table(bytes, file), sidecar, &rehashed);
  EXPECT_TRUE(rehashed);
  EXPECT_NE(second, first);
  // A corrupt sidecar is a rehash, not an error.
  { std::ofstream(sidecar, std::ios::trunc) << "{not json"; }
  EXPECT_EQ(artifact_fingerprint_cached(table(bytes, file), sidecar, &rehashed), second);
  EXPECT_TRUE(rehashed);
}

}  // namespace
}  // namespace rill
