#pragma once
// CPU backend ops. Plain functions over flat f32 activations; weights may be
// any supported dtype. The reference semantics of every op is the scalar
// code in ops_ref.cpp; the fast paths (AVX2/AVX-512, chosen at run time) are
// tested against it.
//
// Threading: ops that take a ThreadPool split their outer loop across it.
// Allocation: none. Ops that need scratch memory take a Scratch that the
// caller sizes once (see Scratch::reserve) and reuses every step.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cpu/paged_kv.h"  // PagedKv, make_contiguous_kv
#include "backend/rope.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace rill::cpu {

// A matrix of n_rows rows with n_cols elements each, rows contiguous at
// `row_stride` bytes. A Linear weight is [out_features = n_rows, in_features = n_cols].
struct WeightView {
  DType dtype = DType::kF32;
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  const void* data = nullptr;
  size_t row_stride = 0;  // bytes; row_bytes(dtype, n_cols) for packed tensors
  // From an FP8 checkpoint (loader/fp8_checkpoint.h): `data` is the
  // dequantized weight, which is all the CPU reads. e4m3 / e4m3_scales, when
  // set, are the same rows as stored (row r: e4m3 + r * n_cols, times
  // e4m3_scales[r]) for backends that keep FP8; a view of other columns
  // drops them.
  bool fp8 = false;
  const uint8_t* e4m3 = nullptr;
  const float* e4m3_scales = nullptr;
};

// Grow-only scratch memory. reserve() may allocate; call it while planning
// (model construction / batch-size change), never inside the per-step path.
class Scratch {
 public:
  void reserve(size_t bytes);
  void* data() { return buf_.data(); }
  size_t size() const { return buf_.size(); }

 private:
  std::vector<uint8_t, std::allocator<uint8_t>> buf_;
};

// Bytes of scratch matmul() needs for `n_tokens` rows of `n_cols` inputs
// against a weight of dtype `w` (the quantized copy of x).
size_t matmul_scratch_bytes(DType w, int64_t n_cols, int64_t n_tokens);

// y[t, r] = sum_c W[r, c] * x[t, c]
// x: [n_tokens, n_cols] f32, y: [n_tokens, n_rows] f32 (y_stride floats per row;
// 0 means n_rows). For quantized W, x is first quantized to the dot-product
// partner type (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for K-quants)
// exactly as llama.cpp does, so results match it bit-for-bit up to summation order.
void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool, Scratch& scratch,
            int64_t y_stride = 0);

// Several weights applied to the same x (q/k/v, gate/up): x is quantized
// once and all their rows go through the pool in one job, so a decode step
// pays one synchronisation instead of n_mats. Every ws[i] must have the
// same n_cols and the same vec_dot_partner type; ys[i]: [n_tokens, ws[i]->n_rows],
// rows y_strides[i] floats apart (y_strides null or 0: n_rows). Results
// equal n_mats separate matmul() calls bit for bit. Scratch as matmul.
inline constexpr int kMaxMatmulGroup = 8;
void matmul_group(const WeightView* const* ws, float* const* ys, int n_mats, const float* x, int64_t n_tokens,
                  ThreadPool& pool, Scratch& scratch, const int64_t* y_strides = nullptr);

// out[i, :] = dequantized row ids[i] of W. out: [n_ids, n_cols] f32.
void get_rows(const WeightView& w, const int32_t* ids, int64_t n_ids, float* out);

// Dequantizes `n` elements (a multiple of the block size) starting at a block boundary.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// out[r, :] = (x[r, :] / rms(x[r, :])) * (weight_offset + w[:])   (w may be null: no scale)
// As ggml: squares in f32 summed in double, eps added to the mean square,
// scale = 1/sqrtf(mean + eps) in f32. out may alias x.
void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps, float* out,
              float weight_offset = 0.0f);

// RoPE angles: the device-neutral table of backend/rope.h.
using RopeTable = rill::RopeTable;

// Rotates x in place. x: [n_tokens, n_heads, head_dim] (row stride
// n_heads*head_dim); only the first rot_dim dims of each head rotate.
void rope(float* x, const int32_t* positions, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
          const RopeTable& table);

// out = silu(gate) * up, elementwise over n floats. out may alias gate.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
// out = gelu_tanh(gate) * up.
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n);
// y += x
void add_inplace(float* y, const float* x, int64_t n);

// Causal attention for the queries of one sequence over its KV.
// q:   [n_q, n_head, head_dim] f32, query i at position q_pos[i]
// kv:  n_kv positions of [n_head_kv, head_dim] in kv_dtype (F32 or F16),
//      key j at position j, rows addressed through kv's block table
//      (kv.row_bytes == n_head_kv * head_dim * dtype size)
// out: [n_q, n_head, head_dim] f32
// Query at position p attends to keys j <= p, and j > p - window when window > 0.
// score = scale * (q . k); softcap > 0 then applies softcap * tanh(score / softcap)
// (Hugging Face order), then a f32 softmax with max subtraction. A query with
// no visible key gets zeros. head_dim <= 512.
struct AttentionParams {
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;
  int64_t window = 0;
  float softcap = 0.0f;
  DType kv_dtype = DType::kF32;
  const float* sinks = nullptr;  // [n_head] sink logits (gpt-oss), F32 KV only; null: none
};
void attention(const float* q, const int32_t* q_pos, int64_t n_q, const PagedKv& kv, int64_t n_kv,
               const AttentionParams& p, float* out, ThreadPool& pool);
// The same with q_stride / out_stride floats from one query's row to the
// next (0: n_head * head_dim), so q may be a view of a fused qkv buffer.
void attention_strided(const float* q, const int32_t* q_pos, int64_t n_q, const PagedKv& kv, int64_t n_kv,
                       const AttentionParams& p, float* out, ThreadPool& pool, int64_t q_stride, int64_t out_stride);

// One sequence's share of a batched attention call (arguments as above).
// decode_from: as BatchSeq::decode_from, queries at positions >= it take the
// decode form where a kernel has two forms (attention_f16.h); -1: the form
// follows n_q (1: decode).
struct AttentionSeq {
  const float* q = nullptr;
  const int32_t* q_pos = nullptr;
  int64_t n_q = 0;
  PagedKv kv;
  int64_t n_kv = 0;
  float* out = nullptr;
  int64_t decode_from = -1;
  int64_t q_stride = 0, out_stride = 0;  // as attention()'s
};

}  // namespace rill::cpu
