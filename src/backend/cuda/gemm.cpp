#include "backend/cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>

#include "backend/cuda/ops.h"

namespace rill::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
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

int Gemm::gemv_max_tokens(int64_t rows, int64_t cols) const {
  const auto it = gemv_max_.find(static_cast<uint64_t>(rows) << 32 | static_cast<uint64_t>(cols));
  return it == gemv_max_.end() ? 1 : it->second;
}

Status Gemm::tune(DType dtype, const void* w, int64_t rows, int64_t cols, const void* x, float* y) {
  if (!gemv_supported(dtype, cols) || dtype == DType::kF32) return Status::Ok();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  auto time = [&](auto&& fn) -> Result<float> {
    float best = 1e30f;
    for (int rep = 0; rep < 4; ++rep) {
      cudaEventRecord(e0, ctx_.stream());
      RILL_TRY(fn());
      cudaEventRecord(e1, ctx_.stream());
      if (cudaError_t e = cudaEventSynchronize(e1); e != cudaSuccess) return Error{cuda_error_text(e, "GEMM tuning")};
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (rep > 0) best = std::min(best, ms);
    }
    return best;
  };
  int limit = 0;
  for (int n = 1; n <= kGemvMaxTokens; ++n) {
    auto t_gemv = time([&]() -> Status {
      gemv(dtype, w, x, n, rows, cols, y, false, ctx_.stream());
      return Status::Ok();
    });
    auto t_blas = time([&]() { return run(dtype, w, x, n, rows, cols, y, false); });
    if (!t_gemv.ok()) return t_gemv.error();
    if (!t_blas.ok()) return t_blas.error();
    if (*t_gemv > *t_blas) break;
    limit = n;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  gemv_max_[static_cast<uint64_t>(rows) << 32 | static_cast<uint64_t>(cols)] = limit;
  return Status::Ok();
}

Status Gemm::matmul(DType dtype, const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y,
                    bool accumulate) {
  if (gemv_supported(dtype, cols) && (dtype == DType::kF32 || n <= gemv_max_tokens(rows, cols))) {
    gemv(dtype, w, x, n, rows, cols, y, accumulate, ctx_.stream());
    return Status::Ok();
  }
  return run(dtype, w, x, n, rows, cols, y, accumulate);
}

}  // namespace rill::cuda
