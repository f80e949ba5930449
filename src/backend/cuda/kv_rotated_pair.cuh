#pragma once
// The rotated encoder of the blocks of 64 (q8_0h64, iq4_nlh64) by a pair of
// warps: kv_rotated.cuh's search (fit_rotated_block, the CPU's fit_scale)
// laid out for latency, with its per-warp scratch. Same bits as the CPU's.
#include <cstdint>

#include "backend/cuda/kv_rotated.cuh"

namespace rill::cuda::detail {

// What each warp of a pair hands the other (fit_rotated_block64_pair): its
// best candidate's error, index and scale bits.
struct PairExchange {
  double err;
  int c;
  uint16_t d;
};

// A warp's scratch in fit_rotated_block64_pair: kPairRows rows of a
// block's 64 per-element terms, each row summed in index order by one lane.
// Rows are 66 doubles apart, so the lanes' 16-byte reads of rows 0..7 fall
// in distinct banks. In dynamic shared memory after the heads (rope_store_kv
// adds one a warp for the blocks of 64; pair_scratch finds it), as
// RotatedScratch is for the blocks of 32.
constexpr int kPairRows = 9, kPairRowStride = 66;
struct __align__(16) PairScratch {
  double terms[kPairRows * kPairRowStride];
};
// Warp threadIdx.x / 32's scratch when the caller's dynamic shared memory
// holds n floats at x (16-byte aligned, n a multiple of 64) and then
// blockDim.x / 32 PairScratch.
__device__ __forceinline__ PairScratch& pair_scratch(const float* x, int n) {
  return reinterpret_cast<PairScratch*>(const_cast<float*>(x) + n)[threadIdx.x >> 5];
}

// Row lane % K's sum of its 64 terms in index order (the CPU's sequence):
// lane r < K holds row r's; the other lanes' values are unused. The rows
// are written (and __syncwarp'd) before; the caller __syncwarps before it
// writes them again.
template <int K>
__device__ __forceinline__ double pair_row_sum(const PairScratch& s) {
  static_assert(K <= kPairRows, "PairScratch holds kPairRows rows");
  const auto* row = reinterpret_cast<const double2*>(s.terms + ((threadIdx.x & 31) % K) * kPairRowStride);
  double sum = 0.0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const double2 two = row[j];
    sum = __dadd_rn(__dadd_rn(sum, two.x), two.y);
  }
  return sum;
}

// The rotated encoder of the blocks of 64 (q8_0h64: UniformLevels and
// F16Scale, cpu::quantize_q8_0x64_fit; iq4_nlh64: Iq4nlLevels and
// E4m3x16Scale, cpu::quantize_iq4_nl64_fit: the candidates' errors with d
// as its e4m3 byte gives it back): fit_rotated_block's search over one
// block of 64 already-rotated floats x (shared memory) by two warps, the
// same bytes as the CPU's fit_scale.
//
// Built for latency (at batch 1 a decode step stores a handful of blocks,
// so the store's time is its longest dependent chain, docs/perf.md): the
// CPU's error of a candidate is a serial f64 sum over the block, and a sum
// whose terms are computed inside the serial loop issues each term's
// arithmetic (a scale, a level search, an FMA, a multiply) on the chain.
// Here the terms come first, in parallel, and the serial part is only the
// adds. Warp `half` scores candidates 17 half .. 17 half + 16 (onto the
// first level, then the last) in two rounds of 9 and 8: every lane
// computes its two elements' squared errors for each candidate of the
// round (elements lane and lane + 32) into the warp's scratch (s), then
// lane i adds up candidate i's row in index order. The warps swap their
// best through slot[0] / slot[1] (a __syncthreads: every thread of the
// thread block calls this function as often), and each goes on with the
// same winner: its x . v and v . v (the refit's sums) and x . x as three
// rows, then the refit's error and x . v as two. Each term is the CPU's:
// x - v * d is one f64 FMA (v * d is exact in f32: a level of at most 8
// bits times a scale of at most 11), x . v, v . v and x . x are exact
// products; e * e is rounded, then added. The first of least error wins
// (NaN errors never do).
// No branch depends on the data: a block of zeros (m == 0, the CPU's early
// return) is selected at the end, and the refit is always scored, so the
// shuffles never sit under a branch the compiler cannot prove uniform
// (which makes it wrap each in a convergence loop). Both warps return the
// block; callers store warp 0's.
template <class Levels, class Scale = F16Scale>
__device__ __forceinline__ RotatedBlock<64> fit_rotated_block64_pair(const float* x, const Levels& lv, int half,
                                                                     PairExchange (&slot)[2], PairScratch& s,
                                                                     Scale sc = {}) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  const float v[2] = {x[lane], x[lane + 32]};
  const double xd[2] = {static_cast<double>(v[0]), static_cast<double>(v[1])};
  const float m = signed_absmax<2>(v);
  const int zero_code = lv.code(0.0f);
  // Lane i < 17: candidate 17 half + i's stored scale, its value and inverse.
  uint16_t lane_dh = 0;
  float lane_d = 0.0f, lane_id = 0.0f;
  if (lane < 17) {
    const float top = half == 0 ? lv.first() : lv.last();
    const float factor = __fsub_rn(1.0f, __fmul_rn(0.025f, static_cast<float>(lane)));
    lane_dh = sc.round(__fmul_rn(__fdiv_rn(m, top), factor));
    lane_d = sc.value(lane_dh);
    lane_id = lane_d != 0.0f ? __fdiv_rn(1.0f, lane_d) : 0.0f;
  }
  double best = INFINITY;
  int best_c = 64;
  uint16_t best_d = 0;
#pragma unroll
  for (int round = 0; round < 2; ++round) {
    const int first = round * kPairRows, count = round == 0 ? kPairRows : 17 - kPairRows;
#pragma unroll
    for (int i = 0; i < count; ++i) {
      const float d = __shfl_sync(kAll, lane_d, first + i), id = __shfl_sync(kAll, lane_id, first + i);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const double e = __fma_rn(-lv.level_d(__fmul_rn(v[k], id)), static_cast<double>(d), xd[k]);
        s.terms[i * kPairRowStride + lane + 32 * k] = __dmul_rn(e, e);
      }
    }
    __syncwarp();
    const double err = pair_row_sum<kPairRows>(s);  // lane i < count: candidate first + i
    const uint16_t dh = static_cast<uint16_t>(__shfl_sync(kAll, static_cast<int>(lane_dh), (first + lane) & 31));
    __syncwarp();                                  // the rows are read before the next round writes them
    const bool wins = lane < count && err < best;  // a later round's candidate wins only by less error
    best = wins ? err : best;
    best_c = wins ? 17 * half + first + lane : best_c;
    best_d = wins ? dh : best_d;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const double ob = __shfl_xor_sync(kAll, best, o);
    const int oc = __shfl_xor_sync(kAll, best_c, o);
    const uint16_t od = static_cast<uint16_t>(__shfl_xor_sync(kAll, static_cast<int>(best_d), o));
    const bool take = ob < best || (ob == best && oc < best_c);
    best = take ? ob : best;
    best_c = take ? oc : best_c;
    best_d = take ? od : best_d;
  }
  if (lane == 0) slot[half] = PairExchange{best, best_c, best_d};
  __syncthreads();
  {
    const PairExchange o = slot[half ^ 1];  // the first of least (error, c): warp 0's candidates on ties
    const bool take = o.err < best || (o.err == best && o.c < best_c);
    best = take ? o.err : best;
    best_c = take ? o.c : best_c;
    best_d = take ? o.d : best_d;
  }
  // The winner's codes; with no candidate (NaN in the block, or every
  // scale overflowing its format) the codes of 0 and d 0 unless the refit
  // wins, the CPU's, whose refit sums are then over the codes of 0.
  const bool found = best_c < 64;
  const float d_best = sc.value(best_d);
  const float id = found && d_best != 0.0f ? __fdiv_rn(1.0f, d_best) : 0.0f;
  int q[2];
  double vq[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float y = found ? __fmul_rn(v[k], id) : 0.0f;
    q[k] = lv.code(y);
    vq[k] = lv.level_d(y);
    s.terms[0 * kPairRowStride + lane + 32 * k] = __dmul_rn(xd[k], vq[k]);  // exact, as the next two
    s.terms[1 * kPairRowStride + lane + 32 * k] = __dmul_rn(vq[k], vq[k]);
    s.terms[2 * kPairRowStride + lane + 32 * k] = __dmul_rn(xd[k], xd[k]);
  }
  __syncwarp();
  const double sums = pair_row_sum<3>(s);
  const double xq = __shfl_sync(kAll, sums, 0), qq = __shfl_sync(kAll, sums, 1), xx = __shfl_sync(kAll, sums, 2);
  __syncwarp();
  // The least-squares refit of d to those codes, a 35th candidate when
  // qq > 0 (scored either way); the final x . v is over the stored codes.
  const uint16_t dh_r = sc.round(__double2float_rn(__ddiv_rn(xq, qq)));
  const float d_r = sc.value(dh_r);
  const float id_r = d_r != 0.0f ? __fdiv_rn(1.0f, d_r) : 0.0f;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const double vr = lv.level_d(__fmul_rn(v[k], id_r));
    const double e = __fma_rn(-vr, static_cast<double>(d_r), xd[k]);
    s.terms[0 * kPairRowStride + lane + 32 * k] = __dmul_rn(e, e);
    s.terms[1 * kPairRowStride + lane + 32 * k] = __dmul_rn(xd[k], vr);
  }
  __syncwarp();
  const double r = pair_row_sum<2>(s);
  const double err_r = __shfl_sync(kAll, r, 0), xq_r = __shfl_sync(kAll, r, 1);
  __syncwarp();
  const bool refit = qq > 0.0 && err_r < best;
  const uint16_t dh = refit ? dh_r : best_d;
  const double xq_final = refit ? xq_r : xq;
  RotatedBlock<64> out;
  out.d = xq_final != 0.0 ? sc.round(__double2float_rn(__ddiv_rn(xx, xq_final))) : dh;
#pragma unroll
  for (int k = 0; k < 2; ++k) out.q[k] = refit ? lv.code(__fmul_rn(v[k], id_r)) : q[k];
  if (m == 0.0f) {  // a block of zeros (or NaNs only): d = +0, the codes of 0, as the CPU returns early
    out.d = 0;
    out.q[0] = out.q[1] = zero_code;
  }
  return out;
}

}  // namespace rill::cuda::detail
