// bench_prefetch: whether prefetch_l2 (backend/cuda/prefetch.h) puts a
// weight in L2, how long its requests take, and what the one-token GEMV of
// the weight gains from it (docs/perf.md, issue 23), on the Llama-3.1-8B's
// o and qkv shapes in bf16 and FP8 (the decode step's small matrices).
//
//   bench_prefetch [--wait-us N]
//
// Per shape, median of 7 (us): the GEMV after an L2 flush (cold), right
// after another GEMV of it (hot: as much as L2 holds); per form (bulk,
// lines): the prefetch kernel alone after a flush (its launch to its
// completion), the GEMV after a flush and a finished prefetch, and the
// decode step's pattern: a flush, a kernel that waits N us (default 8,
// standing for RoPE and attention) with the prefetch beside it on a second
// stream, then the GEMV: the time from the wait's start to the GEMV's end,
// against the same without the prefetch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/prefetch.h"

namespace rill {
namespace {

__global__ void flush_kernel(const uint4* p, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads
}

__global__ void wait_kernel(long long ns) {
  const long long t0 = clock64();
  // clock64 counts SM cycles; ~1.7-1.98 GHz: cycles = ns * 1.8 is close enough for a stand-in.
  while (clock64() - t0 < ns * 18 / 10) {
  }
}

struct Shape {
  const char* name;
  int64_t rows, cols;
  bool fp8;
};

class Bench {
 public:
  explicit Bench(cudaStream_t s) : s_(s) {
    RILL_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    RILL_CUDA_CHECK(cudaEventCreate(&e0_));
    RILL_CUDA_CHECK(cudaEventCreate(&e1_));
    RILL_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    RILL_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
    RILL_CUDA_CHECK(cudaMalloc(&flush_, kFlushBytes));
    RILL_CUDA_CHECK(cudaMemset(flush_, 1, kFlushBytes));
    RILL_CUDA_CHECK(cudaMalloc(&sink_, 4));
  }
  void flush() { flush_kernel<<<264, 512, 0, s_>>>(static_cast<const uint4*>(flush_), kFlushBytes / 16, sink_); }
  // Median of 7 timed calls of fn (each after setup), us.
  double median(const std::function<void()>& setup, const std::function<void()>& fn) {
    std::vector<float> t;
    for (int rep = 0; rep < 8; ++rep) {
      setup();
      RILL_CUDA_CHECK(cudaEventRecord(e0_, s_));
      fn();
      RILL_CUDA_CHECK(cudaEventRecord(e1_, s_));
      RILL_CUDA_CHECK(cudaEventSynchronize(e1_));
      float ms = 0;
      cudaEventElapsedTime(&ms, e0_, e1_);
      if (rep > 0) t.push_back(ms * 1e3f);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  cudaStream_t s_ = nullptr, side_ = nullptr;
  cudaEvent_t e0_, e1_, fork_, join_;
  void* flush_ = nullptr;
  unsigned* sink_ = nullptr;
  static constexpr size_t kFlushBytes = size_t{256} << 20;
};

}  // namespace
}  // namespace rill

int main(int argc, char** argv) {
  using namespace rill;
  long long wait_us = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--wait-us")) wait_us = std::atoll(argv[i + 1]);
  }
  auto ctx = cuda::Context::create();
  if (!ctx.ok()) {
    std::fprintf(stderr, "%s\n", ctx.error().message.c_str());
    return 1;
  }
  cuda::Gemm gemm(**ctx);
  Bench b((*ctx)->stream());
  const Shape shapes[] = {{"o bf16", 4096, 4096, false},
                          {"qkv bf16", 6144, 4096, false},
                          {"o fp8", 4096, 4096, true},
                          {"qkv fp8", 6144, 4096, true}};
  void* x = nullptr;
  float* y = nullptr;
  RILL_CUDA_CHECK(cudaMalloc(&x, 128 * 14336 * 2));
  RILL_CUDA_CHECK(cudaMemset(x, 0, 128 * 14336 * 2));
  RILL_CUDA_CHECK(cudaMalloc(&y, 128 * 28672 * 4));
  // cuBLASLt (Gemm's timed choice) at decode batches, bf16: cold and hot.
  const Shape gemms[] = {{"qkv", 6144, 4096, false},
                         {"o", 4096, 4096, false},
                         {"gate_up", 28672, 4096, false},
                         {"down", 4096, 14336, false}};
  for (int64_t n : {64, 128}) {
    for (const Shape& sh : gemms) {
      const size_t bytes = static_cast<size_t>(sh.rows * sh.cols * 2);
      void* w = nullptr;
      RILL_CUDA_CHECK(cudaMalloc(&w, bytes));
      RILL_CUDA_CHECK(cudaMemset(w, 0, bytes));
      auto mm = [&] {
        if (!gemm.matmul(DType::kBF16, w, x, n, sh.rows, sh.cols, y, false).ok()) std::abort();
      };
      const double cold = b.median([&] { b.flush(); }, mm);
      const double hot = b.median(mm, mm);
      std::printf("cuBLASLt %-8s x %3lld %6.1f MB: cold %6.1f us (%5.0f GB/s), hot %6.1f us\n", sh.name,
                  static_cast<long long>(n), bytes / 1e6, cold, bytes / cold / 1e3, hot);
      cudaFree(w);
    }
  }
  for (const Shape& sh : shapes) {
    const size_t bytes = sh.fp8 ? cuda::fp8_matrix_bytes(sh.rows, sh.cols) : static_cast<size_t>(sh.rows * sh.cols * 2);
    void* w = nullptr;
    RILL_CUDA_CHECK(cudaMalloc(&w, bytes));
    RILL_CUDA_CHECK(cudaMemset(w, 0, bytes));
    auto gemv = [&] {
      if (sh.fp8) {
        cuda::fp8_gemv(static_cast<const uint8_t*>(w), DType::kBF16, x, 1, sh.rows, sh.cols, y, false, b.s_);
      } else {
        cuda::gemv(DType::kBF16, w, x, 1, sh.rows, sh.cols, y, false, b.s_);
      }
    };
    const double cold = b.median([&] { b.flush(); }, gemv);
    const double hot = b.median(gemv, gemv);
    std::printf("%-9s %6.1f MB: gemv cold %6.1f us (%5.0f GB/s), hot %6.1f us\n", sh.name, bytes / 1e6, cold,
                bytes / cold / 1e3, hot);
    const double plain = b.median([&] { b.flush(); },
                                  [&] {
                                    wait_kernel<<<1, 32, 0, b.s_>>>(wait_us * 1000);
                                    gemv();
                                  });
    for (cuda::PrefetchForm form : {cuda::PrefetchForm::kBulk, cuda::PrefetchForm::kLines}) {
      const char* fname = form == cuda::PrefetchForm::kBulk ? "bulk" : "lines";
      const double alone = b.median([&] { b.flush(); }, [&] { cuda::prefetch_l2(w, bytes, b.s_, form, false); });
      const double after = b.median(
          [&] {
            b.flush();
            cuda::prefetch_l2(w, bytes, b.s_, form, false);
            wait_kernel<<<1, 32, 0, b.s_>>>(30000);  // 30 us for the requests to land
          },
          gemv);
      const double overlapped = b.median([&] { b.flush(); },
                                         [&] {
                                           RILL_CUDA_CHECK(cudaEventRecord(b.fork_, b.s_));
                                           RILL_CUDA_CHECK(cudaStreamWaitEvent(b.side_, b.fork_, 0));
                                           cuda::prefetch_l2(w, bytes, b.side_, form, false);
                                           RILL_CUDA_CHECK(cudaEventRecord(b.join_, b.side_));
                                           wait_kernel<<<1, 32, 0, b.s_>>>(wait_us * 1000);
                                           RILL_CUDA_CHECK(cudaStreamWaitEvent(b.s_, b.join_, 0));
                                           gemv();
                                         });
      const double unjoined = b.median([&] { b.flush(); },
                                       [&] {
                                         RILL_CUDA_CHECK(cudaEventRecord(b.fork_, b.s_));
                                         RILL_CUDA_CHECK(cudaStreamWaitEvent(b.side_, b.fork_, 0));
                                         cuda::prefetch_l2(w, bytes, b.side_, form, false);
                                         wait_kernel<<<1, 32, 0, b.s_>>>(wait_us * 1000);
                                         gemv();
                                       });
      RILL_CUDA_CHECK(cudaStreamSynchronize(b.side_));
      std::printf(
          "  %-5s prefetch alone %6.1f us (%5.0f GB/s); gemv after it %6.1f us; wait %lld us + gemv: %6.1f plain, "
          "%6.1f prefetched and joined, %6.1f unjoined\n",
          fname, alone, bytes / alone / 1e3, after, wait_us, plain, overlapped, unjoined);
    }
    cudaFree(w);
  }
  return 0;
}
