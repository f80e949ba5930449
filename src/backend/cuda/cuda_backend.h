#pragma once
// The CUDA Backend (backend/backend.h) over today's CUDA kernels
// (backend/cuda/ops.h, quant.h), stream and GEMM (gemm.h). Every op launches
// on the backend's one stream and never synchronizes, so a step is
// graph-capturable. Matmul inputs are in `act` (F32, F16 or BF16); weights
// are placed in act, or kept in their GGUF blocks where the kernels read
// them (cuda::quant_supported). place_model() puts a whole model into one
// device buffer.
#include <cstdint>
#include <memory>

#include "backend/backend.h"

namespace rill {
namespace cuda {
class Arena;
class Context;
class Gemm;
}  // namespace cuda

struct CudaBackendOptions {
  DType act = DType::kBF16;
  // ModelOptions::batch_invariant (model/cuda_model_base.h): every matmul
  // through the invariant GEMM, every token through split-KV decode attention.
  bool batch_invariant = false;
  int device = 0;
  // ModelOptions::quantize == kFp8: every F32/F16/BF16 matrix placed as e4m3
  // with a scale per row (fp8.h), except gathered ones (embedding tables).
  bool fp8_weights = false;
};

// A Backend with a device context and GEMM of its own. Errors where no
// device can be used or act is not F32/F16/BF16.
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options);

// How many norm_matmul / norm_matmul_glu calls of this process's CUDA
// backends took the FP8 norm that quantizes (rms_norm_fp8): tests only.
int64_t cuda_fused_norm_quant_calls();

// For a CUDA runtime (model/cuda_model_base.h): a Backend on the runtime's
// context (its device and stream) and GEMM, neither owned (both must
// outlive it; the GEMM's batch-invariant mode is set to options'). Its
// scratch comes from the runtime's activation arena (carve_cuda_scratch)
// rather than reserve(). options.device is unused.
Result<std::unique_ptr<Backend>> make_cuda_backend_on(cuda::Context& ctx, cuda::Gemm& gemm,
                                                      const CudaBackendOptions& options);
// Carves what reserve(limits) would allocate from `arena` (sizing pass
// included, cuda::Arena's two-pass use), against the weights placed so far.
// backend: one of the above.
// k4c KV (backend/cuda/kv_chan_step.h), where the runtime's KV is k4c:
// the widest K row (n_head_kv * head_dim) and the most keys a query reads
// (the context); the backend then also carves the step's q8_0 rows, the
// step plan and the reference attention's scores: at most max_score_floats
// floats, the attention going in chunks of tokens (a query's scores take
// n_head * max_keys floats; at least one query a chunk).
struct CudaChanLimits {
  int64_t max_width = 0;
  int64_t max_keys = 0;
  size_t max_score_floats = size_t{64} << 20;
};
void carve_cuda_scratch(Backend& backend, cuda::Arena& arena, const StepLimits& limits,
                        const CudaChanLimits& chan = {});

}  // namespace rill
