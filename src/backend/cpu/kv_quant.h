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

namespace rill::cpu {

// x = H x / sqrt(n) in place (H the Sylvester-Hadamard matrix of order n, a
// power of two). Orthonormal and symmetric, so applying it twice is the
// identity (within rounding).
void hadamard_rotate(float* x, int64_t n);

// Dtypes a KV side may be stored in: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, IQ4_NL (rotated only: iq4_nlh), F8_E4M3 (kF8E4M3: CUDA's fp8, e4m3
// bytes with no scale).
bool kv_dtype_supported(DType t);

// Quantizes one row of n_head heads of head_dim floats into dst
// (row_bytes(t, n_head * head_dim) bytes, blocks over the whole row);
// rotated: each head Hadamard-rotated, then quantize_rotated_row. The row
// must be whole blocks of t (head_dim a power of two when rotated). src is
// not modified.
void store_kv_row(DType t, bool rotated, const float* src, uint8_t* dst, int64_t n_head, int64_t head_dim);

// The encoder of rotated types (rill's own, kKvRotatedEncoder): one row of n
// already-rotated floats (whole blocks) into blocks of t. Q4_0, Q8_0 and
// IQ4_NL (iq4_nlh: GGML's block, x = d * kIq4nlValues[q]) choose each
// block's levels for the least squared error, then the scale that does not
// shrink the block (x_hat . x = x . x); other types use the reference
// quantizers below (IQ4_NL is rotated only).
void quantize_rotated_row(DType t, const float* x, void* y, int64_t n);
// Bumped whenever quantize_rotated_row's output changes, so KV computed by
// an older encoder is not resumed (Model::kv_numerics names it).
inline constexpr int kKvRotatedEncoder = 2;

namespace ref {
// llama.cpp's reference quantizers of one row of n floats (n a multiple of
// 32) into blocks of t (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; F16/BF16: RNE).
void quantize_kv_row(DType t, const float* x, void* y, int64_t n);
}  // namespace ref

}  // namespace rill::cpu
