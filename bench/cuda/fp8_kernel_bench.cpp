// bench_fp8_kernels: the FP8 weight kernels (backend/cuda/fp8.h) alone on
// the Llama-3.1-8B's matrix shapes, against the device's measured copy
// bandwidth, and the FP8 GEMM path's parts against bf16 cuBLASLt.
//
//   bench_fp8_kernels [--gemm 0|1] [--mma 0|1]
//   bench_fp8_kernels --mma-only 1: only the fp8_mma comparison (below)
//   bench_fp8_kernels --profile 2: fp8_mma (the plan's split) and its
//   reduction once per shape at 64 tokens (shape k's launch of
//   fp8_mma_kernel: --launch-skip k), for ncu
//   bench_fp8_kernels --profile 1: each kernel of the FP8 paths once per
//   shape (fp8_gemv and fp8_gemv_stream at 1 and 8 tokens, in that order
//   per shape: ncu's --launch-skip 2 k picks shape k of either kernel's
//   name; at 64 and 2,048 tokens the
//   activation quantization, cuBLASLt's FP8 GEMM and its scale pass, and
//   bf16 cuBLASLt), for ncu
//
// GEMV: every configuration fp8_gemv_variant and fp8_gemv_stream_variant offer at one token, then fp8_gemv itself and
// fp8_gemv_stream ("v2 stream") at 1..8 tokens (bf16 x; one token with f32 x too) and the bf16 GEMV on the same shape
// in bf16 weights. Each figure is the median over 5 runs of 20 back-to-back launches (programmatic launch, as in a
// decode step) cycling over copies of the matrix that together exceed the L2 cache several times; GB/s counts the
// weight bytes read. GEMM (--gemm 1, the default): at 8..2,048 tokens, the activation quantization
// (quantize_fp8_tokens), cuBLASLt's FP8 GEMM with its scale pass (Gemm::run_fp8, overwriting and accumulating), the
// scale pass alone (fp8_scale_rows) and bf16 cuBLASLt (Gemm::run), in microseconds and TFLOP/s.
// MMA (--mma 1, the default): per 8B shape at 16, 32, 64 and 128 tokens, fp8_mma (the FP8 GEMM of our own, scales in
// its epilogue; 128 tokens: two launches of 64) against what fp8_matmul runs today (cuBLASLt's FP8 GEMM and its scale
// pass: Gemm::run_fp8), both on the same quantized activations, the activation quantization apart; at 64 tokens also
// fp8_mma with the columns forced into 1, 2, 4 and 8 parts, and for gate_up the GLU forms (fp8_mma_glu against
// run_fp8_unscaled + fp8_scale_glu, bf16 out), and the bf16-x forms (fp8_mma_bf16x, fp8_mma_glu_bf16x: no
// activation quantization; set against quant + cuBLASLt). Weights cycle over copies that exceed the L2 cache (as the
// GEMV's), so every figure reads them from HBM; % copy: weight bytes a second against the measured copy rate.
#include <cublasLt.h>
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

namespace rill {
namespace {

struct Shape {
  const char* name;
  int64_t rows, cols;
};
constexpr Shape kShapes[] = {
    {"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}, {"lm_head", 128256, 4096}};

size_t fp8_bytes(const Shape& s) {
  return cuda::fp8_matrix_bytes(s.rows, s.cols);
}

void* device_alloc(size_t bytes, int fill) {
  void* p = nullptr;
  RILL_CUDA_CHECK(cudaMalloc(&p, bytes));
  RILL_CUDA_CHECK(cudaMemset(p, fill, bytes));
  return p;
}

// Device-to-device copy of 2 GiB, bytes read + written per second (GB/s).
double copy_bandwidth(cudaStream_t s) {
  const size_t bytes = size_t{2} << 30;
  void* a = device_alloc(bytes, 1);
  void* b = device_alloc(bytes, 2);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> t;
  for (int rep = 0; rep < 6; ++rep) {
    cudaEventRecord(e0, s);
    RILL_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (rep > 0) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) / (t[t.size() / 2] * 1e-3) / 1e9;
}

class Timer {
 public:
  explicit Timer(cudaStream_t s) : s_(s) {
    cudaEventCreate(&e0_);
    cudaEventCreate(&e1_);
  }
  // Median over 5 runs of the time of one call, each run `calls` calls in a
  // row (call i gets i), after one warm-up run. Microseconds.
  double us(int calls, const std::function<void(int)>& fn) {
    std::vector<float> t;
    for (int rep = 0; rep < 6; ++rep) {
      cudaEventRecord(e0_, s_);
      for (int i = 0; i < calls; ++i) fn(i);
      cudaEventRecord(e1_, s_);
      RILL_CUDA_CHECK(cudaEventSynchronize(e1_));
      float ms = 0;
      cudaEventElapsedTime(&ms, e0_, e1_);
      if (rep > 0) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2] * 1e3 / calls;
  }

 private:
  cudaStream_t s_;
  cudaEvent_t e0_, e1_;
};

void gemv_bench(cudaStream_t s, double copy_gbs) {
  Timer timer(s);
  void* x = device_alloc(size_t{14336} * 8 * 4, 0x3c);  // bf16 ~0.0115, f32 ~0.0115
  float* y = static_cast<float*>(device_alloc(size_t{128256} * 8 * 4, 0));
  std::printf("GEMV (weights read once; GB/s of weight bytes; copy %.0f GB/s)\n", copy_gbs);
  for (const Shape& sh : kShapes) {
    const size_t bytes = fp8_bytes(sh);
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t{400} << 20) / bytes + 1));
    std::vector<void*> w;
    for (int c = 0; c < copies; ++c) w.push_back(device_alloc(bytes, 0x38));  // e4m3 1.0, scale ~4e-5
    const double gb = static_cast<double>(sh.rows * sh.cols) / 1e9;
    auto report = [&](const char* what, double us) {
      std::printf("  %-8s %-14s %8.1f us %6.0f GB/s %5.1f%%\n", sh.name, what, us, gb / (us * 1e-6),
                  100.0 * gb / (us * 1e-6) / copy_gbs);
    };
    for (int v = 0; v < cuda::fp8_gemv_n_variants(); ++v) {
      report(cuda::fp8_gemv_variant_name(v), timer.us(20, [&](int i) {
        cuda::fp8_gemv_variant(v, static_cast<const uint8_t*>(w[i % copies]), x, sh.rows, sh.cols, y, s);
      }));
    }
    for (int v = 0; v < cuda::fp8_gemv_stream_n_variants(); ++v) {
      report(cuda::fp8_gemv_stream_variant_name(v), timer.us(20, [&](int i) {
        cuda::fp8_gemv_stream_variant(v, static_cast<const uint8_t*>(w[i % copies]), x, sh.rows, sh.cols, y, s);
      }));
    }
    for (int n = 1; n <= 8; ++n) {
      char what[64];
      std::snprintf(what, sizeof what, "fp8_gemv n%d", n);
      report(what, timer.us(20, [&](int i) {
        cuda::fp8_gemv(static_cast<const uint8_t*>(w[i % copies]), DType::kBF16, x, n, sh.rows, sh.cols, y, false, s);
      }));
      std::snprintf(what, sizeof what, "v2 stream n%d", n);
      report(what, timer.us(20, [&](int i) {
        cuda::fp8_gemv_stream(static_cast<const uint8_t*>(w[i % copies]), DType::kBF16, x, n, sh.rows, sh.cols, y,
                              false, s);
      }));
    }
    report("fp8_gemv f32x", timer.us(20, [&](int i) {
      cuda::fp8_gemv(static_cast<const uint8_t*>(w[i % copies]), DType::kF32, x, 1, sh.rows, sh.cols, y, false, s);
    }));
    for (void* p : w) cudaFree(p);
    // bf16 weights, the bf16 GEMV (twice the bytes: its own GB/s)
    const size_t bf_bytes = static_cast<size_t>(sh.rows * sh.cols) * 2;
    const int bf_copies = static_cast<int>(std::max<size_t>(2, (size_t{400} << 20) / bf_bytes + 1));
    std::vector<void*> wb;
    for (int c = 0; c < bf_copies; ++c) wb.push_back(device_alloc(bf_bytes, 0x3b));
    const double us =
        timer.us(20, [&](int i) { cuda::gemv(DType::kBF16, wb[i % bf_copies], x, 1, sh.rows, sh.cols, y, false, s); });
    std::printf("  %-8s %-14s %8.1f us %6.0f GB/s %5.1f%% (bf16 weights)\n", sh.name, "bf16 gemv n1", us,
                2 * gb / (us * 1e-6), 100.0 * 2 * gb / (us * 1e-6) / copy_gbs);
    for (void* p : wb) cudaFree(p);
  }
  cudaFree(x);
  cudaFree(y);
}

void gemm_bench(const cuda::Context& ctx) {
  cudaStream_t s = ctx.stream();
  Timer timer(s);
  cuda::Gemm gemm(ctx);
  constexpr int64_t kMaxTok = 2048, kMaxCols = 14336;
  void* x = device_alloc(size_t{kMaxTok} * kMaxCols * 2, 0x3c);
  auto* xq = static_cast<uint8_t*>(device_alloc(size_t{kMaxTok} * kMaxCols, 0));
  auto* xs = static_cast<float*>(device_alloc(size_t{kMaxTok} * 4, 0));
  const int64_t d_floats = kMaxTok * 4096;
  auto* d = static_cast<float*>(device_alloc(size_t(d_floats) * 4, 0));
  std::printf("GEMM (x bf16; us, TFLOP/s)\n");
  for (const Shape& sh : kShapes) {
    if (sh.rows > 30000) continue;  // lm_head: one token per sequence
    void* w = device_alloc(fp8_bytes(sh), 0x38);
    void* wb = device_alloc(static_cast<size_t>(sh.rows * sh.cols) * 2, 0x3b);
    auto* y = static_cast<float*>(device_alloc(static_cast<size_t>(kMaxTok * sh.rows) * 4, 0));
    const int64_t ld = static_cast<int64_t>(cuda::fp8_row_bytes(sh.cols));
    const auto* wq = static_cast<const uint8_t*>(w) + cuda::kFp8RowHeader;
    const float* ws = cuda::fp8_scales(w, sh.rows, sh.cols);
    for (int64_t n : {8, 16, 64, 128, 256, 2048}) {
      const double flop = 2.0 * static_cast<double>(n * sh.rows * sh.cols);
      auto tf = [&](double us) { return flop / (us * 1e-6) / 1e12; };
      const double t_q = timer.us(10, [&](int) { cuda::quantize_fp8_tokens(DType::kBF16, x, n, sh.cols, xq, xs, s); });
      const bool ok = gemm.fp8_gemm_supported(n, sh.rows, sh.cols, ld);
      double t_g = -1, t_ga = -1;
      if (ok) {
        t_g = timer.us(
            10, [&](int) { (void)gemm.run_fp8(wq, ld, ws, xq, xs, n, sh.rows, sh.cols, y, false, d, d_floats); });
        t_ga = timer.us(
            10, [&](int) { (void)gemm.run_fp8(wq, ld, ws, xq, xs, n, sh.rows, sh.cols, y, true, d, d_floats); });
      }
      const double t_s =
          timer.us(10, [&](int) { cuda::fp8_scale_rows(y, n, sh.rows, sh.rows, 0, xs, ws, y, false, s); });
      const double t_b = timer.us(10, [&](int) { (void)gemm.run(DType::kBF16, wb, x, n, sh.rows, sh.cols, y, false); });
      std::printf(
          "  %-8s n=%-5lld quant %7.1f us | fp8 gemm+scale %8.1f us %5.0f TF, accumulating %8.1f us | "
          "scale pass %7.1f us | bf16 %8.1f us %5.0f TF | outer scales %s\n",
          sh.name, static_cast<long long>(n), t_q, t_g, ok ? tf(t_g) : 0.0, t_ga, t_s, t_b, tf(t_b),
          gemm.fp8_gemm_outer_scales(n, sh.rows, sh.cols, ld) ? "yes" : "no");
      if (n <= 8) {
        const double t_v = timer.us(10, [&](int) {
          cuda::fp8_gemv(static_cast<const uint8_t*>(w), DType::kBF16, x, n, sh.rows, sh.cols, y, false, s);
        });
        std::printf("  %-8s n=%-5lld fp8_gemv %7.1f us (L2-warm)\n", sh.name, static_cast<long long>(n), t_v);
      }
    }
    cudaFree(w);
    cudaFree(wb);
    cudaFree(y);
  }
  cudaFree(x);
  cudaFree(xq);
  cudaFree(xs);
  cudaFree(d);
}

// cuBLASLt FP8 GEMM configurations Gemm does not use, timed beside the
// one it does (unscaled, then fp8_scale_rows): (a) unscaled with
// CUBLASLT_MATMUL_DESC_FAST_ACCUM; (b) the weights' row scales as an alpha
// vector (CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST: one alpha
// per output row) with one activation scale for all tokens (B scale
// pointer), which would make the scale pass unnecessary if the activations
// were quantized per tensor. "none": cuBLASLt has no algorithm.
void gemm_probe(const cuda::Context& ctx) {
  cudaStream_t s = ctx.stream();
  Timer timer(s);
  constexpr int64_t kMaxTok = 2048, kMaxCols = 14336;
  auto* xq = static_cast<uint8_t*>(device_alloc(size_t{kMaxTok} * kMaxCols, 0x30));
  auto* one = static_cast<float*>(device_alloc(4, 0));
  const float f1 = 1.0f;
  RILL_CUDA_CHECK(cudaMemcpy(one, &f1, 4, cudaMemcpyHostToDevice));
  std::printf("cuBLASLt FP8 configurations (us; none: no algorithm)\n");
  for (const Shape& sh : kShapes) {
    if (sh.rows > 30000) continue;
    void* w = device_alloc(fp8_bytes(sh), 0x38);
    auto* y = static_cast<float*>(device_alloc(static_cast<size_t>(kMaxTok * sh.rows) * 4, 0));
    const int64_t ld = static_cast<int64_t>(cuda::fp8_row_bytes(sh.cols));
    const auto* wq = static_cast<const uint8_t*>(w) + cuda::kFp8RowHeader;
    const float* ws = cuda::fp8_scales(w, sh.rows, sh.cols);
    for (int64_t n : {64, 2048}) {
      double t[3] = {-1, -1, -1};
      for (int mode = 0; mode < 3; ++mode) {
        cublasLtMatmulDesc_t desc = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
        cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        const int8_t fast = mode == 1 ? 1 : 0;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast);
        if (mode == 2) {
          const int32_t pm = CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST;
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm);
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &one, sizeof one);
        }
        cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, static_cast<uint64_t>(sh.cols), static_cast<uint64_t>(sh.rows),
                                   ld);
        cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, static_cast<uint64_t>(sh.cols), static_cast<uint64_t>(n),
                                   sh.cols);
        cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, static_cast<uint64_t>(sh.rows), static_cast<uint64_t>(n), sh.rows);
        cublasLtMatmulPreference_t pref = nullptr;
        cublasLtMatmulPreferenceCreate(&pref);
        const size_t wsb = ctx.workspace_bytes();
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
        cublasLtMatmulHeuristicResult_t res{};
        int n_res = 0;
        const bool ok = cublasLtMatmulAlgoGetHeuristic(ctx.blas(), desc, a, b, d, d, pref, 1, &res, &n_res) ==
                            CUBLAS_STATUS_SUCCESS &&
                        n_res > 0;
        if (ok) {
          const float alpha = 1.0f, beta = 0.0f;
          const void* alpha_p = mode == 2 ? static_cast<const void*>(ws) : static_cast<const void*>(&alpha);
          bool run_ok = true;
          t[mode] = timer.us(10, [&](int) {
            run_ok = run_ok && cublasLtMatmul(ctx.blas(), desc, alpha_p, wq, a, xq, b, &beta, y, d, y, d, &res.algo,
                                              ctx.workspace(), wsb, s) == CUBLAS_STATUS_SUCCESS;
          });
          if (!run_ok) t[mode] = -2;
        }
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(a);
        cublasLtMatrixLayoutDestroy(b);
        cublasLtMatrixLayoutDestroy(d);
        cublasLtMatmulDescDestroy(desc);
      }
      auto show = [](double us) {
        static char buf[4][32];
        static int k = 0;
        char* o = buf[k++ % 4];
        if (us == -1)
          std::snprintf(o, 32, "none");
        else if (us == -2)
          std::snprintf(o, 32, "run failed");
        else
          std::snprintf(o, 32, "%.1f", us);
        return o;
      };
      std::printf("  %-8s n=%-5lld unscaled %s | unscaled fast-accum %s | alpha vector + B scale %s\n", sh.name,
                  static_cast<long long>(n), show(t[0]), show(t[1]), show(t[2]));
    }
    cudaFree(w);
    cudaFree(y);
  }
  cudaFree(xq);
  cudaFree(one);
}

void mma_bench(const cuda::Context& ctx, double copy_gbs) {
  cudaStream_t s = ctx.stream();
  Timer timer(s);
  cuda::Gemm gemm(ctx);
  constexpr int64_t kMaxTok = 128, kMaxCols = 14336;
  void* x = device_alloc(size_t{kMaxTok} * kMaxCols * 2, 0x3c);
  auto* xq = static_cast<uint8_t*>(device_alloc(size_t{kMaxTok} * kMaxCols, 0x30));
  auto* xs = static_cast<float*>(device_alloc(size_t{kMaxTok} * 4, 0));
  cuda::quantize_fp8_tokens(DType::kBF16, x, kMaxTok, kMaxCols, xq, xs, s);
  const int64_t d_floats = kMaxTok * 28672;
  auto* d = static_cast<float*>(device_alloc(size_t(d_floats) * 4, 0));
  int64_t part_floats = 0;
  for (const Shape& sh : kShapes) {
    for (int k : {0, 1, 2, 4, 8}) {
      if (sh.rows > 30000 && k > 1) continue;
      part_floats = std::max({part_floats, cuda::fp8_mma_part_floats(64, sh.rows, sh.cols, false, k),
                              cuda::fp8_mma_part_floats(64, sh.rows, sh.cols, true, k)});
    }
  }
  auto* part = static_cast<float*>(device_alloc(size_t(std::max<int64_t>(part_floats, 1)) * 4, 0));
  std::printf("MMA (fp8_mma against cuBLASLt FP8 + scale pass; weights from HBM; us, %% of copy %.0f GB/s)\n",
              copy_gbs);
  for (const Shape& sh : kShapes) {
    const size_t bytes = fp8_bytes(sh);
    const int copies = static_cast<int>(std::max<size_t>(2, (size_t{400} << 20) / bytes + 1));
    std::vector<void*> w;
    for (int c = 0; c < copies; ++c) w.push_back(device_alloc(bytes, 0x38));
    auto* y = static_cast<float*>(device_alloc(static_cast<size_t>(kMaxTok * sh.rows) * 4, 0));
    const int64_t ld = static_cast<int64_t>(cuda::fp8_row_bytes(sh.cols));
    const double gb = static_cast<double>(sh.rows * sh.cols) / 1e9;
    auto pct = [&](double us) { return 100.0 * gb / (us * 1e-6) / copy_gbs; };
    auto wq = [&](int i) { return static_cast<const uint8_t*>(w[i % copies]); };
    for (int64_t n : {16, 32, 64, 128}) {
      const double t_q = timer.us(10, [&](int) { cuda::quantize_fp8_tokens(DType::kBF16, x, n, sh.cols, xq, xs, s); });
      double t_lt = -1;
      if (gemm.fp8_gemm_supported(n, sh.rows, sh.cols, ld)) {
        t_lt = timer.us(10, [&](int i) {
          (void)gemm.run_fp8(wq(i) + cuda::kFp8RowHeader, ld, cuda::fp8_scales(w[i % copies], sh.rows, sh.cols), xq, xs,
                             n, sh.rows, sh.cols, y, false, d, d_floats);
        });
      }
      const double t_m = timer.us(
          10, [&](int i) { cuda::fp8_mma(wq(i), xq, xs, n, sh.rows, sh.cols, y, false, part, part_floats, s); });
      const double t_bx = timer.us(
          10, [&](int i) { cuda::fp8_mma_bf16x(wq(i), x, n, sh.rows, sh.cols, y, false, part, part_floats, s); });
      const int64_t pf = cuda::fp8_mma_part_floats(n, sh.rows, sh.cols, false);
      const int64_t split = pf > 0 ? pf / (std::min<int64_t>(n, cuda::kFp8MmaMaxTokens) * sh.rows) : 1;
      std::printf(
          "  %-8s n=%-4lld quant %5.1f us | cuBLASLt fp8+scale %7.1f us %5.1f%% | fp8_mma %7.1f us %5.1f%% "
          "(%lld parts) | mma / cuBLASLt %.2f | fp8_mma_bf16x %7.1f us %5.1f%%, / (quant + cuBLASLt) %.2f\n",
          sh.name, static_cast<long long>(n), t_q, t_lt, t_lt > 0 ? pct(t_lt) : 0.0, t_m, pct(t_m),
          static_cast<long long>(split), t_lt > 0 ? t_m / t_lt : 0.0, t_bx, pct(t_bx),
          t_lt > 0 ? t_bx / (t_q + t_lt) : 0.0);
      if (n == 64 && sh.rows < 30000) {
        std::printf("  %-8s n=%-4lld fp8_mma by parts:", sh.name, static_cast<long long>(n));
        for (int k : {1, 2, 4, 8}) {
          const double t = timer.us(
              10, [&](int i) { cuda::fp8_mma(wq(i), xq, xs, n, sh.rows, sh.cols, y, false, part, part_floats, s, k); });
          std::printf(" %d: %.1f us %.1f%% |", k, t, pct(t));
        }
        std::printf("\n");
      }
      if (std::strcmp(sh.name, "gate_up") == 0) {
        const int64_t F = sh.rows / 2;
        const double t_lg = timer.us(10, [&](int i) {
          (void)gemm.run_fp8_unscaled(wq(i) + cuda::kFp8RowHeader, ld, xq, n, sh.rows, sh.cols, y);
          cuda::fp8_scale_glu(y, n, F, xs, cuda::fp8_scales(w[i % copies], sh.rows, sh.cols), false, DType::kBF16, d,
                              s);
        });
        const double t_mg = timer.us(10, [&](int i) {
          cuda::fp8_mma_glu(wq(i), xq, xs, n, sh.rows, sh.cols, false, DType::kBF16, d, part, part_floats, s);
        });
        const double t_bg = timer.us(10, [&](int i) {
          cuda::fp8_mma_glu_bf16x(wq(i), x, n, sh.rows, sh.cols, false, DType::kBF16, d, part, part_floats, s);
        });
        std::printf(
            "  %-8s n=%-4lld GLU (bf16 out): cuBLASLt unscaled + fp8_scale_glu %7.1f us | fp8_mma_glu %7.1f "
            "us %5.1f%% | ratio %.2f | fp8_mma_glu_bf16x %7.1f us %5.1f%%\n",
            sh.name, static_cast<long long>(n), t_lg, t_mg, pct(t_mg), t_mg / t_lg, t_bg, pct(t_bg));
      }
    }
    for (void* p : w) cudaFree(p);
    cudaFree(y);
  }
  cudaFree(x);
  cudaFree(xq);
  cudaFree(xs);
  cudaFree(d);
  cudaFree(part);
}

// --profile 2: fp8_mma once per shape at 64 tokens.
void profile_mma(const cuda::Context& ctx) {
  cudaStream_t s = ctx.stream();
  constexpr int64_t kTok = 64, kMaxCols = 14336;
  void* x = device_alloc(size_t{kTok} * kMaxCols * 2, 0x3c);
  auto* xq = static_cast<uint8_t*>(device_alloc(size_t{kTok} * kMaxCols, 0));
  auto* xs = static_cast<float*>(device_alloc(size_t{kTok} * 4, 0));
  int64_t part_floats = 1;
  for (const Shape& sh : kShapes) {
    part_floats = std::max(part_floats, cuda::fp8_mma_part_floats(kTok, sh.rows, sh.cols, false));
  }
  auto* part = static_cast<float*>(device_alloc(size_t(part_floats) * 4, 0));
  for (const Shape& sh : kShapes) {
    void* w = device_alloc(fp8_bytes(sh), 0x38);
    auto* y = static_cast<float*>(device_alloc(static_cast<size_t>(kTok * sh.rows) * 4, 0));
    cuda::quantize_fp8_tokens(DType::kBF16, x, kTok, sh.cols, xq, xs, s);
    cuda::fp8_mma(static_cast<const uint8_t*>(w), xq, xs, kTok, sh.rows, sh.cols, y, false, part, part_floats, s);
    RILL_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaFree(w);
    cudaFree(y);
  }
  cudaFree(x);
  cudaFree(xq);
  cudaFree(xs);
  cudaFree(part);
}

void profile_once(const cuda::Context& ctx) {
  cudaStream_t s = ctx.stream();
  cuda::Gemm gemm(ctx);
  constexpr int64_t kMaxTok = 2048, kMaxCols = 14336;
  void* x = device_alloc(size_t{kMaxTok} * kMaxCols * 2, 0x3c);
  auto* xq = static_cast<uint8_t*>(device_alloc(size_t{kMaxTok} * kMaxCols, 0));
  auto* xs = static_cast<float*>(device_alloc(size_t{kMaxTok} * 4, 0));
  const int64_t d_floats = kMaxTok * 4096;
  auto* d = static_cast<float*>(device_alloc(size_t(d_floats) * 4, 0));
  for (const Shape& sh : kShapes) {
    void* w = device_alloc(fp8_bytes(sh), 0x38);
    void* wb = device_alloc(static_cast<size_t>(sh.rows * sh.cols) * 2, 0x3b);
    auto* y = static_cast<float*>(device_alloc(static_cast<size_t>(kMaxTok * sh.rows) * 4, 0));
    const int64_t ld = static_cast<int64_t>(cuda::fp8_row_bytes(sh.cols));
    for (int n : {1, 8}) {
      cuda::fp8_gemv(static_cast<const uint8_t*>(w), DType::kBF16, x, n, sh.rows, sh.cols, y, false, s);
      cuda::fp8_gemv_stream(static_cast<const uint8_t*>(w), DType::kBF16, x, n, sh.rows, sh.cols, y, false, s);
    }
    for (int64_t n : {64, 2048}) {
      if (sh.rows > 30000) break;
      cuda::quantize_fp8_tokens(DType::kBF16, x, n, sh.cols, xq, xs, s);
      if (gemm.fp8_gemm_supported(n, sh.rows, sh.cols, ld)) {
        (void)gemm.run_fp8(static_cast<const uint8_t*>(w) + cuda::kFp8RowHeader, ld,
                           cuda::fp8_scales(w, sh.rows, sh.cols), xq, xs, n, sh.rows, sh.cols, y, false, d, d_floats);
      }
      (void)gemm.run(DType::kBF16, wb, x, n, sh.rows, sh.cols, y, false);
    }
    RILL_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaFree(w);
    cudaFree(wb);
    cudaFree(y);
  }
}

int run(int argc, char** argv) {
  bool gemm = true, mma = true, mma_only = false;
  int profile = 0;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--gemm")) gemm = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--mma")) mma = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--mma-only")) mma_only = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--profile")) profile = std::atoi(argv[i + 1]);
  }
  auto ctx = cuda::Context::create(0);
  if (!ctx.ok()) {
    std::fprintf(stderr, "%s\n", ctx.error().message.c_str());
    return 1;
  }
  if (profile == 2) {
    profile_mma(**ctx);
    return 0;
  }
  if (profile) {
    profile_once(**ctx);
    return 0;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const double copy = copy_bandwidth((*ctx)->stream());
  if (mma_only) {
    mma_bench(**ctx, copy);
    return 0;
  }
  gemv_bench((*ctx)->stream(), copy);
  if (gemm) {
    gemm_bench(**ctx);
    gemm_probe(**ctx);
  }
  if (mma) mma_bench(**ctx, copy);
  return 0;
}

}  // namespace
}  // namespace rill

int main(int argc, char** argv) {
  return rill::run(argc, argv);
}
