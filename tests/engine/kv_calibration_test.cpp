// add_kv_calibration (engine/kv_calibration.h): what q4a's calibration
// pass is given to read, and the files it refuses.
#include "engine/kv_calibration.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../text/tokenizer_test_util.h"
#include "core/e4m3.h"

namespace rill {
namespace {

namespace fs = std::filesystem;

struct TmpDir {
  fs::path path;
  TmpDir() {
    path = fs::temp_directory_path() /
           ("rill_kv_cal_" + std::to_string(::getpid()) + "_" + std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::create_directories(path);
  }
  ~TmpDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

KvTypeOptions k4a_from(const std::string& path) {
  KvTypeOptions kv;
  kv.k = parse_kv_type("q4a");
  kv.calibration_path = path;
  return kv;
}

const Tokenizer* tokenizer() {
  return testing::load_tokenizer("llama3");
}

TEST(KvCalibration, BuiltInTextHasEnoughTokens) {
  const Tokenizer* tok = tokenizer();
  if (!tok) GTEST_SKIP() << "llama3 tokenizer missing";
  KvTypeOptions kv = k4a_from("");
  ASSERT_TRUE(add_kv_calibration(tok, kv).ok());
  EXPECT_GE(kv.calibration_tokens.size(), 256u);
}

TEST(KvCalibration, WithoutQ4aNothingIsRead) {
  KvTypeOptions kv;
  kv.calibration_path = "/nonexistent/file.txt";
  EXPECT_TRUE(add_kv_calibration(nullptr, kv).ok());
  EXPECT_TRUE(kv.calibration_tokens.empty());
}

// A directory, a FIFO (which could block a reader forever) and a missing
// file are errors naming the path; none hangs.
TEST(KvCalibration, RefusesWhatIsNotARegularFile) {
  const Tokenizer* tok = tokenizer();
  if (!tok) GTEST_SKIP() << "llama3 tokenizer missing";
  TmpDir dir;
  const fs::path fifo = dir.path / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const fs::path& p : {dir.path, fifo, dir.path / "missing.txt"}) {
    KvTypeOptions kv = k4a_from(p.string());
    const Status st = add_kv_calibration(tok, kv);
    ASSERT_FALSE(st.ok()) << p;
    EXPECT_NE(st.error().message.find(p.string()), std::string::npos) << st.error().message;
  }
}

// A large file is read up to kMaxKvCalibrationBytes only: its tokens are
// those of that prefix, however long the file.
TEST(KvCalibration, ReadsABoundedPrefixOfALargeFile) {
  const Tokenizer* tok = tokenizer();
  if (!tok) GTEST_SKIP() << "llama3 tokenizer missing";
  TmpDir dir;
  const std::string line = "Each line of this calibration file says the same thing again.\n";
  std::string prefix;
  while (prefix.size() < kMaxKvCalibrationBytes) prefix += line;
  prefix.resize(kMaxKvCalibrationBytes);
  const fs::path big = dir.path / "big.txt", head = dir.path / "head.txt";
  {
    std::ofstream out(big, std::ios::binary);
    for (int i = 0; i < 20; ++i) out << prefix;  // 1.25 MiB
    std::ofstream h(head, std::ios::binary);
    h << prefix;
  }
  KvTypeOptions kv_big = k4a_from(big.string()), kv_head = k4a_from(head.string());
  ASSERT_TRUE(add_kv_calibration(tok, kv_big).ok());
  ASSERT_TRUE(add_kv_calibration(tok, kv_head).ok());
  EXPECT_EQ(kv_big.calibration_tokens, kv_head.calibration_tokens);
}

TEST(KvCalibration, ShortFileIsAnErrorNamingIt) {
  const Tokenizer* tok = tokenizer();
  if (!tok) GTEST_SKIP() << "llama3 tokenizer missing";
  TmpDir dir;
  const fs::path p = dir.path / "short.txt";
  std::ofstream(p) << "Too short.";
  KvTypeOptions kv = k4a_from(p.string());
  const Status st = add_kv_calibration(tok, kv);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("short.txt"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace rill
