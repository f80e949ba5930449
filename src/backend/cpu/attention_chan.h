#pragma once
// Attention over k4c KV (model/kv_types.h): K per channel over each KV
// block of 32 tokens (kKvQ4Chan, backend/cpu/kv_quant.h), V per token in
// any quantized KV type (iq4_nlh64 for k4c), and each sequence's newest
// keys and values in q8_0 (kKvChanTailType: its KV tail, model/kv_tails.h,
// and the step's own rows).
//
// Which keys and values a query reads how, by its position p alone (so its
// bits do not depend on how its sequence was chunked or batched): those of
// the blocks before p's block from the pool (K's quantized groups, V's
// rows); those of p's own block, [p - p % 32, p], from their q8_0 rows
// (those before the step's first position c0 from the tail, the others
// from the step's rows; V rows rotated as the pool's are).
//
// Arithmetic: the query in f32; a quantized group's scores q.k = q.z +
// sum_c (q_c d_c) q_cj (f32; the baseline build sums in channel order, the
// AVX-512 build q.z in 16 lanes then reduced and each token's sum with
// FMAs in channel order); an own-block key's q.k as attention_quant's 8
// partial sums of its q8_0 row decoded to f32; score = scale * q.k, softcap as
// cpu::attention; f32 softmax with max subtraction, the sum in double and
// one f32 reciprocal (the baseline build std::exp and the sum in key
// order; the AVX2 and AVX-512 builds ggml's vector exp, simd::exp_ggml /
// exp_ggml512, over 8 / 16 keys a vector from the query's first key, the
// sum in double lanes reduced in a fixed order: issue 22);
// out = sum_j p_j v_j in f32, the pool's rows then the own block's (AVX-512:
// iq4_nlh64 rows decoded in registers), rotated back when V is rotated.
// The build is chosen per machine, never per call, so a query's bits
// depend only on its position and its KV. One unit is one KV head with all
// its query heads and one query (a sequence's single query: decode) or a
// tile of up to kChanTile consecutive queries of one sequence (prefill):
// a tile decodes each V row once for all its queries and reads each K
// group once (the AVX-512 build widens its codes once per 8 (query, head)
// rows), each query's arithmetic the same, in the same order, as alone (so
// a query's bits do not depend on its tile, nor on the tile size, which
// the driver lowers when a tile's scores would pass a scratch budget).
#include <cstdint>

#include "backend/cpu/attention_quant.h"

namespace rill::cpu {

// One sequence's keys and values of its newest block, rows of width =
// n_head_kv * head_dim elements in kKvChanTailType (row_bytes(kKvChanTailType,
// width) bytes each).
struct ChanTail {
  const uint8_t* tail_k = nullptr;  // [32] rows: positions [c0 - c0 % 32, c0), row r at c0 - c0 % 32 + r
  const uint8_t* tail_v = nullptr;  // [32] rows, as tail_k
  const uint8_t* step_k = nullptr;  // [n_q] rows: the step's, positions c0, c0 + 1, ...
  const uint8_t* step_v = nullptr;  // [n_q] rows, as step_k
  int64_t c0 = 0;                   // the step's first position
};

// seqs[s].kv: K blocks of 32 tokens holding kKvQ4Chan groups (kv.k at
// physical block 0's K region, blocks kv.block_bytes apart, block_shift 5),
// V rows of kv.v_row_bytes (or row_bytes) bytes in type t.v. Queries of
// sequence s sit at positions tails[s].c0 + i (i < n_q). t.k must be
// kKvQ4Chan or kKvQ4Alloc and unrotated; head_dim <= 1024, a multiple of
// 16 and of t.v's block; the row (n_head_kv * head_dim) a multiple of 32.
// q4a (kKvQ4Alloc, backend/cpu/kv_alloc.h): k_widths [n_head_kv *
// head_dim] the layer's widths (null for q4c). Its groups' scores are
// q4c's with each channel's codes read from its bit planes (the baseline
// and AVX2 builds assemble a channel's 32 codes, then q4c's token sums in
// channel order; the AVX-512 build assembles them with masked byte adds
// and widens them once per 8 rows, as alloc_block_scores_widen_avx512);
// channels of 0 bits add nothing (their step is 0). Everything else as
// q4c's.
void attention_chan_batch(const AttentionSeq* seqs, const ChanTail* tails, int n_seqs, const AttentionParams& p,
                          const KvSideTypes& t, ThreadPool& pool, const uint8_t* k_widths = nullptr);

namespace detail {
struct ChanAttendArgs {
  const float* q;                 // [n_heads, head_dim] f32
  PagedKv kv;                     // kv.v at this KV head's first byte of physical block 0
  const uint8_t* k_blocks;        // physical block 0's K region
  const uint8_t* k_widths;        // q4a: this KV head's [head_dim] widths; null: q4c
  int64_t k_plane_offset;         // q4a: alloc_plane_offset of this head's first channel
  int64_t width, head, head_dim;  // KV row elements, this KV head, its size
  size_t tail_row_bytes;          // row_bytes(kKvChanTailType, width)
  int64_t pos, j_begin, j_end;    // the query's position; keys [j_begin, j_end)
  ChanTail tail;
  KvDequant v_dequant;
  DType v_type;  // the AVX-512 build reads iq4_nlh64 rows itself
  int n_heads;
  float scale, softcap;
  float* scores;  // scratch [n_heads, j_end - j_begin]
  float* out;     // [n_heads, head_dim] f32
};
void attend_chan_scalar(const ChanAttendArgs& a);
void attend_chan_avx2(const ChanAttendArgs& a);
void attend_chan_avx512(const ChanAttendArgs& a);

constexpr int kChanTile = 8;  // queries of one tile, at most
// n_q (<= kChanTile) consecutive queries at positions pos, pos + 1, ...:
// query t's at q + t * q_stride, its output at out + t * out_stride (zeros
// where it reads no key), its keys [max(0, p - window + 1) when window > 0
// else 0, min(p + 1, n_kv)). j_begin, j_end and scores are not read (the
// kernel keeps its own scratch).
struct ChanTileArgs : ChanAttendArgs {
  int n_q = 0;
  int64_t q_stride = 0, out_stride = 0, window = 0, n_kv = 0;
};
void attend_chan_tile_scalar(const ChanTileArgs& a);
void attend_chan_tile_avx2(const ChanTileArgs& a);
void attend_chan_tile_avx512(const ChanTileArgs& a);
}  // namespace detail

}  // namespace rill::cpu
