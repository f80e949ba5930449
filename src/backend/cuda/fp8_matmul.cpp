// fp8_matmul: the FP8 weights' path by token count (fp8.h).
#include <algorithm>
#include <cassert>

#include "backend/cuda/fp8.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"

namespace rill::cuda {

void Fp8Scratch::carve(Arena& a, int64_t tokens, int64_t max_cols) {
  max_tokens = tokens;
  x_elems = tokens * max_cols;
  xq = a.take<uint8_t>(static_cast<size_t>(x_elems));
  xs = a.take<float>(static_cast<size_t>(tokens));
  // Without outer-vector scales, accumulating GEMMs go in chunks of 4,096
  // rows (f32 D) and, with Gemm's bf16 D, every GEMM in chunks of up to
  // 8,192 rows (2 x d_floats / n, whole 16s: more for steps of fewer tokens).
  d_floats = tokens * 4096;
  d = a.take<float>(static_cast<size_t>(d_floats));
  // fp8_mma's split-K sums: a split shape has fewer slabs (128 rows) than
  // SMs and about one block per SM, so parts x rows < 2 x SMs x 128; 40,960
  // rows cover 160 SMs (10.5 MB at 64 tokens).
  mma_part_floats = fp8_mma_on() ? std::min(tokens, kFp8MmaMaxTokens) * 40960 : 0;
  mma_part = a.take<float>(static_cast<size_t>(mma_part_floats));
}

namespace {

// Whether fp8_matmul (glu: fp8_matmul_glu) takes fp8_mma, batch invariance
// apart: the switch on, fp8_mma_tokens() tokens (2..kFp8MmaMaxTokens by
// default; one token stays with the GEMV), the scratch large enough.
bool mma_path(const Fp8Scratch& fp8, int64_t n_tokens, int64_t n_rows, int64_t n_cols, bool glu) {
  return fp8_mma_on() && n_tokens >= fp8_mma_tokens().lo && n_tokens <= fp8_mma_tokens().hi && fp8_cols_ok(n_cols) &&
         fp8.xq && n_tokens <= fp8.max_tokens && n_tokens * n_cols <= fp8.x_elems &&
         fp8_mma_part_floats(n_tokens, n_rows, n_cols, glu) <= fp8.mma_part_floats;
}

}  // namespace

bool fp8_quantizes_x(Gemm& gemm, const Fp8Scratch& fp8, DType x_dtype, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
                     bool glu) {
  if (n_tokens <= 0 || n_rows <= 0 || gemm.batch_invariant()) return false;
  if (mma_path(fp8, n_tokens, n_rows, n_cols, glu)) return !(fp8_mma_bf16x_on() && x_dtype == DType::kBF16);
  if (glu) return fp8_glu_fusable(gemm, fp8, x_dtype, n_tokens, n_rows, n_cols);
  const int64_t w_ld = static_cast<int64_t>(fp8_row_bytes(n_cols));
  const bool gemm_ok = gemm.fp8_gemm_supported(n_tokens, n_rows, n_cols, w_ld);
  if ((n_tokens == 1 || !gemm_ok) && n_tokens <= kGemvMaxTokens && (x_dtype == DType::kF32 || x_dtype == DType::kBF16))
    return false;  // the GEMV
  return fp8.xq && n_tokens <= fp8.max_tokens && n_tokens * n_cols <= fp8.x_elems && gemm_ok;
}

Status fp8_matmul(Gemm& gemm, const QuantScratch& scratch, const Fp8Scratch& fp8, const void* w, DType x_dtype,
                  const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y, bool accumulate,
                  cudaStream_t stream, bool x_quantized) {
  if (n_tokens <= 0 || n_rows <= 0) return Status::Ok();
  assert(!x_quantized || fp8_quantizes_x(gemm, fp8, x_dtype, n_tokens, n_rows, n_cols, false));
  const bool invariant = gemm.batch_invariant();
  const int64_t w_ld = static_cast<int64_t>(fp8_row_bytes(n_cols));
  if (!invariant && mma_path(fp8, n_tokens, n_rows, n_cols, false)) {
    if (fp8_mma_bf16x_on() && x_dtype == DType::kBF16) {
      fp8_mma_bf16x(static_cast<const uint8_t*>(w), x, n_tokens, n_rows, n_cols, y, accumulate, fp8.mma_part,
                    fp8.mma_part_floats, stream);
      return Status::Ok();
    }
    if (!x_quantized) quantize_fp8_tokens(x_dtype, x, n_tokens, n_cols, fp8.xq, fp8.xs, stream);
    fp8_mma(static_cast<const uint8_t*>(w), fp8.xq, fp8.xs, n_tokens, n_rows, n_cols, y, accumulate, fp8.mma_part,
            fp8.mma_part_floats, stream);
    return Status::Ok();
  }
  // The GEMV for one token only: from two tokens on cuBLASLt's FP8 GEMM is
  // as fast or faster on the H200 (at eight, 3-4x: the GEMV's f32 FMAs per
  // weight grow with the tokens; docs/perf.md), as bf16 does.
  if (!invariant && (n_tokens == 1 || !gemm.fp8_gemm_supported(n_tokens, n_rows, n_cols, w_ld)) &&
      n_tokens <= kGemvMaxTokens && (x_dtype == DType::kF32 || x_dtype == DType::kBF16)) {
    fp8_gemv(static_cast<const uint8_t*>(w), x_dtype, x, n_tokens, n_rows, n_cols, y, accumulate, stream);
    return Status::Ok();
  }
  if (!invariant && fp8.xq && n_tokens <= fp8.max_tokens && n_tokens * n_cols <= fp8.x_elems &&
      gemm.fp8_gemm_supported(n_tokens, n_rows, n_cols, w_ld)) {
    if (!x_quantized) quantize_fp8_tokens(x_dtype, x, n_tokens, n_cols, fp8.xq, fp8.xs, stream);
    return gemm.run_fp8(static_cast<const uint8_t*>(w) + kFp8RowHeader, w_ld, fp8_scales(w, n_rows, n_cols), fp8.xq,
                        fp8.xs, n_tokens, n_rows, n_cols, y, accumulate, fp8.d, fp8.d_floats);
  }
  return quant_matmul(gemm, scratch, kFp8Rows, w, x_dtype, x, n_tokens, n_rows, n_cols, y, accumulate, stream);
}

bool fp8_glu_fusable(Gemm& gemm, const Fp8Scratch& fp8, DType x_dtype, int64_t n_tokens, int64_t n_rows,
                     int64_t n_cols) {
  if (n_tokens <= 0 || n_rows <= 0 || n_rows % 2 != 0 || gemm.batch_invariant()) return false;
  if (mma_path(fp8, n_tokens, n_rows, n_cols, true)) return true;  // fp8_mma_glu
  if (gemm.fp8_bf16_d()) return false;
  // fp8_matmul's GEMV for one token (its other GEMV case, no GEMM for the
  // shape, is excluded below).
  if (n_tokens == 1 && (x_dtype == DType::kF32 || x_dtype == DType::kBF16)) return false;
  const int64_t w_ld = static_cast<int64_t>(fp8_row_bytes(n_cols));
  return fp8.xq && n_tokens <= fp8.max_tokens && n_tokens * n_cols <= fp8.x_elems &&
         gemm.fp8_gemm_supported(n_tokens, n_rows, n_cols, w_ld) &&
         !gemm.fp8_gemm_outer_scales(n_tokens, n_rows, n_cols, w_ld);
}

Status fp8_matmul_glu(Gemm& gemm, const Fp8Scratch& fp8, const void* w, DType x_dtype, const void* x, int64_t n_tokens,
                      int64_t n_rows, int64_t n_cols, bool gelu, float* gate_up, DType out_dtype, void* out,
                      cudaStream_t stream, bool x_quantized) {
  assert(!x_quantized || fp8_quantizes_x(gemm, fp8, x_dtype, n_tokens, n_rows, n_cols, true));
  // fp8_matmul's fp8_mma path: the scales and the GLU in its epilogue
  // (gate_up unused), the same sums in the same order as fp8_mma over the
  // whole weight (the same plan: ceil(2 F / 128) = ceil(F / 64) slabs).
  if (!gemm.batch_invariant() && mma_path(fp8, n_tokens, n_rows, n_cols, true)) {
    if (fp8_mma_bf16x_on() && x_dtype == DType::kBF16) {
      fp8_mma_glu_bf16x(static_cast<const uint8_t*>(w), x, n_tokens, n_rows, n_cols, gelu, out_dtype, out, fp8.mma_part,
                        fp8.mma_part_floats, stream);
      return Status::Ok();
    }
    if (!x_quantized) quantize_fp8_tokens(x_dtype, x, n_tokens, n_cols, fp8.xq, fp8.xs, stream);
    fp8_mma_glu(static_cast<const uint8_t*>(w), fp8.xq, fp8.xs, n_tokens, n_rows, n_cols, gelu, out_dtype, out,
                fp8.mma_part, fp8.mma_part_floats, stream);
    return Status::Ok();
  }
  // fp8_matmul's GEMM path up to its scale pass (Gemm::run_fp8 not
  // accumulating, no outer scales): the same quantized x, the same plan.
  const int64_t w_ld = static_cast<int64_t>(fp8_row_bytes(n_cols));
  if (!x_quantized) quantize_fp8_tokens(x_dtype, x, n_tokens, n_cols, fp8.xq, fp8.xs, stream);
  RILL_TRY(gemm.run_fp8_unscaled(static_cast<const uint8_t*>(w) + kFp8RowHeader, w_ld, fp8.xq, n_tokens, n_rows, n_cols,
                                 gate_up));
  fp8_scale_glu(gate_up, n_tokens, n_rows / 2, fp8.xs, fp8_scales(w, n_rows, n_cols), gelu, out_dtype, out, stream);
  return Status::Ok();
}

}  // namespace rill::cuda
