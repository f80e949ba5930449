#pragma once
// GEMM through cuBLASLt: y[n, rows] (+)= x[n, cols] . W[rows, cols]^T with
// W and x in one dtype (F32, F16 or BF16) and y in f32. F32 runs in true
// f32 (CUBLAS_COMPUTE_32F: no TF32), so f32 checkpoints match the CPU.
// One plan (descriptors + the heuristic's algorithm) per shape, made the
// first time a shape is seen and reused after: the step path only looks
// plans up.
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "backend/cuda/cuda_context.h"
#include "core/dtype.h"
#include "core/result.h"

namespace rill::cuda {

class Gemm {
 public:
  explicit Gemm(const Context& ctx);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // All pointers on the device; W rows contiguous (cols elements each).
  Status run(DType dtype, const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y,
             bool accumulate);

  // Matmul dispatch used by the models. F32 weights always take the hand
  // GEMV (batch invariant; f32 checkpoints are for parity runs, not speed).
  // F16/BF16 take it for one token and cuBLASLt for more: on the H200 the
  // GEMV streams the 8B shapes' weights as fast as cuBLASLt or faster at one
  // token and loses from two tokens on (docs/perf.md, bench_cuda --kernels).
  // Batch-invariant mode (set_batch_invariant(true)): F16/BF16 take
  // gemm_invariant at every token count (one token too) and F32 the GEMV,
  // never cuBLASLt, so y[t, r] depends only on W's row r and x's row t.
  Status matmul(DType dtype, const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y,
                bool accumulate);

  // FP8 GEMM on the tensor cores (fp8.h's weights): y[t, r] (+)=
  // xs[t] ws[r] sum_c xq[t, c] wq[r, c], wq e4m3 rows w_ld bytes apart
  // (16-byte aligned), xq [n, cols] e4m3 dense, ws [rows] and xs [n] f32,
  // f32 accumulation. The scales go in cuBLASLt's outer-vector scaling
  // where it has an algorithm for it; else the GEMM runs unscaled into y
  // (or, accumulating, into `d` [n, d_floats / n], in row chunks) and
  // fp8_scale_rows applies them. Errors when cuBLASLt has no FP8 algorithm
  // for the shape at all (fp8_gemm_supported says so first; the answer is
  // remembered per shape).
  bool fp8_gemm_supported(int64_t n, int64_t rows, int64_t cols, int64_t w_ld);
  // Whether the shape gets cuBLASLt's outer-vector scales (no extra pass).
  bool fp8_gemm_outer_scales(int64_t n, int64_t rows, int64_t cols, int64_t w_ld) {
    return n > 0 && fp8_plan(n, rows, cols, w_ld, true) != nullptr;
  }
  Status run_fp8(const uint8_t* wq, int64_t w_ld, const float* ws, const uint8_t* xq, const float* xs, int64_t n,
                 int64_t rows, int64_t cols, float* y, bool accumulate, float* d, int64_t d_floats);

  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  bool batch_invariant() const { return batch_invariant_; }

 private:
  struct Plan;
  Result<Plan*> plan(DType dtype, int64_t n, int64_t rows, int64_t cols);
  // Null: no algorithm. `outer`: with outer-vector scales (else unscaled).
  Plan* fp8_plan(int64_t n, int64_t rows, int64_t cols, int64_t w_ld, bool outer);

  const Context& ctx_;
  std::unordered_map<uint64_t, std::unique_ptr<Plan>> plans_;
  std::unordered_map<uint64_t, std::unique_ptr<Plan>> fp8_plans_;  // a null plan: the shape has no algorithm
  bool batch_invariant_ = false;
};

// The batch-invariant GEMM (gemm_invariant.cu): y[t, r] (+)= sum_c W[r, c]
// x[t, c] for W [rows, cols], x [n, cols] in one dtype (F16 or BF16, rows a
// whole number of 16 bytes: gemm_invariant_supported), y [n, rows] f32. On
// tensor cores (mma.m16n8k16, f32 accumulation) in an order fixed by cols
// alone: each output is the same bits whatever n is and whichever other
// tokens share the call. Slower than cuBLASLt at large n (no shared-memory
// tiling) and than the GEMV at one token; used only in batch-invariant mode.
bool gemm_invariant_supported(DType dtype, int64_t n_cols);
void gemm_invariant(DType dtype, const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y,
                    bool accumulate, cudaStream_t stream);

}  // namespace rill::cuda
