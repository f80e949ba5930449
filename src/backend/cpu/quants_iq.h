#pragma once
// Scalar reference for the low-bit GGUF types Q2_K, Q3_K, IQ4_NL and IQ4_XS
// (block layouts in quants.h): dequantization as GGML's dequantize_row_*,
// and dot products with their vec_dot_partner activations in the f32 order
// of llama.cpp's x86 (AVX2 and AVX-512 builds) vec_dot, so the SIMD tiles of
// gemm_iquant_x86_impl.h can equal them bit for bit:
//  - integer sums per 8 lanes, lane l holding the products of elements
//    4l..4l+3 of every 32-element chunk (exact in any order), each times its
//    sub-block scale;
//  - Q2_K, Q3_K: per super-block acc[l] = fma(a.d * w.d, lane_l, acc[l])
//    (Q2_K first acc[l] = fma(-a.d * w.dmin, mn[2l] bsums[2l] + mn[2l+1] bsums[2l+1], acc[l]));
//  - IQ4_NL: blocks in pairs, even blocks into acc1, odd into acc2, the sum
//    hsum8(acc1 + acc2), then an odd last block as sum = fma(d, its integer sum, sum);
//  - hsum8: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
// Except IQ4_XS, defined as the K-quants are (quants_ref.cpp): one exact
// int32 per super-block, acc = fma(w.d * a.d, float(isum), acc).
// Called through ref::dequantize_row / ref::vec_dot (quants_ref.cpp).
#include <cstdint>

#include "core/dtype.h"

namespace rill::cpu::ref::iq {

// nb blocks of type t (one of the four) to f32.
void dequantize(DType t, const void* src, float* dst, int64_t nb);
// nb blocks of weight type t against nb blocks of vec_dot_partner(t).
float vec_dot(DType t, int64_t nb, const void* w, const void* a);

}  // namespace rill::cpu::ref::iq
