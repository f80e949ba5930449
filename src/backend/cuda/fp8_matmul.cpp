// fp8_matmul: the FP8 weights' path by token count (fp8.h).
#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/fp8.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/hopper/gemm_stream.h"
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

std::atomic<int> g_force_stream{-1};
constexpr int64_t kFp8StreamDefaultTokens = 64;

// gemm_stream's e4m3 call for fp8_matmul's shape (ws / xs null: unscaled).
// Its configuration follows from the shape alone: one block an SM with the
// deep ring (variant 1), the columns split in two where the row slabs alone
// give fewer than 96 blocks (the 8B's qkv, o and down; gate_up and the head
// whole). On the H100's FP8 timings (docs/perf.md, 2026-12-07) that was the
// best of the 12 configurations or within 6% of it for every 8B shape at 8,
// 64 and 128 tokens (the timed route took two blocks an SM, v0, then).
GemmStreamArgs stream_args(const uint8_t* w, const Fp8Scratch& fp8, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
                           void* y, bool accumulate, bool scaled) {
  GemmStreamArgs a;
  a.e4m3 = true;
  a.w = w + kFp8RowHeader;
  a.w_ld = static_cast<int64_t>(fp8_row_bytes(n_cols));
  a.x = fp8.xq;
  a.ws = scaled ? fp8_scales(w, n_rows, n_cols) : nullptr;
  a.xs = scaled ? fp8.xs : nullptr;
  a.n = n_tokens;
  a.rows = n_rows;
  a.cols = n_cols;
  a.y = y;
  a.accumulate = accumulate;
  a.w_stable = true;  // placed FP8 weights: never written by a kernel
  const int64_t slabs = (n_rows + 127) / 128, chunks = (n_cols + 127) / 128;
  a.splits = slabs < 96 && chunks >= 2 ? 2 : 1;
  a.variant = 1;
  // Comparisons: RILL_FP8_STREAM_SPLITS=1|2|4|8 and RILL_FP8_STREAM_VARIANT=0|1|2
  // fix them for every shape that takes them.
  static const int forced_splits = [] {
    const char* e = std::getenv("RILL_FP8_STREAM_SPLITS");
    return e ? std::atoi(e) : 0;
  }();
  static const int forced_variant = [] {
    const char* e = std::getenv("RILL_FP8_STREAM_VARIANT");
    return e ? std::atoi(e) : -1;
  }();
  if (forced_splits > 0 && forced_splits <= chunks) a.splits = forced_splits;
  if (forced_variant >= 0 && forced_variant < kGemmStreamVariants) a.variant = forced_variant;
  return a;
}

bool stream_path(const Fp8Scratch& fp8, int64_t n_tokens, int64_t n_rows, int64_t n_cols) {
  if (n_tokens < 2 || n_tokens > fp8_stream_max_tokens() || !fp8_cols_ok(n_cols) ||
      !x_fits_scratch(fp8, n_tokens, n_cols)) {
    return false;
  }
  // The pointers' alignment is checked at the call (all 16-byte here:
  // rows of 16 + n_cols bytes, arena scratch); the shape's here.
  static const uint8_t probe[16] alignas(16) = {};
  GemmStreamArgs a = stream_args(probe, fp8, n_tokens, n_rows, n_cols, const_cast<uint8_t*>(probe), false, false);
  a.w = probe;
  return gemm_stream_supported(a) && gemm_stream_available();
}

}  // namespace

int64_t fp8_stream_max_tokens() {
  const int forced = g_force_stream.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1 ? kGemmStreamMaxTokens : 0;
  static const int64_t most = [] {
    const char* e = std::getenv("RILL_FP8_STREAM");
    if (e == nullptr) return kFp8StreamDefaultTokens;
    if (std::strcmp(e, "1") == 0) return kGemmStreamMaxTokens;
    if (std::strcmp(e, "0") == 0) return int64_t{0};
    std::fprintf(stderr, "RILL_FP8_STREAM=%s: expected 0 or 1; keeping the default (2..64 tokens)\n", e);
    return kFp8StreamDefaultTokens;
  }();
  return most;
}

void force_fp8_stream(int on) {
  g_force_stream.store(on < 0 ? -1 : on != 0 ? 1 : 0, std::memory_order_relaxed);
}

Fp8Route fp8_route(Gemm& gemm, const Fp8Scratch& fp8, DType x_dtype, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
                   bool glu) {
  if (n_tokens <= 0 || n_rows <= 0) return Fp8Route::kNone;
  const bool invariant = gemm.batch_invariant();
  if (glu && (n_rows % 2 != 0 || invariant)) return Fp8Route::kNone;
  // gemm_stream's FP8 products add up in the tensor cores' own precision,
  // as cuBLASLt's with fast accumulation: only where Gemm's FP8 plans have it.
  if (!invariant && gemm.fp8_fast_accum() && stream_path(fp8, n_tokens, n_rows, n_cols)) return Fp8Route::kStream;
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
  return r == Fp8Route::kStream || r == Fp8Route::kMma || r == Fp8Route::kGemm;
}

bool fp8_glu_fusable(Gemm& gemm, const Fp8Scratch& fp8, DType x_dtype, int64_t n_tokens, int64_t n_rows,
                     int64_t n_cols) {
  return fp8_route(gemm, fp8, x_dtype, n_tokens, n_rows, n_cols, true) != Fp8Route::kNone;
}

Status fp8_matmul(Gemm& gemm, const QuantScratch& scratch, const Fp8Scratch& fp8, const void* w, DType x_dtype,
                  const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y, bool accumulate,
                  cudaStream_t stream, bool x_quantized) {
  const Fp8Route route = fp8_route(gemm, fp8, x_dtype, n_tokens, n_rows, n_cols, false);
  assert(!x_quantized || route == Fp8Route::kStream || route == Fp8Route::kMma || route == Fp8Route::kGemm);
  const auto* wb = static_cast<const uint8_t*>(w);
  switch (route) {
    case Fp8Route::kNone:
      return Status::Ok();
    case Fp8Route::kStream:
      if (!x_quantized) quantize_fp8_tokens(x_dtype, x, n_tokens, n_cols, fp8.xq, fp8.xs, stream);
      if (!gemm_stream(stream_args(wb, fp8, n_tokens, n_rows, n_cols, y, accumulate, true), stream)) {
        return Error{"FP8 matmul: gemm_stream refused " + std::to_string(n_tokens) + " x " + std::to_string(n_rows) +
                     " x " + std::to_string(n_cols)};
      }
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
  assert(!x_quantized || route == Fp8Route::kStream || route == Fp8Route::kMma || route == Fp8Route::kGemm);
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
  // accumulating, no outer scales): the same quantized x, the same plan;
  // kStream: gemm_stream's unscaled sums, then the same pass.
  const int64_t w_ld = static_cast<int64_t>(fp8_row_bytes(n_cols));
  if (!x_quantized) quantize_fp8_tokens(x_dtype, x, n_tokens, n_cols, fp8.xq, fp8.xs, stream);
  if (route == Fp8Route::kStream) {
    if (!gemm_stream(stream_args(static_cast<const uint8_t*>(w), fp8, n_tokens, n_rows, n_cols, gate_up, false, false),
                     stream)) {
      return Error{"FP8 GLU matmul: gemm_stream refused " + std::to_string(n_tokens) + " x " + std::to_string(n_rows) +
                   " x " + std::to_string(n_cols)};
    }
    fp8_scale_glu(gate_up, n_tokens, n_rows / 2, fp8.xs, fp8_scales(w, n_rows, n_cols), gelu, out_dtype, out, stream);
    return Status::Ok();
  }
  RILL_TRY(gemm.run_fp8_unscaled(static_cast<const uint8_t*>(w) + kFp8RowHeader, w_ld, fp8.xq, n_tokens, n_rows, n_cols,
                                 gate_up));
  fp8_scale_glu(gate_up, n_tokens, n_rows / 2, fp8.xs, fp8_scales(w, n_rows, n_cols), gelu, out_dtype, out, stream);
  return Status::Ok();
}

}  // namespace rill::cuda
