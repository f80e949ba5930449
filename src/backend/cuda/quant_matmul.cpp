// quant_matmul: the GEMV from the blocks for decode-sized token counts,
// else dequantize-to-scratch then cuBLASLt (see quant.h).
#include <algorithm>
#include <string>

#include "backend/cuda/fp8.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/quant.h"

namespace rill::cuda {

void QuantScratch::carve(Arena& a, DType act, int64_t max_tokens, int64_t max_elems, int64_t head_rows,
                         int64_t head_cols, int64_t max_head_tokens, bool batch_invariant) {
  const int64_t gemv_max = !batch_invariant && (act == DType::kF32 || act == DType::kBF16) ? kGemvMaxTokens : 0;
  w_elems = max_tokens > gemv_max ? max_elems : 0;
  y_floats = 0;
  if (head_rows > 0 && max_head_tokens > gemv_max) {
    const int64_t head = head_rows * head_cols, cap = std::max(w_elems, kQuantChunkElems);
    if (head <= cap) {
      w_elems = std::max(w_elems, head);
    } else {
      w_elems = cap;
      y_floats = max_head_tokens * (cap / head_cols);
    }
  }
  w = a.take<uint8_t>(static_cast<size_t>(w_elems) * (act == DType::kF32 ? 4 : 2));
  y = a.take<float>(static_cast<size_t>(y_floats));
}

Status quant_matmul(Gemm& gemm, const QuantScratch& scratch, DType w_dtype, const void* w, DType x_dtype, const void* x,
                    int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y, bool accumulate, cudaStream_t stream) {
  if (n_tokens <= 0 || n_rows <= 0) return Status::Ok();
  // Batch-invariant mode: never the block GEMV (its order differs from the
  // GEMM's); always dequantize, then gemm.matmul's invariant kernel.
  const bool invariant = gemm.batch_invariant();
  if (!invariant && n_tokens <= kGemvMaxTokens && (x_dtype == DType::kF32 || x_dtype == DType::kBF16)) {
    quant_gemv(w_dtype, w, x_dtype, x, n_tokens, n_rows, n_cols, y, accumulate, stream);
    return Status::Ok();
  }
  const int64_t chunk = std::min(n_rows, scratch.w_elems / n_cols);
  if (chunk <= 0 || (chunk < n_rows && n_tokens * chunk > scratch.y_floats)) {
    return Error{"quantized matmul of " + std::to_string(n_tokens) + " x " + std::to_string(n_rows) + " x " +
                 std::to_string(n_cols) + " (" +
                 (w_dtype == kFp8Rows ? std::string("FP8 e4m3") : std::string(dtype_name(w_dtype))) +
                 "): the dequantization scratch was planned for fewer elements or tokens"};
  }
  if (chunk == n_rows) {
    dequantize_rows(w_dtype, w, n_cols, 0, n_rows, x_dtype, scratch.w, stream);
    if (invariant) return gemm.matmul(x_dtype, scratch.w, x, n_tokens, n_rows, n_cols, y, accumulate);
    return gemm.run(x_dtype, scratch.w, x, n_tokens, n_rows, n_cols, y, accumulate);
  }
  // A matrix larger than the scratch (the LM head): row chunks, each
  // multiplied into scratch.y and added into its columns of y.
  for (int64_t r0 = 0; r0 < n_rows; r0 += chunk) {
    const int64_t rc = std::min(chunk, n_rows - r0);
    dequantize_rows(w_dtype, w, n_cols, r0, rc, x_dtype, scratch.w, stream);
    RILL_TRY(invariant ? gemm.matmul(x_dtype, scratch.w, x, n_tokens, rc, n_cols, scratch.y, false)
                       : gemm.run(x_dtype, scratch.w, x, n_tokens, rc, n_cols, scratch.y, false));
    add_columns(scratch.y, n_tokens, rc, y, n_rows, r0, accumulate, stream);
  }
  return Status::Ok();
}

}  // namespace rill::cuda
