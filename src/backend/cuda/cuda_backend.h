#pragma once
// The CUDA Backend (backend/backend.h) over today's CUDA kernels
// (backend/cuda/ops.h, quant.h), stream and GEMM (gemm.h). Every op launches
// on the backend's one stream and never synchronizes, so a step is
// graph-capturable. Matmul inputs are in `act` (F32, F16 or BF16); weights
// are placed in act, or kept in their GGUF blocks where the kernels read
// them (cuda::quant_supported).
#include <memory>

#include "backend/backend.h"

namespace rill {

struct CudaBackendOptions {
  DType act = DType::kBF16;
  // ModelOptions::batch_invariant (model/cuda_model_base.h): every matmul
  // through the invariant GEMM, every token through split-KV decode attention.
  bool batch_invariant = false;
  int device = 0;
};

// Errors where no device can be used or act is not F32/F16/BF16.
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options);

}  // namespace rill
