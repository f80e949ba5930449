#pragma once
// Per-channel bit widths for K ("q4a", the planned K of the KV pair "k4a",
// issue 22): k4c's per-channel K (kKvQ4Chan, backend/cpu/kv_quant.h) with
// each channel c of a layer given its own width b_c in 0..8 bits, the
// layer's widths summing to 4 per channel, so a block keeps q4c's bytes.
// Widths come from calibration statistics (allocate_channel_bits); a
// channel whose keys move the scores more gets more bits. Measured by fake
// quantization (issue 22, 2026-12-05): 34% less KL vs f16 KV than k4c on
// the default model, 52% on its f32 copy.
//
// Stage 1: the building blocks (allocation, the block's encoder and
// decoder, the block's scores for decode). Stage 2: the KV type q4a
// (kKvQ4Alloc, pair k4a) on the CPU, which encodes its blocks with
// quantize_alloc_block and reads them in attention_chan.h; its widths
// come from CpuPagedModel::calibrate_kv.
//
// Block layout ("bit planes") of kKvChanTokens = 32 tokens of a row of
// `width` channels (n_head_kv * head_dim), widths b [width]:
//   z [width] f16 (little-endian), then
//   d [width] e4m3 bytes (the byte of step * 16, as q4c: step = value / 16),
//   then for each channel c in order, b_c planes of 4 bytes: plane k is a
//   little-endian uint32 whose bit j is bit k of token j's code (low bit
//   first: plane 0 is bit 0).
// Token j of channel c decodes as z_c + step_c * code_{j,c}; a channel of
// b_c = 0 has no planes and decodes as z_c for every token (d stored 0).
// Bytes: 3 width + 4 sum(b) (19 width when sum(b) = 4 width, q4c's).
#include <cstdint>

#include "backend/cpu/kv_quant.h"

namespace rill::cpu {

// How RoPE pairs a head's channels: kInterleaved rotates (2i, 2i + 1)
// together (GPT-J / llama.cpp's "normal" mode), kNeox (i, i + head_dim / 2).
enum class RopePairs { kInterleaved, kNeox };

// Channel c's RoPE partner within its head (head_dim even). RoPE rotates
// the first rot_dim channels of each head (rot_dim even, <= head_dim; 0:
// all of them): kNeox pairs (i, i + rot_dim / 2) there; a channel at or
// past rot_dim is not rotated and is its own partner. rotated_pairs >= 0:
// only the first rotated_pairs pairs of those rotate (pair i: kNeox's (i,
// i + rot_dim / 2), kInterleaved's (2i, 2i + 1)), the others at angle 0
// (Gemma 4's proportional RoPE), each channel its own partner there.
int64_t rope_partner(int64_t c, int64_t head_dim, RopePairs pairs, int64_t rot_dim = 0, int64_t rotated_pairs = -1);

// The widths of one layer's K channels. Inputs per channel c of width =
// n_head_kv * head_dim (width a multiple of head_dim, head_dim even):
// query_energy[c] (Q_c, the calibration queries' mean squared value of
// channel c) and mean_sq_range[c] (R_c, the mean over K blocks of (max -
// min)^2 of channel c's 32 values). A channel's weight is
//   w_c = 0.5 * (Q_c + Q_partner(c)) * R_c
// (RoPE mixes a pair's query energy over positions, so both channels of a
// pair see its mean); then, starting from b = 0, 4 * width times one bit
// goes to the channel with the largest w_c * 4^-b_c among those with b_c <
// 8 (each bit quarters a channel's squared step), ties to the lowest
// index. w_c * 4^-b_c is std::ldexp(w_c, -2 b_c) (exact), so the result
// equals that plain loop's, which this does in O(width log width) with a
// heap. Guarantees: widths[c] in 0..8, sum = 4 * width exactly.
// Inputs not finite or negative count as 0; a w_c that overflows counts as
// the largest double. Channels of weight 0 get bits only after every
// weighted channel holds 8 (lowest index first); when every weight is 0
// (no statistics) every channel gets 4 bits (q4c's widths).
//
// one_bit = false: no channel is left at 1 bit (the encoder at 1 bit, its
// two levels fitted to the block's minimum and maximum, does worse than z
// alone: issue 22, stage 1). A channel at 0 then moves to 2 in one move of
// 2 bits, worth w_c (1 - 4^-2) / 2 per bit against w_c 4^-b_c (3/4) of a
// 1-bit move from b_c >= 2; in the plain loop's units (per bit / (3/4)),
// key 0.625 w_c for the move 0 -> 2 and w_c 4^-b_c for b_c >= 2. When one
// bit is left and the top move is 0 -> 2, the bit goes to the best channel
// of 2..7 bits instead (to a channel at 0, as 1 bit, only if none is).
//
// rot_dim, rotated_pairs: the rotated channels of each head, as rope_partner's.
void allocate_channel_bits(const double* query_energy, const double* mean_sq_range, int64_t width, int64_t head_dim,
                           RopePairs pairs, uint8_t* widths, bool one_bit = true, int64_t rot_dim = 0,
                           int64_t rotated_pairs = -1);

// The calibration statistics of one token (backend.h KvCalibrationStats'
// arrays, each [n_head_kv * hd]; one sequence, positions in order): q
// [n_head * hd] and k [n_head_kv * hd] after RoPE. query_energy[c] adds
// q_c^2 of every query head of channel c's KV head; at a block's first
// position block_min / block_max restart, position 0's key is left out
// (the sink key has its own grid), and at a block's last position
// block_range_sq[c] adds (max - min)^2 in double. The CPU backend feeds
// it f32 rows; the CUDA backend its q rows and f32 K rows after RoPE
// (downloaded during the pass: CudaModelBase::calibrate_kv).
void add_calibration_token(double* query_energy, double* block_range_sq, float* block_min, float* block_max,
                           const float* q, const float* k, int32_t pos, int64_t n_head, int64_t n_head_kv, int64_t hd);
// add_calibration_token's query part alone: a layer whose queries read
// another layer's keys (Gemma 4's KV-shared layers) adds them to the
// storing layer's query_energy.
void add_calibration_queries(double* query_energy, const float* q, int64_t n_head, int64_t n_head_kv, int64_t hd);

// Bytes of one block of the layout above: 3 width + 4 sum(widths).
int64_t alloc_block_bytes(const uint8_t* widths, int64_t width);
// The byte offset in a block of channel c's first plane (c <= width; c =
// width gives alloc_block_bytes).
int64_t alloc_plane_offset(const uint8_t* widths, int64_t width, int64_t c);

// Encodes one block: rows [kKvChanTokens][width] f32, src_stride floats
// apart; widths [width] in 0..8; dst alloc_block_bytes(widths, width)
// bytes. Each channel is quantize_chan_values at its width (q4c's
// encoder with L = 2^b - 1 levels; b = 0 z alone; sequence_start: the
// block holds the sequence's position 0, whose key is weighted
// kKvChanSinkWeight times). With every width 4 a block holds the same z,
// d and codes as quantize_chan_block's (only the codes' layout differs).
void quantize_alloc_block(const float* rows, int64_t src_stride, int64_t width, const uint8_t* widths, uint8_t* dst,
                          bool sequence_start = false);
// The inverse: rows [kKvChanTokens][width] dense f32, z + step * code in
// f32 (as dequantize_chan_block: equal values for equal z, d and code).
void dequantize_alloc_block(const uint8_t* src, int64_t width, const uint8_t* widths, float* rows);

// One KV head's part of a block: the channels [head * head_dim, (head + 1)
// * head_dim).
struct AllocHead {
  const uint16_t* z = nullptr;      // [head_dim] f16
  const uint8_t* d = nullptr;       // [head_dim] e4m3 (step * 16)
  const uint8_t* planes = nullptr;  // the head's first channel's first plane
  const uint8_t* widths = nullptr;  // [head_dim]
  int64_t head_dim = 0;
};
// plane_offset: alloc_plane_offset(widths, width, head * head_dim) (a
// kernel computes it once per layer and head, not per block).
AllocHead alloc_head(const uint8_t* block, int64_t width, const uint8_t* widths, int64_t plane_offset, int64_t head,
                     int64_t head_dim);

// The block's 32 scores for n_rows query vectors of one KV head (q [n_rows]
// [head_dim] f32, the head's query heads): scores[r][t] = sum_c q_c
// x_hat_{t,c}, written as q.z + sum_c sum_k (q_c step_c 2^k) bit_k(code_{t,c}),
// so decode adds one weight per set bit and never widens codes.
// Reference order: all in double, exact products q_c * z_c and q_c * step_c
// * 2^k; for each token, q.z summed in channel order, then the planes'
// weights added in channel order, planes low bit first; rounded once to
// f32.
void alloc_block_scores_ref(const AllocHead& h, const float* q, int n_rows, float* scores);

namespace detail {
// AVX-512 (call only when cpu_features().avx512; head_dim a multiple of
// 16), f32: qz = q.z in 16 lanes (channel c in lane c % 16, FMAs in
// channel order), the lanes then summed in lane order; w_c = q_c * step_c
// (f32) and each plane's w_c 2^k (a product by a power of two: exact but
// for under/overflow) added with _mm512_mask_add_ps to two accumulators
// per 16 tokens (planes of even k to one, odd k to the other, so
// consecutive adds do not wait on each other), the masks the plane's low
// and high 16 bits; score = (even + odd) + qz. Against
// alloc_block_scores_ref: within (head_dim + sum(b) + 4) 2^-24 sum_c (|q_c
// z_c| + |q_c step_c| (2^b_c - 1)) (every f32 rounding first order).
void alloc_block_scores_avx512(const AllocHead& h, const float* q, int n_rows, float* scores);
// AVX-512 too, widening first: a channel's 32 codes assembled once from its
// planes (_mm256_mask_add_epi8 of 2^k under plane k's 32-bit mask), widened
// to f32, then one FMA per row and 16 tokens as q4c's group sums: acc +=
// w_c code (channel order), score = acc + qz (qz and w_c as above). Cost
// per channel and block: b_c + 4 + 2 n_rows vector ops against the masked
// adds' 2 b_c n_rows. Same bound as alloc_block_scores_avx512.
void alloc_block_scores_widen_avx512(const AllocHead& h, const float* q, int n_rows, float* scores);
}  // namespace detail

}  // namespace rill::cpu
