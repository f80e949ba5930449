// MappedFile: the bytes of the file, lazily or populated; a populated
// mapping is faulted in at open, so reading it whole takes (almost) no page
// faults afterwards.
#include "core/mapped_file.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace rill {
namespace {

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

std::string write_file(size_t n_bytes) {
  std::string path = ::testing::TempDir() + "/mapped_file_test_" + std::to_string(::getpid()) + ".bin";
  std::vector<unsigned char> bytes(n_bytes);
  for (size_t i = 0; i < n_bytes; ++i) bytes[i] = static_cast<unsigned char>(i * 7 + i / 4096);
  FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  EXPECT_EQ(std::fwrite(bytes.data(), 1, n_bytes, f), n_bytes);
  std::fclose(f);
  return path;
}

TEST(MappedFile, LazyAndPopulatedMapTheSameBytes) {
  const size_t n = size_t{4} << 20;  // 1024 pages of 4 KiB
  const std::string path = write_file(n);
  for (bool populate : {false, true}) {
    auto m = MappedFile::open(path, populate);
    ASSERT_TRUE(m.ok()) << m.error().message;
    ASSERT_EQ(m->size(), n);
    const long before = minor_faults();
    unsigned sum = 0;
    for (size_t i = 0; i < n; i += 4096) sum += m->data()[i] + m->data()[i + 4095];
    const long faults = minor_faults() - before;
    unsigned want = 0;
    for (size_t i = 0; i < n; i += 4096)
      want += static_cast<unsigned char>(i * 7 + i / 4096) + static_cast<unsigned char>((i + 4095) * 7 + i / 4096);
    EXPECT_EQ(sum, want) << "populate=" << populate;
    // Populated: every page is mapped already (a few faults of the test itself at most).
    if (populate) {
      EXPECT_LT(faults, 16) << "reading a populated mapping faulted";
    }
  }
  std::remove(path.c_str());
}

TEST(MappedFile, MissingFileIsAnErrorNamingIt) {
  auto m = MappedFile::open("/nonexistent/rill_mapped_file_test.bin", true);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("rill_mapped_file_test.bin"), std::string::npos);
}

}  // namespace
}  // namespace rill
