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

// out[t] = pos[t] + offset for t < n (RopeKvOp::pos_offset: the rotation's
// positions of Gemma 4's assistant's queries).
void shift_positions(const int32_t* pos, int64_t n, int32_t offset, int32_t* out, cudaStream_t stream);

// out[r, c] = x[r, c] in out_dtype over [rows, cols]; x f32 rows x_stride
// floats apart, out rows out_stride elements apart (a column range of a
// wider matrix: Gemma 4's assistant's input halves).
void convert_f32_rows(const float* x, int64_t x_stride, int64_t rows, int64_t cols, DType out_dtype, void* out,
                      int64_t out_stride, cudaStream_t stream);

// Backend::ordered_logits (backend/backend.h OrderedLogitsOp) over n rows
// (ordered_logits.cu): hidden [n, E] f32, scores [n, C] f32, head [V, E]
// in head_dtype (F32, F16 or BF16), token_ordering [V]; picked and dots
// [n, top_k V/C] scratch; logits [n, V] f32. C at most kMaxOrderedGroups.
inline constexpr int32_t kMaxOrderedGroups = 8192;
void ordered_logits(const float* hidden, const float* scores, DType head_dtype, const void* head, int64_t n, int64_t E,
                    int64_t V, int32_t n_centroids, int32_t top_k, const int32_t* token_ordering, int32_t* picked,
                    float* dots, float* logits, cudaStream_t stream);

}  // namespace rill::cuda
