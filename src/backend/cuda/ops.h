#pragma once
// CUDA ops: host functions that launch kernels on a stream. Every pointer
// is a device pointer. Activations that feed a matmul are in the "act"
// dtype (the weights' dtype: F32, F16 or BF16); the residual stream, matmul
// outputs, q/k/v and logits are f32. Each op is held to its CPU reference
// (backend/cpu) by tests/cuda/cuda_ops_test.cpp with the tolerances stated
// there.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace rill::cuda {

// The SMs of the device current at the first call (queried once a
// process: grid sizes, not correctness, depend on it).
int sm_count();

// out[i, :] = row ids[i] of table (F32/F16/BF16, [n_rows, n_cols]) as f32.
void embed_rows(DType table_dtype, const void* table, int64_t n_cols, const int32_t* ids, int64_t n_ids, float* out,
                cudaStream_t stream);

// out[r, :] = x[r, :] / rms(x[r, :]) * (w_offset + w[:]) in out_dtype
// (F32/F16/BF16). x: [n_rows, dim] f32 with rows x_stride floats apart
// (0: dim). When row_ids is non-null, row r reads x row row_ids[r]
// (gathers the sampled rows before the LM head).
void rms_norm(const float* x, int64_t x_stride, const int32_t* row_ids, const float* w, int64_t n_rows, int64_t dim,
              float eps, float w_offset, DType out_dtype, void* out, cudaStream_t stream);

// rms_norm without row_ids that also leaves out's rows quantized for an
// FP8 GEMM in the same pass: xq [n_rows, dim] e4m3 and xs [n_rows] f32,
// the bits quantize_fp8_tokens(out_dtype, out, ...) gives (fp8.h), so the
// GEMM needs no quantization kernel of its own. Requires
// rms_norm_fp8_supported (the kernel that holds a row in registers, a
// float4 a thread of rms_norm's block: dim a multiple of 4 up to 256, or
// 1,024, or 4,096; x and out aligned) and xq 4-byte aligned.
bool rms_norm_fp8_supported(const float* x, int64_t x_stride, int64_t dim, DType out_dtype, const void* out);
void rms_norm_fp8(const float* x, int64_t x_stride, const float* w, int64_t n_rows, int64_t dim, float eps,
                  float w_offset, DType out_dtype, void* out, uint8_t* xq, float* xs, cudaStream_t stream);

// gate_up: [n_rows, 2 * n_ff] f32 (gate in [0, n_ff), up in [n_ff, 2 n_ff));
// out[r, i] = silu(gate[r, i]) * up[r, i] in out_dtype, [n_rows, n_ff].
void silu_mul(const float* gate_up, int64_t n_rows, int64_t n_ff, DType out_dtype, void* out, cudaStream_t stream);

// y[r, c] += b[c] over y [n_rows, n_cols] f32.
void add_bias(float* y, const float* b, int64_t n_rows, int64_t n_cols, cudaStream_t stream);

// out[i] = x[i] converted to dtype (F32/F16/BF16).
void convert_f32(const float* x, int64_t n, DType dtype, void* out, cudaStream_t stream);

// KV types the CUDA kernels store and read (backend/cuda/kv_types.cuh): F32, F16, BF16,
// F8_E4M3, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL (GGML's blocks, the CPU's layout; K/V
// heads of whole blocks, or blocks of whole heads), Q8_0_64 and IQ4_NL64 (the CPU's blocks of 64);
// IQ4_NL, Q8_0_64 and IQ4_NL64 rotated only, see kv_rotation_supported.
bool kv_supported(DType kv_dtype);
// Whether a side of kv_dtype may be stored as `rotated` asks (rotated:
// Hadamard-rotated per head, q8_0h / q4_0h / iq4_nlh / q8_0h64 /
// iq4_nlh64, model/kv_types.h). Rotated: Q8_0, Q4_0 and IQ4_NL with a
// power-of-two head_dim, Q8_0_64 and IQ4_NL64 with a power-of-two head_dim
// of at least 64 (whole blocks of 64 per head, the CPU's rule); attention's
// limit, kMaxHeadDim, applies too. Unrotated: every type but IQ4_NL,
// Q8_0_64 and IQ4_NL64 (no plain encoder for them in rill, as on the CPU).
bool kv_rotation_supported(DType kv_dtype, int32_t head_dim, bool rotated);

// RoPE (+ optional per-head RMSNorm: qwen3, gemma3) on the q and k heads of a fused
// qkv buffer, and K/V written into the paged cache.
//   qkv: [n_tokens, qkv_stride] f32: q heads [n_head, head_dim], then k
//        heads [n_head_kv, head_dim], then v heads; q is rotated in place.
//   slots[t]: the cache row of token t (block * block_size + offset).
//   k_cache / v_cache: one layer's rows [n_rows, n_head_kv * head_dim] in kv_dtype
//   (kv_supported(): Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / Q8_0_64 / F8_E4M3 / BF16 quantized here, each head's
//   blocks or bytes from its rotated f32 values, as the CPU's
//   cpu::store_kv_row).
// Angles as cpu::rope: theta_i = pos * inv_freq[i] (or the ggml recurrence
// when ggml_theta_scale > 0), cos and sin in f32 times attn_factor.
struct RopeKvArgs {
  float* qkv = nullptr;
  int64_t n_tokens = 0, qkv_stride = 0;
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0;
  const int32_t* positions = nullptr;  // [n_tokens]
  const int32_t* slots = nullptr;      // [n_tokens]
  const float* q_norm = nullptr;       // [head_dim] or null
  const float* k_norm = nullptr;       // [head_dim] or null
  float norm_eps = 1e-6f;
  float norm_offset = 0.0f;             // q/k norms scale by (norm_offset + w): gemma's HF weights 1
  const float* inv_freq = nullptr;      // [rot_dim / 2]
  const float* freq_divisor = nullptr;  // [rot_dim / 2] or null (ggml mode only)
  int32_t rot_dim = 0;
  bool interleaved = false;
  float attn_factor = 1.0f;
  float ggml_theta_scale = 0.0f;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  DType kv_dtype = DType::kF32;
  // q8_0h / q4_0h / iq4_nlh / q8_0h64 (kv_rotation_supported): each K (V) head is rotated by
  // cpu::hadamard_rotate after RoPE and stored by the rotated types'
  // encoder (kv_rotated.cuh), the CPU's bytes. q is not rotated here
  // (attention does it), so q leaves this op as it does for any type.
  bool k_rotated = false, v_rotated = false;
  // k4c's tail rows (model/kv_types.h "k4c"; kv_chan.h: not yet run on a
  // GPU, and no model sets them yet): when set, token t's K goes to row t
  // of k_rows in q8_0 (cpu::kKvChanTailType, unrotated) instead of
  // k_cache, and its V, rotated, to row t of v_rows in q8_0 as well as to
  // v_cache in kv_dtype: cpu::store_chan_tail_rows' bytes (llama.cpp's q8_0
  // reference, KvQ8_0::store) beside the rotated V row. Rows of
  // row_bytes(Q8_0, n_head_kv * head_dim); kv_dtype rotated only (k4c's
  // iq4_nlh64), v_rotated set. q4c's K blocks are then encoded from these
  // rows and the sequence's tail (quantize_chan_blocks).
  void* k_rows = nullptr;
  void* v_rows = nullptr;
};
void rope_store_kv(const RopeKvArgs& a, cudaStream_t stream);

// Attention of every query token of a step over the paged cache.
// Query token t (row t of q, heads [n_head, head_dim] f32, rows q_stride
// floats apart) belongs to sequence seq_of[t] at position pos[t]; it sees
// keys j in [lo, pos[t]] with lo = max(0, pos - window + 1) when window > 0,
// else 0; key j lives at cache row table[j >> block_shift] * block_size +
// (j & (block_size - 1)) where table = block_tables + table_start[seq].
// score = scale * q.k, softcap then f32 softmax (cpu::attention's order).
// out: [n_tokens, n_head * head_dim] in out_dtype. K/V in kv_dtype
// (kv_supported()); the quantized types are read where they lie.
//
// Two kernels share the step: sequences with q_len > kDecodeMaxQ go through
// a tiled kernel (prefill: one block per 32 queries and head, K/V tiles in
// shared memory); the other tokens through split-KV decode (one block per
// token, KV head and split: GQA heads share each K/V read; a token's split
// count depends only on its own length, so with the block size fixed, as
// batch-invariant mode fixes it (attention_decode.h), results are batch
// invariant).
// A token with one split (up to kSplitKeys keys) needs no combine pass.
// Decode reads the index arrays and block tables before waiting for the
// preceding kernel (programmatic launch): they must be written before the
// step's first kernel (q and K/V may come from the kernel just before).
inline constexpr int32_t kDecodeMaxQ = 4;
// head_dim a multiple of 4 up to kMaxHeadDim (Gemma 4's full layers: 512),
// every KV type of kv_supported(). Where attention_decode.cu's fast kernel
// and the tensor-core prefill stop (decode_fast_supported,
// prefill_mma_supported), the general kernels of attention.cu take over.
inline constexpr int32_t kMaxHeadDim = 512;
inline constexpr int32_t kPrefillTileQ = 32;     // queries per tile of the f32 (SIMT) kernel
inline constexpr int32_t kPrefillTileQMma = 64;  // of the tensor-core kernel (head_dim 64/128/256/512)
inline constexpr int32_t kMaxSplits = 32;
inline constexpr int32_t kSplitKeys = 256;  // keys per split (until kMaxSplits)
struct PrefillTile {
  int32_t seq;
  int32_t t0;   // first token (flat index) of the tile
  int32_t n_q;  // tokens in the tile, <= kPrefillTileQ
};
struct AttentionArgs {
  const float* q = nullptr;
  int64_t q_stride = 0;
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.0f, softcap = 0.0f;
  int32_t window = 0;
  // [n_head] sink logits (gpt-oss), device memory: head h's softmax
  // denominator also holds exp(sinks[h]), a logit without a value (the CPU
  // f32 kernel's order: both rescaled to max(m, sink)). Null: none, and the
  // kernels run exactly as without the field.
  const float* sinks = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  DType kv_dtype = DType::kF32;
  int32_t block_shift = 4;
  const int32_t* block_tables = nullptr;
  const int32_t* table_start = nullptr;  // [n_seqs]
  const int32_t* seq_of = nullptr;       // [n_tokens]
  const int32_t* pos = nullptr;          // [n_tokens]
  // decode: tokens decode_tokens[0, n_decode); splits by the longest
  const int32_t* decode_tokens = nullptr;
  int32_t n_decode = 0;
  int32_t max_decode_len = 0;  // largest pos + 1 among them
  float* partial = nullptr;    // scratch, attention_partial_floats(...)
  // [n_decode * n_head_kv] int32, zero before the first call (each call
  // leaves it zero): the decode kernel's last split block per (token, KV
  // head) merges the splits. Null: a separate combine kernel does (same
  // results, bitwise).
  int32_t* split_counts = nullptr;
  // prefill tiles
  const PrefillTile* tiles = nullptr;
  int32_t n_tiles = 0;
  DType out_dtype = DType::kF32;
  void* out = nullptr;
  // Decode through the general kernel even where attention_decode.cu's
  // applies (tests and benchmarks compare the two).
  bool general_decode = false;
  // Rotated KV (q8_0h / q4_0h / iq4_nlh / q8_0h64, kv_rotation_supported): K's heads were
  // stored Hadamard-rotated, so each query head is rotated the same way
  // first (H orthonormal: q.k unchanged); V's were, so each output head is
  // rotated back (H is its own inverse) in f32 before its conversion to
  // out_dtype. Both go through `rotation` (attention_rotation_floats(
  // n_tokens, ...) floats of scratch): the rotated queries, then the f32
  // outputs, rows [n_tokens, n_head * head_dim]; every kernel (decode and
  // prefill, SIMT and tensor-core) reads and writes them as it would q and
  // out. n_tokens: the step's query rows (every row of q and out).
  bool k_rotated = false, v_rotated = false;
  int32_t n_tokens = 0;
  float* rotation = nullptr;
};
// Splits of a decode token whose keys span [0, len): a function of len only.
int32_t decode_splits(int32_t len);
// Queries per prefill tile attention() expects for this cache: kPrefillTileQMma
// where the tensor-core kernel runs, else kPrefillTileQ.
int32_t prefill_tile_q(DType kv_dtype, int32_t head_dim);
// Scratch floats attention() needs for n_decode tokens.
size_t attention_partial_floats(int64_t n_decode, int32_t n_head, int32_t head_dim);
// Scratch floats attention() needs for rotated KV over n_tokens query rows.
size_t attention_rotation_floats(int64_t n_tokens, int32_t n_head, int32_t head_dim);
void attention(const AttentionArgs& a, cudaStream_t stream);

// Routes sequence s (tokens [q_start, q_start + q_len)) to the decode
// kernel (q_len <= kDecodeMaxQ: its tokens are appended to decode_tokens) or
// to prefill tiles of tile_q tokens (prefill_tile_q()). Outputs are
// appended; callers reserve capacity once (n_tokens entries each suffice).
template <typename TokenVec, typename TileVec>
void route_attention(int32_t s, int32_t q_start, int32_t q_len, int32_t tile_q, TokenVec& decode_tokens,
                     TileVec& tiles) {
  if (q_len <= kDecodeMaxQ) {
    for (int32_t i = 0; i < q_len; ++i) decode_tokens.push_back(q_start + i);
    return;
  }
  for (int32_t i = 0; i < q_len; i += tile_q)
    tiles.push_back({s, q_start + i, q_len - i < tile_q ? q_len - i : tile_q});
}

// y[t, r] (+)= sum_c W[r, c] x[t, c] with W, x in one dtype (F32, F16 or
// BF16; [n_rows, n_cols] and [n_tokens, n_cols], rows a whole number of 16
// bytes); y: [n_tokens, n_rows] f32. Each output is one warp's dot product
// in f32 in a fixed order, so a row's result does not depend on n_tokens
// (tokens go 8 per launch).
inline constexpr int kGemvMaxTokens = 8;
bool gemv_supported(DType w, int64_t n_cols);
// Benchmarks only: one bf16 token through GEMV configuration `variant`
// (rows per warp, loads in flight, warps per block; bench_cuda --kernels).
int gemv_n_variants();
void gemv_variant(int variant, const void* w, const void* x, int64_t n_rows, int64_t n_cols, float* y,
                  cudaStream_t stream);

// Greedy: ids[r] = argmax_c logits[r, c] over [n_rows, n_cols] f32 (the
// lowest index among equal maxima, as the CPU sampler).
void argmax_rows(const float* logits, int64_t n_rows, int64_t n_cols, int32_t* ids, cudaStream_t stream);
void gemv(DType w_dtype, const void* w, const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y,
          bool accumulate, cudaStream_t stream);

// --- The Gemma family's ops (ops_gemma.cu) ---------------------------------

// gate_up: [n_rows, 2 * n_ff] f32 as silu_mul; out[r, i] = gelu_tanh(gate) *
// up in out_dtype (GeGLU, cpu::gelu_tanh_mul's formula).
void gelu_tanh_mul(const float* gate_up, int64_t n_rows, int64_t n_ff, DType out_dtype, void* out, cudaStream_t stream);

// The sandwich norm's residual add, fused with the next pre-norm. Per row r
// of [n_rows, dim] f32:
//   x[r] += rms_norm(y[r]) * (w_offset + w_post)        (cpu: norm, then add)
//   out[r] = rms_norm(x[r]) * (w_offset + w_next)       in out_dtype
// w_next null: only the first line (out unused).
void post_norm_add(const float* y, const float* w_post, float* x, const float* w_next, int64_t n_rows, int64_t dim,
                   float eps, float w_offset, DType out_dtype, void* out, cudaStream_t stream);

// x[i] = cap * tanh(x[i] / cap) over n floats (final logit softcapping).
void softcap(float* x, int64_t n, float cap, cudaStream_t stream);

// x[i] *= s over n floats (Gemma's embedding scale).
void scale(float* x, int64_t n, float s, cudaStream_t stream);

}  // namespace rill::cuda
