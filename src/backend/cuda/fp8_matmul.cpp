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

bool x_fits_scratch(const Fp8Scratch& fp8, int64_t n_tokens, int64_t n_cols) {
  return fp8.xq && n_tokens <= fp8.max_tokens && n_tokens * n_cols <= fp8.x_elems;
}

}  // namespace

Fp8Route fp8_route(Gemm& gemm, const Fp8Scratch& fp8, DType x_dtype, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
                   bool glu) {
  if (n_tokens <= 0 || n_rows <= 0) return Fp8Route::kNone;
  const bool invariant = gemm.batch_invariant();
  if (glu && (n_rows % 2 != 0 || invariant)) return Fp8Route::kNone;
  if (!invariant && mma_path(fp8, n_tokens, n_rows, n_cols, glu)) {
    return fp8_mma_bf16x_on() && x_dtype == DType::kBF16 ? Fp8Route::kMmaBf16x : Fp8Route::kMma;
  }
  // cuBLASLt is asked about the shape (a plan made and kept per shape)
  // only where the answer decides the route, as before fp8_route.
  const int64_t w_ld = static_cast<int64_t>(fp8_row_bytes(n_cols));
  auto gemm_ok = [&] { return gemm.fp8_gemm_supported(n_tokens, n_rows, n_cols, w_ld); };
  const bool x_gemv = x_dtype == DType::kF32 || x_dtype == DType::kBF16;
  if (glu) {
    // The GEMM's scale pass moves into the GLU: not with Gemm's bf16 D or
    // cuBLASLt's outer-vector scales (no separate pass), not where one token
    // takes the GEMV.
    if (gemm.fp8_bf16_d() || (n_tokens == 1 && x_gemv)) return Fp8Route::kNone;
    return x_fits_scratch(fp8, n_tokens, n_cols) && gemm_ok() &&
                   !gemm.fp8_gemm_outer_scales(n_tokens, n_rows, n_cols, w_ld)
               ? Fp8Route::kGemm
               : Fp8Route::kNone;
  }
  if (invariant) return Fp8Route::kDequant;
  // The GEMV for one token only: from two tokens on cuBLASLt's FP8 GEMM is
  // as fast or faster on the H200 (at eight, 3-4x: the GEMV's f32 FMAs per
  // weight grow with the tokens; docs/perf.md), as bf16 does.
  if (n_tokens <= kGemvMaxTokens && x_gemv && (n_tokens == 1 || !gemm_ok())) return Fp8Route::kGemv;
  if (x_fits_scratch(fp8, n_tokens, n_cols) && gemm_ok()) return Fp8Route::kGemm;
  return Fp8Route::kDequant;
}

bool fp8_quantizes_x(Gemm& gemm, const Fp8Scratch& fp8, DType x_dtype, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
                     bool glu) {
  const Fp8Route r = fp8_route(gemm, fp8, x_dtype, n_tokens, n_rows, n_cols, glu);
  return r == Fp8Route::kMma || r == Fp8Route::kGemm;
}

bool fp8_glu_fusable(Gemm& gemm, const Fp8Scratch& fp8, DType x_dtype, int64_t n_tokens, int64_t n_rows,
                     int64_t n_cols) {
  return fp8_route(gemm, fp8, x_dtype, n_tokens, n_rows, n_cols, true) != Fp8Route::kNone;
}

Status fp8_matmul(Gemm& gemm, const QuantScratch& scratch, const Fp8Scratch& fp8, const void* w, DType x_dtype,
                  const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y, bool accumulate,
                  cudaStream_t stream, bool x_quantized) {
  const Fp8Route route = fp8_route(gemm, fp8, x_dtype, n_tokens, n_rows, n_cols, false);
  assert(!x_quantized || route == Fp8Route::kMma || route == Fp8Route::kGemm);
  const auto* wb = static_cast<const uint8_t*>(w);
  switch (route) {
    case Fp8Route::kNone:
      return Status::Ok();
    case Fp8Route::kMmaBf16x:
      fp8_mma_bf16x(wb, x, n_tokens, n_rows, n_cols, y, accumulate, fp8.mma_part, fp8.mma_part_floats, stream);
      return Status::Ok();
    case Fp8Route::kMma:
      if (!x_quantized) quantize_fp8_tokens(x_dtype, x, n_tokens, n_cols, fp8.xq, fp8.xs, stream);
      fp8_mma(wb, fp8.xq, fp8.xs, n_tokens, n_rows, n_cols, y, accumulate, fp8.mma_part, fp8.mma_part_floats, stream);
      return Status::Ok();
    case Fp8Route::kGemv:
      fp8_gemv(wb, x_dtype, x, n_tokens, n_rows, n_cols, y, accumulate, stream);
      return Status::Ok();
    case Fp8Route::kGemm:
      if (!x_quantized) quantize_fp8_tokens(x_dtype, x, n_tokens, n_cols, fp8.xq, fp8.xs, stream);
      return gemm.run_fp8(wb + kFp8RowHeader, static_cast<int64_t>(fp8_row_bytes(n_cols)),
                          fp8_scales(w, n_rows, n_cols), fp8.xq, fp8.xs, n_tokens, n_rows, n_cols, y, accumulate, fp8.d,
                          fp8.d_floats);
    case Fp8Route::kDequant:
      break;
  }
  return quant_matmul(gemm, scratch, kFp8Rows, w, x_dtype, x, n_tokens, n_rows, n_cols, y, accumulate, stream);
}

Status fp8_matmul_glu(Gemm& gemm, const Fp8Scratch& fp8, const void* w, DType x_dtype, const void* x, int64_t n_tokens,
                      int64_t n_rows, int64_t n_cols, bool gelu, float* gate_up, DType out_dtype, void* out,
                      cudaStream_t stream, bool x_quantized) {
  const Fp8Route route = fp8_route(gemm, fp8, x_dtype, n_tokens, n_rows, n_cols, true);
  assert(route != Fp8Route::kNone);
  assert(!x_quantized || route == Fp8Route::kMma || route == Fp8Route::kGemm);
  // fp8_matmul's fp8_mma path: the scales and the GLU in its epilogue
  // (gate_up unused), the same sums in the same order as fp8_mma over the
  // whole weight (the same plan: ceil(2 F / 128) = ceil(F / 64) slabs).
  if (route == Fp8Route::kMma || route == Fp8Route::kMmaBf16x) {
    if (route == Fp8Route::kMmaBf16x) {
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
