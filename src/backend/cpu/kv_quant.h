#pragma once
// Storing K/V rows in the KV cache's types (model/kv_types.h) and reading
// them back: the quantizers are llama.cpp's reference ones (quantize_row_*_ref:
// the block layouts of backend/cpu/quants.h, scale from the block's absolute
// or signed maximum, f16 scales), so a stored block equals what the gguf
// package's quantize() makes of the same floats. Rotated types apply the
// orthonormal Walsh-Hadamard transform to each head first and are encoded
// by quantize_rotated_row (their own levels and scales: no GGUF file holds
// them).
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/e4m3.h"

namespace rill::cpu {

// x = H x / sqrt(n) in place (H the Sylvester-Hadamard matrix of order n, a
// power of two). Orthonormal and symmetric, so applying it twice is the
// identity (within rounding).
void hadamard_rotate(float* x, int64_t n);

// Dtypes a KV side may be stored in: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, IQ4_NL (rotated only: iq4_nlh), F8_E4M3 (kF8E4M3: CUDA's fp8, e4m3
// bytes with no scale), and k4c's two (core/dtype.h): kKvIq4Nl64 (rotated
// only: iq4_nlh64) and kKvQ4Chan (K only, per block: quantize_chan_block),
// kKvQ4Alloc (k4a's K only, per block: kv_alloc.h quantize_alloc_block)
// and kKvQ8_0x64 (rotated only: q8_0h64).
bool kv_dtype_supported(DType t);

// Quantizes one row of n_head heads of head_dim floats into dst
// (row_bytes(t, n_head * head_dim) bytes, blocks over the whole row);
// rotated: each head Hadamard-rotated, then quantize_rotated_row. The row
// must be whole blocks of t (head_dim a power of two when rotated). src is
// not modified.
void store_kv_row(DType t, bool rotated, const float* src, uint8_t* dst, int64_t n_head, int64_t head_dim);

// Bytes of one iq4_nlh64 block of 64 values (kKvIq4Nl64).
inline constexpr int kIq4Nl64Bytes = 33;
// Bytes of one q8_0h64 block of 64 values (kKvQ8_0x64): the f16 scale d
// (little-endian, bytes 0..1), then the int8 codes of elements 0..63
// (bytes 2..65), x = d * q, q in -127..127.
inline constexpr int kQ8_0x64Bytes = 66;

// The encoder of rotated types (rill's own, kKvRotatedEncoder): one row of n
// already-rotated floats (whole blocks) into blocks of t. Q4_0, Q8_0 and
// IQ4_NL (iq4_nlh: GGML's block, x = d * kIq4nlValues[q]) choose each
// block's levels for the least squared error, then the scale that does not
// shrink the block (x_hat . x = x . x); other types use the reference
// quantizers below (IQ4_NL is rotated only).
void quantize_rotated_row(DType t, const float* x, void* y, int64_t n);
// kKvIq4Nl64 (iq4_nlh64, k4c's V): blocks of 64 with the same search over
// iq4_nl's levels, d stored as the e4m3 byte of d * 16 (round to nearest
// even), the candidates' errors with d as stored.
// kKvQ8_0x64 (q8_0h64): q8_0h's search (levels -127..127, f16 d) over
// blocks of 64: one scale for 64 values saves 0.25 bits a value, and a
// rotated head's blocks hold near-Gaussian values whose largest of 64 is
// only a little larger than the largest of 32 (docs/perf.md, "q8_0h64").
// Bumped whenever quantize_rotated_row's output changes, so KV computed by
// an older encoder is not resumed (Model::kv_numerics names it).
inline constexpr int kKvRotatedEncoder = 2;

// k4c's K (kKvQ4Chan, KIVI-style: docs/perf.md "per-channel K"): the K of
// one KV block of kKvChanTokens tokens, quantized per channel over the
// block's tokens after RoPE (not rotated): channel c's values are z_c + d_c
// q, q in 0..15. The block's K region (19 * width bytes, width = the
// row's elements) holds z [width] f16, then d [width] e4m3 bytes (d_c =
// e4m3_value(byte) / 16, 2^-13 .. 28), then q [width][16] bytes (token j <
// 16 in the low nibble of byte j, token j + 16 in its high nibble).
// Encoder: with z0 the largest f16 <= the channel's minimum, the e4m3
// steps d (codes 1..0x7e) nearest (max - z0) / 15, one below and three
// above are tried, each with z = z0 and with z refit to f16(mean(x - d q))
// (q from z0); codes q = nearbyint((x - z) * (1 / d)) in f32, clamped to
// 0..15; the least squared error wins (the first tried on ties). A channel
// of one value has d = 0 (code 0) and q = 0.
// The sequence's first block (sequence_start: token 0 is the sequence's
// position 0) also tries, for each step d, the 16 grids through token 0's
// value, z = f16(x_0 - d q) for q = 0..15, and weighs token 0's squared
// error kKvChanSinkWeight times in every candidate's error: position 0 is
// the attention sink, the key nearly every head of every later query gives
// a large weight, so its K error moves every softmax (docs/perf.md,
// "k4c's sink key", 2026-12-04: -30% KL on the default model at the same
// bytes). Its key is then held to z's f16 rounding instead of half a step,
// at some cost to the block's other 31 keys.
inline constexpr int kKvChanTokens = 32;
inline constexpr double kKvChanSinkWeight = 1024.0;
// rows: [kKvChanTokens][width] f32, src_stride floats apart.
void quantize_chan_block(const float* rows, int64_t src_stride, int64_t width, uint8_t* dst,
                         bool sequence_start = false);
// The inverse (f32 z + d q): rows [kKvChanTokens][width], dense.
void dequantize_chan_block(const uint8_t* src, int64_t width, float* rows);
// One channel of a per-channel K block: quantize_chan_block's encoder above
// for one channel's kKvChanTokens values at `bits` bits (codes 0..L, L =
// 2^bits - 1, in place of 0..15 everywhere: the steps around (max - z0) /
// L, the sink's 2^bits grids). bits = 4 is k4c's channel, bit for bit
// (quantize_chan_block calls it); other widths serve the per-channel bit
// widths of backend/cpu/kv_alloc.h. bits = 0 stores z alone (d = 0, every
// code 0): z = f16 of the values' mean (of token 0's value when
// sequence_start), or, when that is not finite, the f16 at or below the
// minimum as coded widths fall back to. Non-finite values as coded widths
// handle them: NaNs are left out of the minimum and maximum, and a
// candidate whose error is not finite never wins, so a channel holding
// one keeps z at or below its minimum with d = 0.
inline constexpr int kKvChanMaxBits = 8;
struct ChanCodes {
  uint16_t z = 0;                 // f16 bits
  uint8_t d = 0;                  // e4m3 byte of the step * 16
  uint8_t q[kKvChanTokens] = {};  // token j's code, 0..2^bits - 1
};
void quantize_chan_values(const float* values, int bits, bool sequence_start, ChanCodes* out);
// Bumped whenever quantize_chan_block's output changes (as kKvRotatedEncoder),
// or what k4c's KV is computed from: revision 2 keeps the tail's keys and
// values in q8_0 (kKvChanTailType), so a block is encoded from q8_0 rows
// and a query reads its own block's values at 8 bits; revision 3 holds the
// sequence's first key on its channels' grids (sequence_start above).
inline constexpr int kKvChanEncoder = 3;

// k4c's tail rows (each sequence's newest partial block, model/kv_tails.h,
// and a step's rows before its attention): K and V of one token, each one
// q8_0 row of the layer's width (llama.cpp's reference quantizer; V
// Hadamard-rotated per head first when the pool's V is rotated, so it is
// read in the same basis). Why q8_0 and not f16 K alone: a query's own
// block's values at 8 bits instead of 4 lower k4c's KL on every text
// measured, by 18% on average (docs/perf.md, "k4c's tail in q8_0"), and K and V in q8_0
// cost 408 bytes a token of a 192-wide row against f16 K's 384, so the
// tail stays within 3.5x f16's tokens per GiB at 2k context. Needs the
// row (n_head * head_dim) a multiple of 32.
inline constexpr DType kKvChanTailType = DType::kQ8_0;
// One K and one V tail row of a layer of n_head heads of head_dim: k from
// k (unrotated), v from v (rotated per head when v_rotated); src unchanged.
void store_chan_tail_rows(const float* k, const float* v, bool v_rotated, int64_t n_head, int64_t head_dim,
                          uint8_t* k_dst, uint8_t* v_dst);

namespace ref {
// llama.cpp's reference quantizers of one row of n floats (n a multiple of
// 32) into blocks of t (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; F16/BF16: RNE).
void quantize_kv_row(DType t, const float* x, void* y, int64_t n);
}  // namespace ref

}  // namespace rill::cpu
