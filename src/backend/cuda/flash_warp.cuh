#pragma once
// A warp's two products of FlashAttention-2's loop on mma.sync m16n8k16,
// shared by the prefill kernels that hold Q, the scores and the output in
// registers (attention_flash.cu over the row KV types, attention_chan_flash.cu
// over k4c's blocks): the warp owns 16 query rows; K and V tiles of kKeys
// rows, ld halves a row (a 16-byte pad keeps ldmatrix free of bank
// conflicts), sit in shared memory as f16.
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/mma_tile.cuh"

namespace rill::cuda::detail {

// s (16 rows x kKeys keys: kKeys / 8 fragments of 8 keys) = Q K^T: qf the
// warp's Q A-fragments (HD / 16 steps of 16 dims), k_tile the K tile's
// shared address. Each step's K fragments are loaded before its products.
template <int HD, int kKeys>
__device__ __forceinline__ void warp_qk(float (&s)[kKeys / 8][4], const uint32_t (&qf)[HD / 16][4], uint32_t k_tile,
                                        int ld) {
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
  const int lane = threadIdx.x & 31;
  const uint32_t k_lane =
      k_tile + static_cast<uint32_t>((((lane >> 4) << 3) + (lane & 7)) * ld + (((lane >> 3) & 1) << 3)) * 2;
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) {
    uint32_t b[kKeys / 16][4];
#pragma unroll
    for (int n = 0; n < kKeys / 16; ++n) ldmatrix_x4(b[n], k_lane + static_cast<uint32_t>(n * 16 * ld + k * 16) * 2);
#pragma unroll
    for (int n = 0; n < kKeys / 16; ++n) {
      mma_m16n8k16<__half>(s[2 * n], qf[k][0], qf[k][1], qf[k][2], qf[k][3], b[n][0], b[n][1]);
      mma_m16n8k16<__half>(s[2 * n + 1], qf[k][0], qf[k][1], qf[k][2], qf[k][3], b[n][2], b[n][3]);
    }
  }
}

// The online softmax's step for this lane's two rows (fragment rows lane /
// 4 and lane / 4 + 8), after a tile's scores: mx, each row's maximum over
// this lane's scores (log2 units), becomes the row's over its 4 lanes; m
// the running maximum; base what the probabilities subtract (0 for a row
// with no key yet: every p is then 0); corr the factor for the earlier
// state (0 while m was -inf, 1 where the maximum held); l rescaled by it.
__device__ __forceinline__ void warp_softmax_step(float (&mx)[2], float (&m)[2], float (&l)[2], float (&base)[2],
                                                  float (&corr)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(m[r], mx[r]);
    base[r] = m_new == -INFINITY ? 0.0f : m_new;
    corr[r] = exp2f(m[r] - base[r]);
    l[r] *= corr[r];
    m[r] = m_new;
  }
}

// o (16 rows x HD: HD / 8 fragments) += P V with P = exp2(s - base[row])
// rounded to f16 straight from the score fragments (s in log2 units; each
// lane's two rows' bases), their f16 values added to l (this lane's part of
// each row's sum); v_tile the V tile's shared address, read transposed, its
// fragments loaded four at a time ahead of their products.
template <int HD, int kKeys>
__device__ __forceinline__ void warp_pv(float (&o)[HD / 8][4], const float (&s)[kKeys / 8][4], const float (&base)[2],
                                        float (&l)[2], uint32_t v_tile, int ld) {
  const int lane = threadIdx.x & 31;
  const uint32_t v_lane =
      v_tile + static_cast<uint32_t>(((((lane >> 3) & 1) << 3) + (lane & 7)) * ld + ((lane >> 4) << 3)) * 2;
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    uint32_t pa[4];
    pa[0] = pack_half2(exp2f(s[2 * kk][0] - base[0]), exp2f(s[2 * kk][1] - base[0]), l[0]);
    pa[1] = pack_half2(exp2f(s[2 * kk][2] - base[1]), exp2f(s[2 * kk][3] - base[1]), l[1]);
    pa[2] = pack_half2(exp2f(s[2 * kk + 1][0] - base[0]), exp2f(s[2 * kk + 1][1] - base[0]), l[0]);
    pa[3] = pack_half2(exp2f(s[2 * kk + 1][2] - base[1]), exp2f(s[2 * kk + 1][3] - base[1]), l[1]);
    constexpr int kGroup = 4;
#pragma unroll
    for (int n0 = 0; n0 < HD / 16; n0 += kGroup) {
      uint32_t b[kGroup][4];
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        ldmatrix_x4_trans(b[g], v_lane + static_cast<uint32_t>(kk * 16 * ld + (n0 + g) * 16) * 2);
      }
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        mma_m16n8k16<__half>(o[2 * (n0 + g)], pa[0], pa[1], pa[2], pa[3], b[g][0], b[g][1]);
        mma_m16n8k16<__half>(o[2 * (n0 + g) + 1], pa[0], pa[1], pa[2], pa[3], b[g][2], b[g][3]);
      }
    }
  }
}

}  // namespace rill::cuda::detail
