#pragma once
// Attention over an f16 KV cache with llama.cpp's rounding, so that GGUF
// models give llama.cpp's tokens: the query is rounded to f16 before the
// q.k dot products, the softmax is normalised in full (max subtraction, sum
// in double) and the probabilities are rounded to f16 before they weight V;
// dot products accumulate in f32. (llama.cpp's non-flash CPU path computes
// K^T q and V p as f16 matrix products this way.) Same arguments and masking
// as cpu::attention with p.kv_dtype == F16.
#include <cstdint>

#include "backend/cpu/ops.h"

namespace rill::cpu {

void attention_f16_rounded(const float* q, const int32_t* q_pos, int64_t n_q, const PagedKv& kv, int64_t n_kv,
                           const AttentionParams& p, float* out, ThreadPool& pool);
// The same for several sequences in one parallel pass over all their
// (query, head) pairs; each pair's result is bit-identical to the call above.
// On AVX-512 a query takes llama.cpp's single-query (decode) arithmetic or
// its batched (prefill) arithmetic, which round differently: the call above
// picks by n_q == 1, this one by AttentionSeq::decode_from when it is set,
// so the bits of a (query, head) depend only on its position and KV.
void attention_f16_rounded_batch(const AttentionSeq* seqs, int n_seqs, const AttentionParams& p, ThreadPool& pool);

namespace detail {
// One (query, head): q16 [head_dim] f16; key j's head_dim f16 elements at
// kv.k_row(j), value at kv.v_row(j) (kv.k / kv.v point at this KV head's
// first element of physical block 0). Only rows [j_begin, j_end) are read.
struct F16AttendArgs {
  const uint16_t* q16;
  PagedKv kv;
  int64_t head_dim, j_begin, j_end;
  float scale, softcap;
  float* scores;              // scratch [j_end - j_begin]
  uint16_t* probs16;          // scratch [j_end - j_begin]
  float* out;                 // [head_dim]
  bool single_query = false;  // the batch has one query (llama.cpp's vec_dot form)
};
// The softmax of a row's scores s[0, n) (overwritten with the exps) as f16
// probabilities p16: the scalar kernel's (expf a key at a time, the sum in
// f64 in order), and the AVX2 kernels' (a vector polynomial within 2 ulp
// of expf, 0 below 2^-126, the sum in f64 over 8 lanes: their own bits).
void softmax_to_f16(float* s, uint16_t* p16, int64_t n);
void softmax_to_f16_avx2(float* s, uint16_t* p16, int64_t n);
void attend_f16_rounded_scalar(const F16AttendArgs& a);
void attend_f16_rounded_avx2(const F16AttendArgs& a);
// Bit-exact with llama.cpp built for AVX-512 (attention_f16_avx512.cpp);
// needs scores/probs16 for keys [0, j_end) and head_dim supported below.
void attend_f16_rounded_avx512(const F16AttendArgs& a);
bool attend_f16_exact_supported(int64_t head_dim);

// The single-query form for n_heads consecutive query heads that share one
// KV head: each head's output bit-identical to attend_f16_rounded_avx512
// with single_query, every K/V row read once for all of them.
inline constexpr int kMaxGroupHeads = 4;
//
// n_kv_heads > 1 takes that many consecutive KV heads (each with n_heads
// query heads, the same arithmetic per head) in one pass: a K/V row holds
// every KV head, so the pass reads each row whole and in order, which the
// hardware prefetchers follow, where one KV head at a time reads a third of
// each row at a stride. q16, scores, probs16 and out then hold
// n_kv_heads * n_heads heads, KV head h's query heads at h * n_heads.
struct F16GroupArgs {
  const uint16_t* q16;  // [n_kv_heads * n_heads, head_dim] f16
  PagedKv kv;           // at the (first) KV head (as F16AttendArgs::kv)
  int64_t head_dim, j_begin, j_end;
  int n_heads;
  float scale, softcap;
  float* scores;           // scratch [n_kv_heads * n_heads, scratch_stride]
  uint16_t* probs16;       // scratch [n_kv_heads * n_heads, scratch_stride]
  int64_t scratch_stride;  // >= j_end
  float* out;              // [n_kv_heads * n_heads, head_dim]
  int n_kv_heads = 1;      // at most kMaxFusedKvHeads
};
inline constexpr int kMaxFusedKvHeads = 8;

// The batched (prefill) form for up to kMaxTileRows (query, head) rows that
// share one KV head, row r seeing keys [j_begin[r], j_end[r]): each row's
// output bit-identical to attend_f16_rounded_avx512 without single_query,
// each K row read once for all rows and each V row once for every few
// (the p.v accumulators of up to 4 rows stay in registers together).
// Prefill at long context reads K and V from L3 or memory once per tile of
// queries instead of once per (query, head).
inline constexpr int kMaxTileRows = 16;
struct F16TileArgs {
  const uint16_t* q16;   // [n_rows, head_dim] f16
  const int64_t* j_end;  // [n_rows]: row r sees keys [j_begin[r], j_end[r]), j_end[r] > j_begin[r]
  PagedKv kv;            // at the KV head (as F16AttendArgs::kv)
  int64_t head_dim;      // attend_f16_exact_supported
  int n_rows;            // 1..kMaxTileRows; rows with close j_end best adjacent
  float scale, softcap;
  float* scores;                     // scratch [n_rows, scratch_stride]
  uint16_t* probs16;                 // scratch [n_rows, scratch_stride]
  int64_t scratch_stride;            // >= every j_end
  float* const* out;                 // [n_rows]: row r's output [head_dim]
  const int64_t* j_begin = nullptr;  // [n_rows] (a sliding window); null: every row from key 0
};
void attend_f16_rounded_tile_avx512(const F16TileArgs& a);
// The same contract over attend_f16_rounded_avx2's arithmetic (each row's
// output bit-identical to it), for head_dims it takes (a multiple of 8 up
// to 256): AVX2 machines, and AVX-512 ones at head_dims the exact kernel
// does not take (attention_f16_tile_avx2.cpp).
bool attend_f16_tile_avx2_supported(int64_t head_dim);
void attend_f16_rounded_tile_avx2(const F16TileArgs& a);
// Most heads one call takes for this head_dim; 0 when the form is unsupported.
int attend_f16_group_max_heads(int64_t head_dim);
void attend_f16_rounded_group_avx512(const F16GroupArgs& a);
}  // namespace detail

}  // namespace rill::cpu
