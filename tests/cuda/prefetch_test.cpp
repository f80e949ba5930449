// prefetch_l2 and its caps' parser (backend/cuda/prefetch.h): the parser's
// accepted and refused forms; the kernel over regions of every size class
// (under a chunk, an odd tail), in both forms, launched programmatically or
// not, leaves the bytes as they were and the stream healthy. Whether it speeds a step
// up is docs/perf.md's; that it changes no logit is llama_cuda_test.cpp's.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/prefetch.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

TEST(CudaPrefetch, CapsAreOneOrThreeWholeMegabytes) {
  PrefetchCaps c;
  ASSERT_TRUE(parse_prefetch_caps("24", c));
  EXPECT_EQ(c.bytes[0], size_t{24} << 20);
  EXPECT_EQ(c.bytes[1], size_t{24} << 20);
  EXPECT_EQ(c.bytes[2], size_t{24} << 20);
  ASSERT_TRUE(parse_prefetch_caps("32,0,8", c));
  EXPECT_EQ(c.bytes[0], size_t{32} << 20);
  EXPECT_EQ(c.bytes[1], size_t{0});
  EXPECT_EQ(c.bytes[2], size_t{8} << 20);
  // Null and empty keep what the caps held.
  ASSERT_TRUE(parse_prefetch_caps(nullptr, c));
  ASSERT_TRUE(parse_prefetch_caps("", c));
  EXPECT_EQ(c.bytes[0], size_t{32} << 20);
  for (const char* bad : {"1,2", "1,2,3,4", "1,2,3,", ",1,2", "-1", " 1", "1 ", "1x", "x", "1,,2", "0x10",
                          "99999999999999999999", "1048577"}) {
    PrefetchCaps d;
    d.bytes[0] = 7;
    EXPECT_FALSE(parse_prefetch_caps(bad, d)) << bad;
    EXPECT_EQ(d.bytes[0], size_t{7}) << bad << ": a refused value changed the caps";
  }
}

TEST(CudaPrefetch, LeavesTheBytesAsTheyWere) {
  RILL_REQUIRE_GPU();
  const size_t n = (size_t{5} << 20) + 48;  // 80 chunks and a tail of 48 bytes
  std::vector<uint8_t> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<uint8_t>(i * 131 + 7);
  auto buf = DeviceBuffer::allocate(n, "prefetch test");
  ASSERT_TRUE(buf.ok()) << buf.error().message;
  ASSERT_EQ(cudaMemcpy(buf->data(), host.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const uint8_t* p = buf->as<uint8_t>();
  for (PrefetchForm form : {PrefetchForm::kBulk, PrefetchForm::kLines}) {
    for (bool programmatic : {true, false}) {
      for (size_t bytes :
           {size_t{0}, size_t{15}, size_t{16}, size_t{1000}, kPrefetchChunk, kPrefetchChunk + 16, n, n - 48}) {
        prefetch_l2(p, bytes, s, form, programmatic);
      }
      prefetch_l2(nullptr, n, s, form, programmatic);          // nothing to request
      prefetch_l2(p + 4096, n - 4096, s, form, programmatic);  // a region starting inside the buffer
    }
  }
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<uint8_t> back(n);
  ASSERT_EQ(cudaMemcpy(back.data(), buf->data(), n, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace rill::cuda
