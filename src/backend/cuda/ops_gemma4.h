#pragma once
// Gemma 4's CUDA ops (ops_gemma.cu), in a header of their own so the
// kernels that include ops.h do not depend on them.
#include <cstdint>

#include <cuda_runtime.h>

#include "core/dtype.h"

namespace rill::cuda {

// out[r, i] = act(gate[r, i]) * up[r, i] over [n_rows, n_ff] (gelu: the
// tanh GELU, else silu), gate and up f32 rows gate_stride / up_stride floats
// apart, out dense in out_dtype (Gemma 4's per-layer input gate).
void glu_split(bool gelu, const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, int64_t n_rows,
               int64_t n_ff, DType out_dtype, void* out, cudaStream_t stream);

// In place over rows of x (stride floats apart): the n_heads heads of
// head_dim floats from column col0 RMS-normed without a weight, as
// cpu::rms_norm with a null weight (Gemma 4's V norm, before the KV store).
void head_rms_norm(float* x, int64_t stride, int64_t n_rows, int64_t col0, int32_t n_heads, int32_t head_dim, float eps,
                   cudaStream_t stream);

}  // namespace rill::cuda
