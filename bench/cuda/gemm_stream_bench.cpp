// bench_gemm_stream: gemm_stream (backend/cuda/hopper/gemm_stream.h) against
// what Gemm runs today (cuBLASLt, the per-shape timed choice) on the
// Llama-3.1-8B's bf16 decode matmuls, each the way the Llama graph calls it:
// qkv overwriting, o and down accumulating into the residual, gate_up with
// a bf16 output (Gemm::run_narrow), the head overwriting.
//
//   bench_gemm_stream [--tokens 8,64,128] [--profile 1] [--fp8 1]
//
// Each figure is the median over 5 runs of 20 back-to-back calls (with
// programmatic launch, as in a decode step) cycling over copies of the
// weights that together exceed the L2 cache several times, so the weights
// come from HBM; GB/s counts the weight bytes. gemm_stream runs every
// variant and split count it takes. --profile 1: instead, one call of
// cuBLASLt's choice and of each gemm_stream configuration per shape at the
// first token count, in that order, for ncu. --fp8 1: the same shapes in
// FP8 (fp8.h's kFp8Rows, e4m3 x with token scales): Gemm::run_fp8
// (cuBLASLt's FP8 GEMM and its scale pass) against gemm_stream's e4m3 form
// with the scales in its epilogue (gate_up unscaled, as fp8_matmul_glu
// calls it, against run_fp8_unscaled).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/hopper/gemm_stream.h"

namespace rill {
namespace {

struct Shape {
  const char* name;
  int64_t rows, cols;
  bool accumulate, narrow;
};
constexpr Shape kShapes[] = {{"qkv", 6144, 4096, false, false},
                             {"o", 4096, 4096, true, false},
                             {"gate_up", 28672, 4096, false, true},
                             {"down", 4096, 14336, true, false},
                             {"lm_head", 128256, 4096, false, false}};

void* device_alloc(size_t bytes, int fill) {
  void* p = nullptr;
  RILL_CUDA_CHECK(cudaMalloc(&p, bytes));
  RILL_CUDA_CHECK(cudaMemset(p, fill, bytes));
  return p;
}

// Median over 5 runs (after a warm-up run) of one call's time in a run of
// `calls` calls in a row (call i gets i). Microseconds.
double median_us(cudaStream_t s, int calls, const std::function<void(int)>& fn) {
  cudaEvent_t e0, e1;
  RILL_CUDA_CHECK(cudaEventCreate(&e0));
  RILL_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> t;
  for (int rep = 0; rep < 6; ++rep) {
    RILL_CUDA_CHECK(cudaEventRecord(e0, s));
    for (int i = 0; i < calls; ++i) fn(i);
    RILL_CUDA_CHECK(cudaEventRecord(e1, s));
    RILL_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    RILL_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (rep > 0) t.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2] * 1e3 / calls;
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::strtoll(p, nullptr, 10));
    p = std::strchr(p, ',');
    if (!p) break;
    ++p;
  }
  return v;
}

// --fp8 1: every shape in FP8 at every token count.
void fp8_bench(cuda::Context& ctx, const std::vector<int64_t>& tokens) {
  const cudaStream_t s = ctx.stream();
  const int64_t max_n = *std::max_element(tokens.begin(), tokens.end());
  void* xq = device_alloc(size_t{14336} * static_cast<size_t>(max_n), 0x30);  // e4m3 0.5
  auto* xs = static_cast<float*>(device_alloc(static_cast<size_t>(max_n) * 4, 0));
  std::vector<float> ones(static_cast<size_t>(max_n), 0.01f);
  RILL_CUDA_CHECK(cudaMemcpy(xs, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  void* y = device_alloc(size_t{128256} * static_cast<size_t>(max_n) * 4, 0);
  const int64_t d_floats = max_n * 4096;
  auto* d = static_cast<float*>(device_alloc(static_cast<size_t>(d_floats) * 4, 0));
  for (const Shape& sh : kShapes) {
    const size_t bytes = cuda::fp8_matrix_bytes(sh.rows, sh.cols);
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t{400} << 20) / bytes + 1));
    std::vector<void*> w;
    for (int c = 0; c < copies; ++c) w.push_back(device_alloc(bytes, 0x38));  // e4m3 1.0 values, scale ~4e-5
    const int64_t w_ld = static_cast<int64_t>(cuda::fp8_row_bytes(sh.cols));
    const double gb = static_cast<double>(sh.rows * sh.cols) / 1e9;
    const bool unscaled = sh.narrow;  // gate_up: fp8_matmul_glu's unscaled product
    for (int64_t n : tokens) {
      cuda::Gemm gemm(ctx);
      auto blas = [&](int i) {
        const auto* wi = static_cast<const uint8_t*>(w[static_cast<size_t>(i % copies)]);
        const Status st = unscaled
                              ? gemm.run_fp8_unscaled(wi + cuda::kFp8RowHeader, w_ld, static_cast<const uint8_t*>(xq),
                                                      n, sh.rows, sh.cols, static_cast<float*>(y))
                              : gemm.run_fp8(wi + cuda::kFp8RowHeader, w_ld, cuda::fp8_scales(wi, sh.rows, sh.cols),
                                             static_cast<const uint8_t*>(xq), xs, n, sh.rows, sh.cols,
                                             static_cast<float*>(y), sh.accumulate, d, d_floats);
        if (!st.ok()) {
          std::fprintf(stderr, "%s\n", st.error().message.c_str());
          std::exit(1);
        }
      };
      blas(0);
      RILL_CUDA_CHECK(cudaStreamSynchronize(s));
      auto args = [&](int variant, int splits, int i) {
        const auto* wi = static_cast<const uint8_t*>(w[static_cast<size_t>(i % copies)]);
        cuda::GemmStreamArgs a;
        a.e4m3 = true;
        a.w = wi + cuda::kFp8RowHeader;
        a.w_ld = w_ld;
        a.x = xq;
        a.ws = unscaled ? nullptr : cuda::fp8_scales(wi, sh.rows, sh.cols);
        a.xs = unscaled ? nullptr : xs;
        a.y = y;
        a.n = n;
        a.rows = sh.rows;
        a.cols = sh.cols;
        a.accumulate = sh.accumulate;
        a.splits = splits;
        a.variant = variant;
        return a;
      };
      auto report = [&](const std::string& what, double us) {
        std::printf("  fp8 %-8s n=%-4lld %-14s %8.1f us %6.0f GB/s\n", sh.name, static_cast<long long>(n), what.c_str(),
                    us, gb / (us * 1e-6));
      };
      report(unscaled ? "cublasLt" : "cublasLt+scale", median_us(s, 20, blas));
      for (int v = 0; v < cuda::kGemmStreamVariants; ++v) {
        for (int sp : cuda::kGemmStreamSplits) {
          if (!cuda::gemm_stream_supported(args(v, sp, 0))) continue;
          report("stream v" + std::to_string(v) + " s" + std::to_string(sp), median_us(s, 20, [&](int i) {
                   if (!cuda::gemm_stream(args(v, sp, i), s)) {
                     std::fprintf(stderr, "gemm_stream refused\n");
                     std::exit(1);
                   }
                 }));
        }
      }
    }
    for (void* p : w) cudaFree(p);
  }
  cudaFree(xq);
  cudaFree(xs);
  cudaFree(y);
  cudaFree(d);
}

int run(int argc, char** argv) {
  std::vector<int64_t> tokens = {8, 64, 128};
  bool profile = false, fp8 = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = parse_list(argv[i + 1]);
    if (!std::strcmp(argv[i], "--profile")) profile = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--fp8")) fp8 = std::atoi(argv[i + 1]) != 0;
  }
  auto ctx = cuda::Context::create();
  if (!ctx.ok()) {
    std::fprintf(stderr, "%s\n", ctx.error().message.c_str());
    return 1;
  }
  if (!cuda::gemm_stream_available()) {
    std::fprintf(stderr, "gemm_stream does not run on this device\n");
    return 1;
  }
  const cudaStream_t s = (*ctx)->stream();
  cudaDeviceProp prop{};
  RILL_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  if (fp8) {
    fp8_bench(**ctx, tokens);
    return 0;
  }
  const int64_t max_n = *std::max_element(tokens.begin(), tokens.end());
  void* x = device_alloc(size_t{14336} * static_cast<size_t>(max_n) * 2, 0x3c);  // bf16 ~0.0117
  void* y = device_alloc(size_t{128256} * static_cast<size_t>(max_n) * 4, 0);
  for (const Shape& sh : kShapes) {
    const size_t bytes = static_cast<size_t>(sh.rows * sh.cols) * 2;
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t{400} << 20) / bytes + 1));
    std::vector<void*> w;
    for (int c = 0; c < copies; ++c) w.push_back(device_alloc(bytes, 0x3c));
    const double gb = static_cast<double>(bytes) / 1e9;
    for (int64_t n : tokens) {
      cuda::Gemm gemm(**ctx);  // cuBLASLt alone, tuned on its first call
      auto blas = [&](int i) {
        const void* wi = w[static_cast<size_t>(i % copies)];
        const Status st =
            sh.narrow ? gemm.run_narrow(DType::kBF16, wi, x, n, sh.rows, sh.cols, y)
                      : gemm.run(DType::kBF16, wi, x, n, sh.rows, sh.cols, static_cast<float*>(y), sh.accumulate);
        if (!st.ok()) {
          std::fprintf(stderr, "%s\n", st.error().message.c_str());
          std::exit(1);
        }
      };
      blas(0);  // the timing
      RILL_CUDA_CHECK(cudaStreamSynchronize(s));
      auto stream_call = [&](int variant, int splits, int i) {
        cuda::GemmStreamArgs a;
        a.dtype = DType::kBF16;
        a.w = w[static_cast<size_t>(i % copies)];
        a.x = x;
        a.y = y;
        a.n = n;
        a.rows = sh.rows;
        a.cols = sh.cols;
        a.accumulate = sh.accumulate;
        a.narrow = sh.narrow;
        a.splits = splits;
        a.variant = variant;
        return a;
      };
      if (profile) {
        if (n != tokens.front()) continue;
        blas(0);
        for (int v = 0; v < cuda::kGemmStreamVariants; ++v) {
          for (int sp : cuda::kGemmStreamSplits) {
            const cuda::GemmStreamArgs a = stream_call(v, sp, 0);
            if (cuda::gemm_stream_supported(a)) cuda::gemm_stream(a, s);
          }
        }
        RILL_CUDA_CHECK(cudaStreamSynchronize(s));
        continue;
      }
      auto report = [&](const std::string& what, double us) {
        std::printf("  %-8s n=%-4lld %-14s %8.1f us %6.0f GB/s\n", sh.name, static_cast<long long>(n), what.c_str(), us,
                    gb / (us * 1e-6));
      };
      report("cublasLt", median_us(s, 20, blas));
      for (int v = 0; v < cuda::kGemmStreamVariants; ++v) {
        for (int sp : cuda::kGemmStreamSplits) {
          if (!cuda::gemm_stream_supported(stream_call(v, sp, 0))) continue;
          report("stream v" + std::to_string(v) + " s" + std::to_string(sp), median_us(s, 20, [&](int i) {
                   if (!cuda::gemm_stream(stream_call(v, sp, i), s)) {
                     std::fprintf(stderr, "gemm_stream refused\n");
                     std::exit(1);
                   }
                 }));
        }
      }
    }
    for (void* p : w) cudaFree(p);
  }
  cudaFree(x);
  cudaFree(y);
  return 0;
}

}  // namespace
}  // namespace rill

int main(int argc, char** argv) {
  return rill::run(argc, argv);
}
