#pragma once
// Quantized GGUF weights on the device, kept in their block layout
// (backend/cpu/quants.h; values as cpu::ref::dequantize_row defines them):
//  - quant_gemv: decode GEMV straight from the blocks, f32 accumulation in
//    one fixed order per row whatever the token count (batch invariant);
//  - quant_mma: decode batches (quant_matmul: up to kInt8PathMaxTokens
//    tokens) of Q4_K, Q6_K and Q8_0 on the int8 tensor cores, x quantized
//    to int8 first (quantize_x8), as llama.cpp's mmvq / mmq compute;
//  - q8_dp4a_gemv: decode of Q8_0 (1..8 tokens) on dp4a int8 dot products
//    over the same quantized x (RILL_Q8_DP4A=0 turns it off);
//  - dequantize_rows + cuBLASLt: prefill, through a bf16/f16/f32 scratch
//    copy of the matrix (quant_matmul picks the path by token count);
//  - embed_rows_any: the embedding gather from a quantized table.
// Every pointer is a device pointer. Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q4_K, Q5_K, Q6_K, MXFP4 (quant_supported); rows are whole blocks (GGUF's rule).
// quant_gemv, dequantize_rows and quant_matmul also take the backend's FP8
// weights (fp8.h, kFp8Rows: e4m3 rows with a scale each), never a table.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/q8_dp4a_order.h"
#include "core/dtype.h"
#include "core/result.h"

namespace rill::cuda {

class Gemm;

// A weight matrix in device memory: F32/F16/BF16 or a quant_supported type.
struct DeviceWeight {
  const void* data = nullptr;
  DType dtype = DType::kF32;
};

// Whether the CUDA kernels read this GGUF block type in place.
bool quant_supported(DType t);

// y[t, r] (+)= sum_c W[r, c] x[t, c]; W [n_rows, n_cols] of type w_dtype,
// x [n_tokens, n_cols] in x_dtype (F32 or BF16), y [n_tokens, n_rows] f32.
// One warp per row (four for rows of more than 8,192 elements, partial sums
// added in a fixed order); a row's result for one token is the same bits
// whatever n_tokens is (tokens go 8 per launch).
// y rows are y_stride floats apart (0: n_rows).
void quant_gemv(DType w_dtype, const void* w, DType x_dtype, const void* x, int64_t n_tokens, int64_t n_rows,
                int64_t n_cols, float* y, bool accumulate, cudaStream_t stream, int64_t y_stride = 0);

// out[r, :] = W[row0 + r, :] for r in [0, n_rows), dequantized exactly as
// cpu::ref::dequantize_row (bit for bit in F32) and rounded to out_dtype
// (F32/F16/BF16, round to nearest even). out: [n_rows, n_cols], 16-byte
// aligned for F32 and 8-byte for F16/BF16 (vector stores). W is read
// before the programmatic-launch wait (the tile kernel's first loads): W
// must not be written by the kernel just before on the stream (weights
// never are).
void dequantize_rows(DType w_dtype, const void* w, int64_t n_cols, int64_t row0, int64_t n_rows, DType out_dtype,
                     void* out, cudaStream_t stream);

// out[i, :] = row ids[i] of table [*, n_cols] as f32; the table quantized
// (dequantized as above) or F32/F16/BF16 (embed_rows).
void embed_rows_any(DType table_dtype, const void* table, int64_t n_cols, const int32_t* ids, int64_t n_ids, float* out,
                    cudaStream_t stream);

// The int8 path (quant_mma.cu). quantize_x8 turns x [n_tokens, n_cols]
// (F32/BF16, n_cols a multiple of 32) into xq: per token and 32 columns,
// q = x / d rounded to nearest even with d = max |x| / 127 (f32; llama.cpp's
// q8_1 keeps d in f16), then (d, d * sum q); quantized_x_bytes of it. A
// block's 32 int8 are stored in the order the tensor-core fragments read
// them: columns 4 t .. 4 t + 3, then 16 + 4 t .. 16 + 4 t + 3, for t = 0..3.
// quant_mma: y[t, r * ] (+)= sum_c W[r, c] xq[t, c] for a quant_mma_supported
// W, y rows y_stride floats apart: exact int32 dots per 32 columns (16 for
// Q6_K's scales) scaled and summed in f32 in a fixed order per (row,
// token), so a row's result for one token is the same bits whatever
// n_tokens is (batch invariant per row, as quant_gemv). Against the f32
// GEMV the difference is x's rounding to int8: at most d / 2 per element.
bool quant_mma_supported(DType t);
inline constexpr int64_t kMmaMaxTokens = 64;  // quant_mma's limit
// quant_matmul's choice, from bench_cuda --quant-kernels on an H200: the
// int8 path up to this many tokens (past two tiles of 8 quant_mma's
// per-tile cost loses to dequantize + cuBLASLt at 64), and past it where
// quant_mmq_eligible, but not for one token of Q8_0 (the f32 GEMV reads
// Q8_0 at 1.3-2.5 TB/s, the int8 path at 0.9-1.4).
inline constexpr int64_t kInt8PathMaxTokens = 16;
size_t quantized_x_bytes(int64_t n_tokens, int64_t n_cols);
void quantize_x8(DType x_dtype, const void* x, int64_t n_tokens, int64_t n_cols, void* xq, cudaStream_t stream);
void quant_mma(DType w_dtype, const void* w, const void* xq, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y,
               int64_t y_stride, bool accumulate, cudaStream_t stream);
// quant_mmq (quant_mmq.cu): quant_mma's result, the same bits, with W's
// blocks and x staged through shared memory by blocks of 32-128 rows, for
// what quant_mmq_fits (Q8_0 / Q4_K / Q6_K, up to kMmaMaxTokens tokens,
// n_cols a multiple of 256, W 16-byte aligned; Q6_K, written without a
// GPU, is eligible only with quant_mmq_q6k_on(): RILL_QUANT_MMQ_Q6K=1). quant_mma hands it the calls
// quant_mmq_eligible takes: those of kMmqMinTokens tokens or more of a
// matrix with enough rows for a block of 128 on every SM (the 8B's gate_up
// and LM head; on an H100 at 64 tokens it lost to dequantize + cuBLASLt
// on qkv, o and down, whose blocks of 32-64 rows leave it latency-bound,
// docs/perf.md) when quant_mmq_on(): by default (the random 8B at batch
// 64 on an H100: Q8_0 4,343 -> 5,043 tok/s, Q4_K_M 4,672 -> 5,037);
// RILL_QUANT_MMQ=0 in the environment (read once) turns it off.
// rows_a_block: 32, 64 or 128 (tests and benchmarks), else
// RILL_QUANT_MMQ_ROWS=32/64/128 when set, else chosen from n_rows and the
// SM count. k_split 8: the K split's ranges on a cluster of 8 blocks, one
// a range, their sums added in range order through distributed shared
// memory (the same bits; for matrices too small to fill the GPU with
// row slabs alone); 1: not; 0: where quant_mmq_split_on() (written
// without a GPU at hand: RILL_QUANT_MMQ_SPLIT=1 until timed) and the
// matrix does not fill the GPU, which also makes such matrices eligible.
// From 9 tokens: at 8 and 16 the H100 ran gate_up through quant_mmq's
// 128-row blocks faster than through quant_mma (Q8_0 64.9 / 80.9 us
// against 109.7 / 123.0, Q4_K 52.3 / 65.9 against 55.2 / 84.1); Q8_0 up
// to 8 tokens takes the dp4a GEMV first.
inline constexpr int64_t kMmqMinTokens = 9;
bool quant_mmq_on();
bool quant_mmq_split_on();
bool quant_mmq_q6k_on();
bool quant_mmq_fits(DType w_dtype, const void* w, int64_t n_tokens, int64_t n_cols);
bool quant_mmq_eligible(DType w_dtype, const void* w, int64_t n_tokens, int64_t n_rows, int64_t n_cols);
void quant_mmq(DType w_dtype, const void* w, const void* xq, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y,
               int64_t y_stride, bool accumulate, cudaStream_t stream, int rows_a_block = 0, int k_split = 0);

// The Q8_0 dp4a decode GEMV (q8_dp4a.cu; its arithmetic, rounding and
// work split: q8_dp4a_order.h). y[t, r] (+)= sum_c W[r, c] xq[t, c] for W
// in Q8_0 and xq as quantize_x8 wrote it for these n_tokens tokens (any
// count; 8 per launch), y rows y_stride floats apart (0: n_rows): exact
// int32 dots of 16 products (dp4a), each scaled by d_w and d_x and added
// in f32 in the documented order, which depends on n_cols alone, so a
// token's result is the same bits at 1 and at 8 tokens. Against the f32
// GEMV the difference is x's rounding to int8 (at most d_x / 2 per
// element), as for quant_mma. Layouts of W (n_cols a multiple of 32):
//  - kGguf: the GGUF blocks as loaded (34 bytes: f16 d, 32 int8);
//  - kRows: repack_q8_0_rows's rearrangement of the same bytes: every
//    row's codes ([n_rows, n_cols] int8, each 32-column block in x's
//    fragment order), then every scale ([n_rows, n_cols / 32] f16, the
//    GGUF bits). The base must be 16-byte aligned. Same size as the
//    GGUF matrix, but no other kernel reads it: only benchmarks and tests
//    use it until a GPU run shows whether its 16-byte loads pay (placing
//    weights in it would need a backend-only dtype, as kFp8Rows, and
//    every reader of Q8_0 weights: dequantize_rows, quant_mma, the MoE
//    kernels, the embedding gather for tied heads).
// quant_matmul takes it for 1..kQ8Dp4aMaxTokens tokens of Q8_0 (kGguf)
// when q8_dp4a_on(): by default (on an H100 it made the random 8B's Q8_0
// decode 8% faster at batch 1 and 32% at 8, docs/perf.md 2026-12-06);
// RILL_Q8_DP4A=0 in the environment turns it off (read once).
enum class Q8Layout { kGguf, kRows };
bool q8_dp4a_on();
void q8_dp4a_gemv(Q8Layout layout, const void* w, const void* xq, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
                  float* y, int64_t y_stride, bool accumulate, cudaStream_t stream);
// dst (row_bytes(kQ8_0, n_cols) * n_rows bytes, 16-byte aligned, not
// overlapping src) = the kRows layout of the GGUF Q8_0 matrix src.
void repack_q8_0_rows(const void* src, int64_t n_rows, int64_t n_cols, void* dst, cudaStream_t stream);

// Scratch of quant_matmul's dequantize-then-GEMM path, carved from a
// model's activation arena: `w` holds w_elems dequantized weights (a whole
// matrix, or a chunk of rows of a larger one), `y` the f32 GEMM output of
// one such chunk ([n_tokens, chunk rows]) before it is added into place.
struct QuantScratch {
  void* w = nullptr;
  int64_t w_elems = 0;
  float* y = nullptr;
  int64_t y_floats = 0;
  // The int8 path's quantized x (quantize_x8), for up to kMmaMaxTokens
  // tokens of up to max_cols columns; null: that path is off.
  void* xq = nullptr;
  size_t xq_bytes = 0;
  // Carves (from `a`, sizing pass included: see Arena) what matmuls in act
  // need over quantized matrices of up to max_elems elements with up to
  // max_tokens tokens, and over a quantized LM head [head_rows, head_cols]
  // (head_rows 0: none) with up to max_head_tokens: whole matrices, but a
  // head larger than both the layers' largest and kQuantChunkElems goes in
  // row chunks. Nothing where the GEMV takes every call (never in
  // batch-invariant mode, which always dequantizes). max_cols: the widest
  // quantized matrix's columns (the int8 path's x; 0: no int8 path).
  void carve(Arena& a, DType act, int64_t max_tokens, int64_t max_elems, int64_t head_rows, int64_t head_cols,
             int64_t max_head_tokens, bool batch_invariant = false, int64_t max_cols = 0);
};
// A quantized LM head larger than this (and than every layer matrix) is
// dequantized in row chunks of this many elements (32 MiB in bf16).
inline constexpr int64_t kQuantChunkElems = int64_t{16} << 20;

// y[t, r] (+)= sum_c W[r, c] x[t, c], x [n_tokens, n_cols] in x_dtype
// (F32/F16/BF16). With q8_dp4a_on(), up to kQ8Dp4aMaxTokens tokens of Q8_0
// with x in F32/BF16 and scratch.xq large enough: quantize_x8 +
// q8_dp4a_gemv (kGguf). Else up to kInt8PathMaxTokens tokens of a quant_mma_supported
// W (Q8_0: 2 or more), or up to kMmaMaxTokens where quant_mmq_eligible,
// with x in F32/BF16 and scratch.xq large enough: quantize_x8 + quant_mma
// (unless the environment sets RILL_CUDA_QUANT_MMA=0: the comparison
// baseline of bench/cuda/gguf_vs_llamacpp.sh). Else up to kGemvMaxTokens
// tokens with x in F32/BF16: quant_gemv. Otherwise W (in row chunks when it exceeds scratch.w_elems)
// is dequantized to x_dtype into the scratch and multiplied by cuBLASLt
// (f32 accumulation; its order depends on cuBLASLt's kernel choice, as for
// bf16 weights). In batch-invariant mode (gemm.batch_invariant()) every
// call dequantizes and multiplies through gemm.matmul (gemm_invariant).
// Errors when the scratch cannot hold one row chunk for n_tokens.
Status quant_matmul(Gemm& gemm, const QuantScratch& scratch, DType w_dtype, const void* w, DType x_dtype, const void* x,
                    int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y, bool accumulate, cudaStream_t stream);

// A matrix whose row ranges are in different block types, as
// llama-quantize's mixes write a fused projection's parts (Q4_K_M: q and k
// in Q4_K, v in Q6_K on half the layers): part i holds the next rows[i]
// rows at data[i]. quant_matmul_parts is quant_matmul over the whole
// matrix: each part on its own path when the path takes it part by part
// (the int8 path quantizes x once; the GEMV), else every part dequantized
// into its rows of the scratch and one GEMM (which must hold the matrix).
struct QuantPart {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
};
Status quant_matmul_parts(Gemm& gemm, const QuantScratch& scratch, const QuantPart* parts, int n_parts, DType x_dtype,
                          const void* x, int64_t n_tokens, int64_t n_cols, float* y, bool accumulate,
                          cudaStream_t stream);

// y[t, col0 + j] (+)= part[t, j] over part [n_tokens, n_part] f32, y rows
// y_stride floats apart.
void add_columns(const float* part, int64_t n_tokens, int64_t n_part, float* y, int64_t y_stride, int64_t col0,
                 bool accumulate, cudaStream_t stream);

}  // namespace rill::cuda
