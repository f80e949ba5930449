// quant_matmul: the GEMV from the blocks (or the int8 paths) for
// decode-sized token counts, else dequantize-to-scratch then cuBLASLt
// (see quant.h).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/fp8.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/q8_dp4a_order.h"
#include "backend/cuda/quant.h"

namespace rill::cuda {
namespace {

// Whether quant_matmul takes the int8 path (quant.h) for this call, batch
// invariance apart.
bool int8_path(const QuantScratch& scratch, DType w_dtype, const void* w, DType x_dtype, int64_t n_tokens,
               int64_t n_rows, int64_t n_cols) {
  static const bool off = [] {
    const char* e = std::getenv("RILL_CUDA_QUANT_MMA");
    return e != nullptr && std::strcmp(e, "0") == 0;
  }();
  return !off && (n_tokens <= kInt8PathMaxTokens || quant_mmq_eligible(w_dtype, w, n_tokens, n_rows, n_cols)) &&
         quant_mma_supported(w_dtype) && !(w_dtype == DType::kQ8_0 && n_tokens == 1) &&
         (x_dtype == DType::kF32 || x_dtype == DType::kBF16) && scratch.xq != nullptr &&
         quantized_x_bytes(n_tokens, n_cols) <= scratch.xq_bytes;
}

// Whether quant_matmul takes the Q8_0 dp4a GEMV (quant.h) for this call,
// batch invariance apart.
bool dp4a_path(const QuantScratch& scratch, DType w_dtype, DType x_dtype, int64_t n_tokens, int64_t n_cols) {
  return w_dtype == DType::kQ8_0 && n_tokens <= kQ8Dp4aMaxTokens && q8_dp4a_on() &&
         (x_dtype == DType::kF32 || x_dtype == DType::kBF16) && scratch.xq != nullptr &&
         quantized_x_bytes(n_tokens, n_cols) <= scratch.xq_bytes;
}

}  // namespace

bool q8_dp4a_on() {
  static const bool on = [] {
    const char* e = std::getenv("RILL_Q8_DP4A");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

void QuantScratch::carve(Arena& a, DType act, int64_t max_tokens, int64_t max_elems, int64_t head_rows,
                         int64_t head_cols, int64_t max_head_tokens, bool batch_invariant, int64_t max_cols) {
  const bool float_x = act == DType::kF32 || act == DType::kBF16;
  const int64_t mma_tokens = std::min(std::max(max_tokens, max_head_tokens), kMmaMaxTokens);
  xq_bytes = !batch_invariant && float_x && max_cols > 0 ? quantized_x_bytes(mma_tokens, max_cols) : 0;
  xq = a.take<uint8_t>(xq_bytes);
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
  if (!invariant && dp4a_path(scratch, w_dtype, x_dtype, n_tokens, n_cols)) {
    quantize_x8(x_dtype, x, n_tokens, n_cols, scratch.xq, stream);
    q8_dp4a_gemv(Q8Layout::kGguf, w, scratch.xq, n_tokens, n_rows, n_cols, y, n_rows, accumulate, stream);
    return Status::Ok();
  }
  if (!invariant && int8_path(scratch, w_dtype, w, x_dtype, n_tokens, n_rows, n_cols)) {
    quantize_x8(x_dtype, x, n_tokens, n_cols, scratch.xq, stream);
    quant_mma(w_dtype, w, scratch.xq, n_tokens, n_rows, n_cols, y, n_rows, accumulate, stream);
    return Status::Ok();
  }
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

Status quant_matmul_parts(Gemm& gemm, const QuantScratch& scratch, const QuantPart* parts, int n_parts, DType x_dtype,
                          const void* x, int64_t n_tokens, int64_t n_cols, float* y, bool accumulate,
                          cudaStream_t stream) {
  int64_t n_rows = 0;
  bool all_int8 = true;
  for (int i = 0; i < n_parts; ++i) {
    n_rows += parts[i].rows;
    all_int8 =
        all_int8 && (int8_path(scratch, parts[i].dtype, parts[i].data, x_dtype, n_tokens, parts[i].rows, n_cols) ||
                     dp4a_path(scratch, parts[i].dtype, x_dtype, n_tokens, n_cols));
  }
  if (n_tokens <= 0 || n_rows <= 0) return Status::Ok();
  const bool invariant = gemm.batch_invariant();
  if (!invariant && all_int8) {
    quantize_x8(x_dtype, x, n_tokens, n_cols, scratch.xq, stream);
    for (int64_t i = 0, r0 = 0; i < n_parts; r0 += parts[i].rows, ++i) {
      if (dp4a_path(scratch, parts[i].dtype, x_dtype, n_tokens, n_cols)) {
        q8_dp4a_gemv(Q8Layout::kGguf, parts[i].data, scratch.xq, n_tokens, parts[i].rows, n_cols, y + r0, n_rows,
                     accumulate, stream);
      } else {
        quant_mma(parts[i].dtype, parts[i].data, scratch.xq, n_tokens, parts[i].rows, n_cols, y + r0, n_rows,
                  accumulate, stream);
      }
    }
    return Status::Ok();
  }
  if (!invariant && n_tokens <= kGemvMaxTokens && (x_dtype == DType::kF32 || x_dtype == DType::kBF16)) {
    for (int64_t i = 0, r0 = 0; i < n_parts; r0 += parts[i].rows, ++i) {
      quant_gemv(parts[i].dtype, parts[i].data, x_dtype, x, n_tokens, parts[i].rows, n_cols, y + r0, accumulate, stream,
                 n_rows);
    }
    return Status::Ok();
  }
  if (scratch.w_elems < n_rows * n_cols) {
    return Error{"quantized matmul of " + std::to_string(n_tokens) + " x " + std::to_string(n_rows) + " x " +
                 std::to_string(n_cols) + " in " + std::to_string(n_parts) +
                 " parts: the dequantization scratch does not hold the matrix"};
  }
  const size_t es = x_dtype == DType::kF32 ? 4 : 2;
  for (int64_t i = 0, r0 = 0; i < n_parts; r0 += parts[i].rows, ++i) {
    dequantize_rows(parts[i].dtype, parts[i].data, n_cols, 0, parts[i].rows, x_dtype,
                    static_cast<uint8_t*>(scratch.w) + static_cast<size_t>(r0 * n_cols) * es, stream);
  }
  if (invariant) return gemm.matmul(x_dtype, scratch.w, x, n_tokens, n_rows, n_cols, y, accumulate);
  return gemm.run(x_dtype, scratch.w, x, n_tokens, n_rows, n_cols, y, accumulate);
}

}  // namespace rill::cuda
