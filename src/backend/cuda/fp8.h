#pragma once
// FP8 weights on the device (`--quantize fp8`): a float matrix quantized at
// load to e4m3 with one f32 scale per row, so decode reads half the bytes
// of bf16.
//
// Layout (the CUDA-only weight type kFp8Rows): each row is a 16-byte
// header (the f32 scale, then 12 zero bytes, so the e4m3 values after it
// stay 16-byte aligned) followed by n_cols e4m3 bytes; rows follow each
// other (fp8_row_bytes), then the scales again as one f32 vector
// (fp8_scales: the per-row scale vector cuBLASLt's FP8 GEMM reads). A row
// is self-contained, so the GEMV and a chunk of rows (quant.h's
// dequantize_rows with row0) need only the row.
// Values: W[r, c] = e4m3(q[r, c]) x scale[r]; quantization takes
// scale = max|W[r, :]| / 448 (1 for an all-zero row) and rounds W / scale to
// the nearest e4m3 (ties to even, saturating at +-448).
//
// Every pointer is a device pointer.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/quant.h"
#include "core/dtype.h"
#include "core/result.h"

namespace rill::cuda {

class Gemm;

// Not a GGML type id: only the CUDA backend's placed weights carry it.
inline constexpr DType kFp8Rows = static_cast<DType>(0x4638);  // "F8"
inline constexpr int64_t kFp8RowHeader = 16;
// The largest finite e4m3 value: a row's scale maps its max |value| to it.
inline constexpr float kE4m3Max = 448.0f;

inline size_t fp8_row_bytes(int64_t n_cols) {
  return static_cast<size_t>(kFp8RowHeader + n_cols);
}
inline size_t fp8_matrix_bytes(int64_t n_rows, int64_t n_cols) {
  return static_cast<size_t>(n_rows) * (fp8_row_bytes(n_cols) + 4);
}
inline const float* fp8_scales(const void* w, int64_t n_rows, int64_t n_cols) {
  return reinterpret_cast<const float*>(static_cast<const uint8_t*>(w) + n_rows * fp8_row_bytes(n_cols));
}
// Whether a matrix of n_cols columns can be held as kFp8Rows (16-byte rows).
inline bool fp8_cols_ok(int64_t n_cols) {
  return n_cols > 0 && n_cols % 16 == 0;
}

// dst (n_rows x fp8_row_bytes(n_cols)) = src [n_rows, n_cols] (F32/F16/BF16,
// dense) quantized as above, and scales[r] = row r's scale (the vector of
// fp8_scales; a part of a larger matrix passes its rows' place in it).
// Requires fp8_cols_ok(n_cols).
void quantize_fp8_rows(DType src_dtype, const void* src, int64_t n_rows, int64_t n_cols, uint8_t* dst, float* scales,
                       cudaStream_t stream);

// Activations for the FP8 GEMM: xq [n, n_cols] e4m3 and xs [n] f32, token t
// quantized as a weight row is (scale max |x[t, :]| / 448).
void quantize_fp8_tokens(DType x_dtype, const void* x, int64_t n, int64_t n_cols, uint8_t* xq, float* xs,
                         cudaStream_t stream);

// y[t, r] (+)= sum_c W[r, c] x[t, c], x [n_tokens, n_cols] in F32 or BF16,
// y f32. 16-byte weight loads, four rows per warp (a row's columns split
// over up to eight warps by its shape alone), f32 accumulation in a fixed
// order per row, times the row's scale at the end: a token's result does
// not depend on n_tokens (tokens go 8 per launch). Fast at one token; from
// two, its f32 FMAs per weight byte make it slower than the FP8 GEMM.
// With fp8_gemv_stream_on(), one token runs fp8_gemv_stream (the same bits).
void fp8_gemv(const uint8_t* w, DType x_dtype, const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
              float* y, bool accumulate, cudaStream_t stream);

// How many parts (warps of fp8_gemv's kernel) a row's 16-byte vectors are
// split into: from the shape alone, so a row's order of additions is the
// same for every token count. Part p holds vectors [p per, (p + 1) per)
// with per = ceil(ceil(n_cols / 16 / parts) / 32) x 32 (the last short).
int fp8_gemv_parts(int64_t n_rows, int64_t n_cols);

// The streaming GEMV (fp8_gemv_stream.cu): fp8_gemv's contract and its
// bits (the same sums in the same order: a row's part p, lane l sums the
// vectors l, l + 32, .. of the part, each vector's 16 products fused into
// one f32 accumulator in column order; the lane sums meet by an xor tree
// (offsets 16, 8, 4, 2, 1); the parts add in order; times the row's scale;
// + y when accumulating), with a ring of 16-byte loads kept in flight
// through the math and one wave of resident blocks. fp8_gemv takes it for
// one token when fp8_gemv_stream_on(): the environment sets
// RILL_FP8_GEMV=v2. Off by default until a GPU run has timed it
// (docs/perf.md, branch fp8gemv23). The same bits, so no KV tag.
bool fp8_gemv_stream_on();
void fp8_gemv_stream(const uint8_t* w, DType x_dtype, const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
                     float* y, bool accumulate, cudaStream_t stream);

// Benchmarks only (bench_fp8_kernels): the GEMV configurations timed, one
// token, x bf16, not accumulating.
int fp8_gemv_n_variants();
const char* fp8_gemv_variant_name(int variant);
void fp8_gemv_variant(int variant, const uint8_t* w, const void* x_bf16, int64_t n_rows, int64_t n_cols, float* y,
                      cudaStream_t stream);
// The same for the streaming GEMV's configurations (same bits as fp8_gemv).
int fp8_gemv_stream_n_variants();
const char* fp8_gemv_stream_variant_name(int variant);
void fp8_gemv_stream_variant(int variant, const uint8_t* w, const void* x_bf16, int64_t n_rows, int64_t n_cols,
                             float* y, cudaStream_t stream);

// The FP8 GEMM of our own for decode batches (fp8_mma.cu): y[t, r] (+)=
// sum_c e4m3(xq[t, c]) e4m3(W[r, c]) x xs[t] x ws[r] over W (kFp8Rows [n_rows,
// n_cols], the pointer fp8_matmul gets) and the activations
// quantize_fp8_tokens made (xq [n_tokens, n_cols], xs [n_tokens]): the
// products cuBLASLt's FP8 GEMM takes, on the tensor cores (e4m3 -> f16
// exactly, mma.sync f16 with f32 accumulation), the scales in the epilogue
// (no scale pass). Weights streamed once from HBM per launch of up to
// kFp8MmaMaxTokens tokens (more go in chunks of it).
// Contract (batch invariance): a token's result does not depend on
// n_tokens nor on its place among them, bit for bit: each output's order of
// additions follows from (n_rows, n_cols, the device's SM count, ksplit)
// alone. Where the plan splits the columns (small n_rows: the slabs alone
// would leave SMs idle) the parts' sums go through `part` (part_floats of
// it, at least fp8_mma_part_floats) and a second kernel adds them in part
// order. ksplit: 0 the plan's, else that many column parts (benchmarks and
// tests; a different ksplit is a different order of additions). Requires
// fp8_cols_ok(n_cols); every pointer a device pointer.
inline constexpr int64_t kFp8MmaMaxTokens = 64;
void fp8_mma(const uint8_t* w, const uint8_t* xq, const float* xs, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
             float* y, bool accumulate, float* part, int64_t part_floats, cudaStream_t stream, int ksplit = 0);

// The same sums for a fused gate/up weight (gate rows [0, F), up [F, 2 F),
// F = n_rows / 2), out[t, i] = act(gate) * up in out_dtype (F32/F16/BF16)
// [n_tokens, F], the scales and the GLU in the epilogue (the arithmetic of
// fp8_scale_glu: act SiLU or, with `gelu`, GELU's tanh form). A slab holds
// 64 gate rows and the 64 up rows that pair with them.
void fp8_mma_glu(const uint8_t* w, const uint8_t* xq, const float* xs, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
                 bool gelu, DType out_dtype, void* out, float* part, int64_t part_floats, cudaStream_t stream,
                 int ksplit = 0);

// fp8_mma and fp8_mma_glu with x [n_tokens, n_cols] bf16 taken as it is
// (no activation quantization: the e4m3 weights go to bf16, exactly, and
// mma.sync bf16 multiplies them by x; y = sum x ws[r]): the exact products
// of the weights and x, the same plan, order and contract.
void fp8_mma_bf16x(const uint8_t* w, const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y,
                   bool accumulate, float* part, int64_t part_floats, cudaStream_t stream, int ksplit = 0);
void fp8_mma_glu_bf16x(const uint8_t* w, const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols, bool gelu,
                       DType out_dtype, void* out, float* part, int64_t part_floats, cudaStream_t stream,
                       int ksplit = 0);

// Floats of `part` fp8_mma (glu: fp8_mma_glu) needs for this shape (0: the
// plan does not split it; the same for the bf16 forms).
int64_t fp8_mma_part_floats(int64_t n_tokens, int64_t n_rows, int64_t n_cols, bool glu, int ksplit = 0);

// Whether fp8_matmul and fp8_matmul_glu take fp8_mma for 2..kFp8MmaMaxTokens
// tokens (outside batch-invariant mode): the environment sets
// RILL_FP8_MMA=1 (or 2), read once. Off by default until a GPU run has
// timed it (docs/perf.md, branch fp8mma23). With RILL_FP8_MMA=2
// (fp8_mma_bf16x_on) bf16 activations go through the bf16 forms instead (no
// quantize_fp8_tokens); F32 activations take the e4m3 form either way.
bool fp8_mma_on();
bool fp8_mma_bf16x_on();
// The token counts fp8_mma takes while it is on: RILL_FP8_MMA_TOKENS=LO-HI
// (2 <= LO <= HI <= kFp8MmaMaxTokens; read once; a malformed value is
// reported on stderr and the default kept), default 2..kFp8MmaMaxTokens.
// For timing a band: on the H100 the bf16 form beat quantize + cuBLASLt
// at 16 tokens and lost from 64 (docs/perf.md, 2026-12-05 21:11 session).
struct Fp8MmaTokens {
  int64_t lo = 2, hi = kFp8MmaMaxTokens;
};
Fp8MmaTokens fp8_mma_tokens();

// out[r, :] = W[row0 + r, :] (e4m3 value x scale, rounded to out_dtype:
// F32/F16/BF16), out [n_rows, n_cols].
void dequantize_fp8_rows(const uint8_t* w, int64_t n_cols, int64_t row0, int64_t n_rows, DType out_dtype, void* out,
                         cudaStream_t stream);

// y[t, col0 + j] (+)= d[t, j] xs[t] ws[col0 + j] over d [n, n_part], y rows
// y_stride floats apart (d may be y itself when not accumulating): the
// scales of an FP8 GEMM that ran unscaled.
void fp8_scale_rows(const float* d, int64_t n, int64_t n_part, int64_t y_stride, int64_t col0, const float* xs,
                    const float* ws, float* y, bool accumulate, cudaStream_t stream);

// The same from d in bf16 (values of d [n, n_part], not aliasing y): an
// FP8 GEMM that ran unscaled with bf16 output; y as above.
void fp8_scale_rows_bf16(const void* d, int64_t n, int64_t n_part, int64_t y_stride, int64_t col0, const float* xs,
                         const float* ws, float* y, bool accumulate, cudaStream_t stream);

// out[t, i] = act(g) * u with g = d[t, i] xs[t] ws[i] and u = d[t, F + i]
// xs[t] ws[F + i] (F = n_ff), over d [n, 2 F] f32 the unscaled product of a
// fused gate/up weight, in out_dtype (F32/F16/BF16) [n, F]; act SiLU or,
// with `gelu`, GELU's tanh form. The same arithmetic, in the same order, as
// fp8_scale_rows then silu_mul / gelu_tanh_mul (ops.h): the same bits, from
// one read of d instead of a read and a write of it and another read.
void fp8_scale_glu(const float* d, int64_t n, int64_t n_ff, const float* xs, const float* ws, bool gelu,
                   DType out_dtype, void* out, cudaStream_t stream);

// The FP8 GEMM's quantized activations and its accumulation scratch
// (Gemm::run_fp8's d), carved from an arena (sizing pass included) for up
// to max_tokens x max_cols.
// With fp8_mma_on(), also fp8_mma's split-K sums (mma_part).
struct Fp8Scratch {
  uint8_t* xq = nullptr;
  float* xs = nullptr;
  float* d = nullptr;
  float* mma_part = nullptr;
  int64_t x_elems = 0, max_tokens = 0, d_floats = 0, mma_part_floats = 0;
  void carve(Arena& a, int64_t max_tokens, int64_t max_cols);
};

// y[t, r] (+)= sum_c W[r, c] x[t, c] over FP8 weights W [n_rows, n_cols]
// (kFp8Rows), x in F32/F16/BF16: fp8_gemv for one token (x F32/BF16); more
// tokens through the FP8 tensor-core GEMM (activations quantized per token
// into `fp8`), or, where cuBLASLt has none for the shape, the GEMV up to
// kGemvMaxTokens and beyond that (or when the scratch is too small)
// quant_matmul's dequantize-then-GEMM. 2..fp8_stream_max_tokens() tokens (64
// by default) go through gemm_stream's e4m3 form instead (activations
// quantized the same way, the scales in its epilogue), and with fp8_mma_on()
// 2..kFp8MmaMaxTokens tokens past those through fp8_mma (fp8_route decides).
// Batch-invariant mode (gemm.batch_invariant()) always dequantizes, as for
// GGUF blocks.
// x_quantized: fp8.xq / fp8.xs already hold quantize_fp8_tokens(x_dtype, x,
// n_tokens, n_cols)'s output (rms_norm_fp8 made it), so the call skips
// that kernel; only where fp8_quantizes_x says the call would run it.
Status fp8_matmul(Gemm& gemm, const QuantScratch& scratch, const Fp8Scratch& fp8, const void* w, DType x_dtype,
                  const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y, bool accumulate,
                  cudaStream_t stream, bool x_quantized = false);

// What fp8_matmul (glu: fp8_matmul_glu) does with this shape: the one
// routing rule fp8_matmul, fp8_matmul_glu, fp8_quantizes_x and
// fp8_glu_fusable read, so they cannot drift apart.
//  kNone      nothing to do (no tokens or rows); glu: not fusable, the
//             caller runs fp8_matmul then the GLU
//  kStream    gemm_stream's e4m3 form (hopper/gemm_stream.h) over x
//             quantized by quantize_fp8_tokens, the scales in its epilogue
//             (glu: unscaled into gate_up, then fp8_scale_glu as kGemm): 2 to
//             fp8_stream_max_tokens() tokens, outside batch-invariant mode,
//             with gemm.fp8_fast_accum() (its accumulation is that coarse),
//             on devices that run it; checked before kMma
//  kMma       fp8_mma over x quantized by quantize_fp8_tokens
//  kMmaBf16x  fp8_mma's bf16 form over x as it is
//  kGemv      fp8_gemv (not for glu)
//  kGemm      cuBLASLt's FP8 GEMM over quantized x, then its scales (glu:
//             unscaled, the scales inside the GLU)
//  kDequant   quant_matmul's dequantize-then-GEMM (not for glu)
enum class Fp8Route { kNone, kStream, kMma, kMmaBf16x, kGemv, kGemm, kDequant };
Fp8Route fp8_route(Gemm& gemm, const Fp8Scratch& fp8, DType x_dtype, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
                   bool glu);

// The most tokens fp8_route sends to kStream: 64 by default (on the H100
// the 8B's FP8 decode gained 4.6% at batch 8 and 1-2% at 64 on it, and
// lost 5% at 96 and 128: docs/perf.md, 2026-12-07); RILL_FP8_STREAM=1 in
// the environment: 128, =0: none (read once); or what force_fp8_stream set
// (tests, benchmarks: 1 128, 0 none, -1 back to the environment).
// RILL_FP8_STREAM_SPLITS=1|2|4|8 and RILL_FP8_STREAM_VARIANT=0|1|2 fix
// gemm_stream's configuration for every shape (comparisons; by default it
// follows from the shape).
int64_t fp8_stream_max_tokens();
void force_fp8_stream(int on);

// Whether fp8_matmul (glu: fp8_matmul_glu, where fp8_glu_fusable) of this
// shape quantizes x with quantize_fp8_tokens into fp8.xq / fp8.xs: its
// FP8 GEMM, gemm_stream's e4m3 form and fp8_mma's e4m3 form, not the GEMV,
// fp8_mma's bf16 form, quant_matmul or batch-invariant mode.
bool fp8_quantizes_x(Gemm& gemm, const Fp8Scratch& fp8, DType x_dtype, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
                     bool glu);

// Whether fp8_matmul of this shape (not accumulating) takes the unscaled
// tensor-core GEMM and a separate scale pass (not the GEMV, not
// quant_matmul, not cuBLASLt's outer-vector scales, not Gemm's bf16 D, not
// batch-invariant mode): where fp8_matmul_glu can fuse that pass with the
// GLU; where fp8_matmul takes gemm_stream (its unscaled sums, then the same
// fused pass); or, with fp8_mma_on(), where fp8_matmul takes fp8_mma (its GLU
// epilogue: fp8_mma_glu). n_rows: the fused gate/up weight's rows (2 F, even).
bool fp8_glu_fusable(Gemm& gemm, const Fp8Scratch& fp8, DType x_dtype, int64_t n_tokens, int64_t n_rows,
                     int64_t n_cols);

// out = act(gate) * up over the fused gate/up FP8 weight W [2 F, n_cols]
// (gate rows [0, F), up [F, 2 F)) times x [n_tokens, n_cols]: what
// fp8_matmul(W, x) into gate_up then silu_mul / gelu_tanh_mul give, bit for
// bit, with the scales applied inside the GLU (fp8_scale_glu) to the
// unscaled product the GEMM leaves in gate_up [n_tokens, 2 F] f32 (scratch).
// Where fp8_matmul takes fp8_mma: fp8_mma_glu (gate_up unused), the same
// bits as fp8_mma then silu_mul / gelu_tanh_mul.
// Requires fp8_glu_fusable.
// x_quantized as fp8_matmul's.
Status fp8_matmul_glu(Gemm& gemm, const Fp8Scratch& fp8, const void* w, DType x_dtype, const void* x, int64_t n_tokens,
                      int64_t n_rows, int64_t n_cols, bool gelu, float* gate_up, DType out_dtype, void* out,
                      cudaStream_t stream, bool x_quantized = false);

}  // namespace rill::cuda
