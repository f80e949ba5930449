#pragma once
// The arithmetic of the Q8_0 dp4a decode GEMV (q8_dp4a.cu, quant.h:
// q8_dp4a_gemv), stated for the host so restatements (tests) share the
// kernel's work split. Plain C++: no CUDA headers.
//
// For token t and row r of a Q8_0 matrix W [n_rows, n_cols] (n_cols a
// multiple of 32, n_blocks = n_cols / 32):
//  - x: quantize_x8 (quant.h): per token and 32 columns d_x = max |x| / 127
//    (f32, correctly rounded division), q_x = x / d_x rounded to nearest
//    even (|q_x| <= 127; an all-zero block has d_x = 0 and q_x = 0). The
//    codes are stored in the fragment order of quant_mma (a block's bytes
//    8 j .. 8 j + 7 are columns 4 j .. 4 j + 3 and 16 + 4 j .. 16 + 4 j + 3);
//  - unit u = 0 .. 2 n_blocks - 1 of a row: block b = u / 2, half h = u % 2,
//    the 16 columns {4 j .. 4 j + 3, 16 + 4 j .. 16 + 4 j + 3 : j = 2 h,
//    2 h + 1} (bytes 16 h .. 16 h + 15 of the block's x codes);
//    isum(u) = sum over those columns of q_w q_x: exact int32 (|isum| <=
//    16 * 128 * 127 < 2^18, so exact as a float too);
//  - a lane's sum: P = q8_dp4a_parts(n_cols) warps share a row; lane l of
//    part p takes the units u = s, s + 32 P, s + 64 P, ... (s = 32 p + l)
//    in ascending order, from acc = +0:
//        acc = fma(d_w[b], fl(d_x[t, b] * float(isum(u))), acc)
//    (d_w the block's f16 scale as f32; each operation rounded once, to
//    nearest even: __fmul_rn, __fmaf_rn);
//  - a warp's sum: the xor tree, for o = 16, 8, 4, 2, 1 every lane takes
//    v[l] = fl(v[l] + v[l ^ o]); lane 0's value;
//  - the row: s = part 0's sum, then s = fl(s + part p's) for p = 1 .. P - 1;
//    y = s, or fl(y + s) when accumulating.
// Nothing here depends on the other tokens of the launch or on their
// number, nor on how many rows a warp holds: a token's result is the same
// bits at 1 and at 8 tokens (batch invariance, as quant_gemv).
#include <cstdint>

namespace rill::cuda {

inline constexpr int kQ8Dp4aMaxTokens = 8;  // tokens per launch
inline constexpr int kQ8Dp4aUnitCols = 16;  // columns per unit (4 dp4a)

// Warps per row, by the row's length alone: 4 from 4,096 columns (8B-class
// widths: 2 units a lane at 4,096, 7 at 14,336), 2 from 2,048, else 1.
// More warps per row shorten each lane's chain of dependent loads: at one
// token a row per warp leaves the small matrices in half a wave.
constexpr int q8_dp4a_parts(int64_t n_cols) {
  return n_cols >= 4096 ? 4 : n_cols >= 2048 ? 2 : 1;
}

}  // namespace rill::cuda
