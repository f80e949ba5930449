#include "backend/cuda/gemm.h"

#include <cublasLt.h>

#include "backend/cuda/fp8.h"
#include "backend/cuda/ops.h"

namespace rill::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

std::string blas_error(cublasStatus_t s, const char* what) {
  return std::string("cuBLASLt ") + what + ": " + cublasLtGetStatusString(s);
}

}  // namespace

// Column-major view: D (rows x n, ld rows) = op(A) B with A = W stored as a
// cols x rows column-major matrix (transposed), B = x as cols x n.
struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

Gemm::Gemm(const Context& ctx) : ctx_(ctx) {}
Gemm::~Gemm() = default;

Result<Gemm::Plan*> Gemm::plan(DType dtype, int64_t n, int64_t rows, int64_t cols) {
  if (n >= (int64_t{1} << 14) || rows >= (int64_t{1} << 23) || cols >= (int64_t{1} << 23)) {
    return Error{"GEMM of " + std::to_string(n) + " x " + std::to_string(rows) + " x " + std::to_string(cols) +
                 " is larger than rill plans for"};
  }
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint8_t>(dtype) & 0xf) << 60) |
                       (static_cast<uint64_t>(n) << 46) | (static_cast<uint64_t>(rows) << 23) |
                       static_cast<uint64_t>(cols);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  auto p = std::make_unique<Plan>();
  const cudaDataType_t t = cuda_type(dtype);
  cublasStatus_t s = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return Error{blas_error(s, "matmul descriptor")};
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a);
  cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b);
  if ((s = cublasLtMatrixLayoutCreate(&p->a, t, static_cast<uint64_t>(cols), static_cast<uint64_t>(rows), cols)) !=
          CUBLAS_STATUS_SUCCESS ||
      (s = cublasLtMatrixLayoutCreate(&p->b, t, static_cast<uint64_t>(cols), static_cast<uint64_t>(n), cols)) !=
          CUBLAS_STATUS_SUCCESS ||
      (s = cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, static_cast<uint64_t>(rows), static_cast<uint64_t>(n),
                                      rows)) != CUBLAS_STATUS_SUCCESS) {
    return Error{blas_error(s, "matrix layout")};
  }
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulPreferenceCreate(&pref);
  const size_t ws = ctx_.workspace_bytes();
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublasLtMatmulHeuristicResult_t result{};
  int n_results = 0;
  s = cublasLtMatmulAlgoGetHeuristic(ctx_.blas(), p->desc, p->a, p->b, p->d, p->d, pref, 1, &result, &n_results);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || n_results == 0) {
    return Error{blas_error(s, "no algorithm") + " for " + std::string(dtype_name(dtype)) + " " + std::to_string(n) +
                 " x " + std::to_string(rows) + " x " + std::to_string(cols)};
  }
  p->algo = result.algo;
  Plan* raw = p.get();
  plans_.emplace(key, std::move(p));
  return raw;
}

Status Gemm::run(DType dtype, const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y,
                 bool accumulate) {
  if (n <= 0) return Status::Ok();
  RILL_ASSIGN_OR_RETURN(Plan * p, plan(dtype, n, rows, cols));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const cublasStatus_t s = cublasLtMatmul(ctx_.blas(), p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->d, y, p->d,
                                          &p->algo, ctx_.workspace(), ctx_.workspace_bytes(), ctx_.stream());
  if (s != CUBLAS_STATUS_SUCCESS) return Error{blas_error(s, "matmul")};
  return Status::Ok();
}

Gemm::Plan* Gemm::fp8_plan(int64_t n, int64_t rows, int64_t cols, int64_t w_ld, bool outer) {
  if (n >= (int64_t{1} << 14) || rows >= (int64_t{1} << 23) || cols >= (int64_t{1} << 23) || w_ld != cols + 16) {
    return nullptr;
  }
  const uint64_t key = (static_cast<uint64_t>(outer) << 63) | (static_cast<uint64_t>(n) << 46) |
                       (static_cast<uint64_t>(rows) << 23) | static_cast<uint64_t>(cols);
  if (auto it = fp8_plans_.find(key); it != fp8_plans_.end()) return it->second.get();
  auto p = std::make_unique<Plan>();
  bool ok = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  ok = ok &&
       cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a) ==
           CUBLAS_STATUS_SUCCESS &&
       cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b) ==
           CUBLAS_STATUS_SUCCESS;
  if (outer) {
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    ok = ok &&
         cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode) ==
             CUBLAS_STATUS_SUCCESS;
  }
  ok = ok &&
       cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, static_cast<uint64_t>(cols), static_cast<uint64_t>(rows),
                                  w_ld) == CUBLAS_STATUS_SUCCESS &&
       cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, static_cast<uint64_t>(cols), static_cast<uint64_t>(n), cols) ==
           CUBLAS_STATUS_SUCCESS &&
       cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, static_cast<uint64_t>(rows), static_cast<uint64_t>(n), rows) ==
           CUBLAS_STATUS_SUCCESS;
  if (ok) {
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulPreferenceCreate(&pref);
    const size_t ws = ctx_.workspace_bytes();
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t result{};
    int n_results = 0;
    ok = cublasLtMatmulAlgoGetHeuristic(ctx_.blas(), p->desc, p->a, p->b, p->d, p->d, pref, 1, &result, &n_results) ==
             CUBLAS_STATUS_SUCCESS &&
         n_results > 0;
    cublasLtMatmulPreferenceDestroy(pref);
    p->algo = result.algo;
  }
  if (!ok) p.reset();
  Plan* raw = p.get();
  fp8_plans_.emplace(key, std::move(p));
  return raw;
}

bool Gemm::fp8_gemm_supported(int64_t n, int64_t rows, int64_t cols, int64_t w_ld) {
  return n > 0 && (fp8_plan(n, rows, cols, w_ld, true) || fp8_plan(n, rows, cols, w_ld, false));
}

Status Gemm::run_fp8(const uint8_t* wq, int64_t w_ld, const float* ws, const uint8_t* xq, const float* xs, int64_t n,
                     int64_t rows, int64_t cols, float* y, bool accumulate, float* d, int64_t d_floats) {
  if (n <= 0) return Status::Ok();
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  auto matmul = [&](Plan* p, const uint8_t* a, float* out, float b) {
    const cublasStatus_t s = cublasLtMatmul(ctx_.blas(), p->desc, &alpha, a, p->a, xq, p->b, &b, out, p->d, out, p->d,
                                            &p->algo, ctx_.workspace(), ctx_.workspace_bytes(), ctx_.stream());
    return s == CUBLAS_STATUS_SUCCESS ? Status::Ok() : Status(Error{blas_error(s, "FP8 matmul")});
  };
  if (Plan* p = fp8_plan(n, rows, cols, w_ld, true)) {
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof ws);
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof xs);
    return matmul(p, wq, y, beta);
  }
  if (!accumulate) {  // unscaled into y, then scaled in place
    Plan* p = fp8_plan(n, rows, cols, w_ld, false);
    if (!p)
      return Error{"cuBLASLt has no FP8 GEMM for " + std::to_string(n) + " x " + std::to_string(rows) + " x " +
                   std::to_string(cols)};
    RILL_TRY(matmul(p, wq, y, 0.0f));
    fp8_scale_rows(y, n, rows, rows, 0, xs, ws, y, false, ctx_.stream());
    return Status::Ok();
  }
  const int64_t chunk = std::min(rows, d_floats / n);
  if (chunk <= 0) return Error{"FP8 matmul: no scratch for an accumulating GEMM of " + std::to_string(n) + " tokens"};
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t rc = std::min(chunk, rows - r0);
    Plan* p = fp8_plan(n, rc, cols, w_ld, false);
    if (!p)
      return Error{"cuBLASLt has no FP8 GEMM for " + std::to_string(n) + " x " + std::to_string(rc) + " x " +
                   std::to_string(cols)};
    RILL_TRY(matmul(p, wq + r0 * w_ld, d, 0.0f));
    fp8_scale_rows(d, n, rc, rows, r0, xs, ws, y, true, ctx_.stream());
  }
  return Status::Ok();
}

Status Gemm::matmul(DType dtype, const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y,
                    bool accumulate) {
  if (batch_invariant_ && dtype != DType::kF32) {
    if (!gemm_invariant_supported(dtype, cols)) {
      return Error{"batch-invariant matmul: " + std::to_string(cols) + " " + std::string(dtype_name(dtype)) +
                   " columns are not a whole number of 16 bytes"};
    }
    gemm_invariant(dtype, w, x, n, rows, cols, y, accumulate, ctx_.stream());
    return Status::Ok();
  }
  if (batch_invariant_ && !gemv_supported(dtype, cols)) {
    return Error{"batch-invariant matmul: " + std::to_string(cols) + " f32 columns are not a multiple of 4"};
  }
  if (gemv_supported(dtype, cols) && (dtype == DType::kF32 || n == 1 || batch_invariant_)) {
    gemv(dtype, w, x, n, rows, cols, y, accumulate, ctx_.stream());
    return Status::Ok();
  }
  return run(dtype, w, x, n, rows, cols, y, accumulate);
}

}  // namespace rill::cuda
