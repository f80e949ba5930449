// The streaming FP8 GEMV (fp8.h: fp8_gemv_stream, RILL_FP8_GEMV=v2): the
// same sums as fp8_gemv's 16-byte kernel, in the same order, scheduled so
// that a warp always has loads in flight.
//
// Why (static analysis of the sm_90 SASS, docs/perf.md, not measured):
// fp8_gemv issues a round of R x U = 8 16-byte loads per lane, waits for
// all of them, computes (480 instructions a round at one token, 3.75 per
// weight byte), then issues the next round: a warp's loads and its math do
// not overlap, a warp has 2 (qkv, o) to 7 (down) rounds in its life, 113
// registers hold an SM to 16 warps, and qkv's grid is 1.45 waves of blocks
// (gate_up 3.4), the last running the SMs part-empty. A warp moves 4 KB per
// (latency + its share of the math), up to ~1.7 us: 16 warps x 4 KB / 1.7
// us is 38 GB/s an SM against the 32 it needs for 4.25 TB/s. Here:
//  - a ring: each step consumes D items (an item: one 16-byte vector of
//    each of R rows) after issuing the next D, so R x D = 8 loads a lane
//    stay in flight through the math and across row boundaries (a warp
//    moves 4 KB per max(latency, math), not their sum);
//  - one wave: a grid of at most kBlocksPerSm blocks per SM, warp w taking
//    a contiguous, equal share of the row groups (one stream of bytes);
//  - still 16 warps an SM (122-128 registers; three blocks' 80 spill), and
//    a little more issue: at one token (4 x 2) 3.75 instructions a weight
//    byte on a step inside a part, as fp8_gemv's round, 4.28 on a step that
//    starts the next part, of the ~7.9 the SMs issue per byte at 4.25 TB/s.
// The order of a row's sum (what fp8_gemv's contract states) is unchanged:
// lane l takes the vectors l, l + 32, ... of each part of the row (parts
// by fp8_gemv_parts, from the shape alone), each vector's 16 products
// fused into one f32 accumulator in column order; the part's 32 lane sums
// meet by the xor tree (offsets 16, 8, 4, 2, 1); the parts add in order;
// times the row's scale (rounded once); then + y when accumulating. So a
// token's result is fp8_gemv's bits, whatever R, D, the grid and the token
// count are.
#include <cuda_fp8.h>

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/fp8.h"
#include "backend/cuda/ops.h"

namespace rill::cuda {
namespace {

constexpr int kWarps = 8;

// The 16 e4m3 values of u as f32 (exact: e4m3 pairs to f16 pairs, then f32).
__device__ __forceinline__ void unpack16_e4m3(const uint4& u, float* f) {
  const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(words[i] >> (16 * h));
      const float2 g = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
      f[4 * i + 2 * h] = g.x;
      f[4 * i + 2 * h + 1] = g.y;
    }
  }
}

// 16 activations of token row xt from column c as f32 (read-only path).
__device__ __forceinline__ void load16(const __nv_bfloat16* xt, int64_t c, float* f) {
  const uint4* p = reinterpret_cast<const uint4*>(xt + c);
  unpack8(__ldg(p), static_cast<const __nv_bfloat16*>(nullptr), f);
  unpack8(__ldg(p + 1), static_cast<const __nv_bfloat16*>(nullptr), f + 8);
}
__device__ __forceinline__ void load16(const float* xt, int64_t c, float* f) {
  const uint4* p = reinterpret_cast<const uint4*>(xt + c);
#pragma unroll
  for (int i = 0; i < 4; ++i) unpack8(__ldg(p + i), static_cast<const float*>(nullptr), f + 4 * i);
}

// A position in a warp's stream of items: row group g, part p, slot s of
// the part; i = p per + lane + 32 s is the lane's vector and end the
// part's end (i >= end: nothing for this lane). Items run slots, then
// parts, then groups; a cursor moves D slots at a time (a part's slots
// padded to a multiple of D: the padding's vectors lie past the part's
// end, so a step never crosses a part and padding loads and adds nothing).
struct Cursor {
  int64_t g;
  int p, s, i, end;
  __device__ __forceinline__ void start_part(int per, int n_vec, int lane) {
    i = p * per + lane;
    end = (p + 1) * per < n_vec ? (p + 1) * per : n_vec;
  }
  // Returns whether the step ended its group.
  __device__ __forceinline__ bool advance(int d, int n_slots, int n_parts, int per, int n_vec, int lane) {
    s += d;
    i += 32 * d;
    if (s < n_slots) return false;
    s = 0;
    const bool last = ++p == n_parts;
    if (last) {
      p = 0;
      ++g;
    }
    start_part(per, n_vec, lane);
    return last;
  }
};

// Warp w (of W in the grid) takes row groups [w G / W, (w + 1) G / W) of
// G = ceil(n_rows / R) groups of R consecutive rows (the last group's rows
// past n_rows re-read row n_rows - 1 and are not written). The rows'
// scales come 32 rows at a time, lane l holding row c0 + l's, the next 32
// loaded when a chunk starts (R divides 32: a group is in one chunk).
// P > 0 (benchmark variants): before the launch wait the warp also asks L2
// for the P steps after the first (prefetch.global.L2, one 128-byte line
// per 8 lanes: no registers held), so that a warp with few steps (o, qkv:
// 2-4) has more than one step's bytes on their way from DRAM at once.
template <typename T, int N, int R, int D, int kMinBlocks, int P = 0>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    fp8_gemv_stream_kernel(const uint8_t* __restrict__ w, const T* __restrict__ x, int64_t n_rows, int64_t n_cols,
                           int n_parts, float* __restrict__ y, bool accumulate) {
  static_assert(32 % R == 0, "a group's rows in one chunk of scales");
  const int lane = threadIdx.x & 31;
  const int64_t n_warps = int64_t{gridDim.x} * kWarps;
  const int64_t warp = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  const int64_t n_groups = (n_rows + R - 1) / R;
  const int64_t g_begin = warp * n_groups / n_warps, g_end = (warp + 1) * n_groups / n_warps;
  const int n_vec = static_cast<int>(n_cols / 16);
  const int64_t ld = kFp8RowHeader + n_cols;
  // fp8_gemv's parts: `per` vectors each (a multiple of 32), the last short
  const int per = ((n_vec + n_parts - 1) / n_parts + 31) / 32 * 32;
  const int n_slots = (per / 32 + D - 1) / D * D;
  const int64_t n_items = (g_end - g_begin) * n_parts * n_slots;  // a multiple of D

  auto scales_from = [&](int64_t r0) {  // lane l: row r0 + l's scale
    const int64_t r = r0 + lane;
    return r < n_rows && r < g_end * R ? __ldg(reinterpret_cast<const float*>(w + r * ld)) : 0.0f;
  };
  float scales = scales_from(g_begin * R), scales_next = scales_from(g_begin * R + 32);
  int64_t chunk0 = g_begin * R;

  uint4 q[D][R] = {};
  Cursor in{g_begin, 0, 0, 0, 0};
  in.start_part(per, n_vec, lane);
  const uint4* in_rows[R];
  auto rows_of = [&](int64_t g, const uint4** rows) {
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const int64_t r = g * R + k;
      rows[k] = reinterpret_cast<const uint4*>(w + (r < n_rows ? r : n_rows - 1) * ld + kFp8RowHeader);
    }
  };
  auto set_rows = [&]() { rows_of(in.g, in_rows); };
  set_rows();
  // Items [item, item + D): one part of one group.
  auto issue = [&](int64_t item) {
    const bool any = item < n_items;
#pragma unroll
    for (int j = 0; j < D; ++j) {
      const bool load = any && in.i + 32 * j < in.end;
#pragma unroll
      for (int k = 0; k < R; ++k) {
        if (load) q[j][k] = __ldcs(in_rows[k] + in.i + 32 * j);  // else unread: the consumer skips the item too
      }
    }
    if (any && in.advance(D, n_slots, n_parts, per, n_vec, lane)) set_rows();
  };
  // weights are never written: the first D items go out before the wait
  issue(0);
  if constexpr (P > 0) {
    Cursor pf = in;  // the step after the first
    const uint4* pf_rows[R];
    rows_of(pf.g, pf_rows);
#pragma unroll
    for (int step = 1; step <= P; ++step) {
      if (int64_t{step} * D < n_items) {
#pragma unroll
        for (int j = 0; j < D; ++j) {
#pragma unroll
          for (int k = 0; k < R; ++k) {
            if ((lane & 7) == 0 && pf.i + 32 * j < pf.end) {
              asm volatile("prefetch.global.L2 [%0];" ::"l"(pf_rows[k] + pf.i + 32 * j));
            }
          }
        }
        if (pf.advance(D, n_slots, n_parts, per, n_vec, lane)) rows_of(pf.g, pf_rows);
      }
    }
  }
  detail::pdl_wait();
  detail::pdl_trigger();

  Cursor out{g_begin, 0, 0, 0, 0};
  out.start_part(per, n_vec, lane);
  float acc[R][N], sum[R][N];
#pragma unroll
  for (int k = 0; k < R; ++k) {
#pragma unroll
    for (int t = 0; t < N; ++t) acc[k][t] = sum[k][t] = 0.0f;
  }
  for (int64_t base = 0; base < n_items; base += D) {
    uint4 cur[D][R];
#pragma unroll
    for (int j = 0; j < D; ++j) {
#pragma unroll
      for (int k = 0; k < R; ++k) cur[j][k] = q[j][k];
    }
    issue(base + D);  // the next D items in flight through this step's math
#pragma unroll
    for (int j = 0; j < D; ++j) {
      const int i = out.i + 32 * j;
      if (i < out.end) {
#pragma unroll
        for (int t = 0; t < N; ++t) {
          float xf[16];
          load16(x + t * n_cols, int64_t{i} * 16, xf);
#pragma unroll
          for (int k = 0; k < R; ++k) {
            float wf[16];
            unpack16_e4m3(cur[j][k], wf);
#pragma unroll
            for (int e = 0; e < 16; ++e) acc[k][t] = fmaf(wf[e], xf[e], acc[k][t]);
          }
        }
      }
    }
    if (out.s + D == n_slots) {  // the part's last items: its sum, then the next part
#pragma unroll
      for (int k = 0; k < R; ++k) {
#pragma unroll
        for (int t = 0; t < N; ++t) {
          const float s = detail::warp_sum(acc[k][t]);
          sum[k][t] = out.p == 0 ? s : sum[k][t] + s;
          acc[k][t] = 0.0f;
        }
      }
      if (out.p + 1 == n_parts) {  // the group's last part: the rows' results
        const int64_t r0 = out.g * R;
#pragma unroll
        for (int k = 0; k < R; ++k) {
          const float scale = __shfl_sync(0xffffffffu, scales, static_cast<int>(r0 - chunk0) + k);
#pragma unroll
          for (int t = 0; t < N; ++t) {
            if (lane == k * N + t && r0 + k < n_rows) {
              const float s = __fmul_rn(sum[k][t], scale);  // not contracted into the + y
              float* o = y + t * n_rows + r0 + k;
              *o = accumulate ? *o + s : s;
            }
          }
        }
        if (r0 + R == chunk0 + 32) {  // the chunk's last group: the next chunk's scales
          chunk0 += 32;
          scales = scales_next;
          scales_next = scales_from(chunk0 + 32);
        }
      }
    }
    out.advance(D, n_slots, n_parts, per, n_vec, lane);
  }
}

// A grid of at most blocks_per_sm blocks per SM (kMinBlocks: the launch
// bounds, so that many fit in the registers; a larger blocks_per_sm makes
// a second wave, for comparison only).
template <typename T, int N, int R, int D, int kMinBlocks, int P = 0>
void launch_stream(const uint8_t* w, const T* x, int64_t n_rows, int64_t n_cols, float* y, bool accumulate,
                   int blocks_per_sm, cudaStream_t stream) {
  static_assert(R * N <= 32, "one lane per (row, token) result");
  const int n_parts = fp8_gemv_parts(n_rows, n_cols);
  const int64_t n_groups = (n_rows + R - 1) / R;
  const int64_t want = (n_groups + kWarps - 1) / kWarps;
  const int64_t cap = int64_t{blocks_per_sm} * sm_count();
  const auto blocks = static_cast<unsigned>(want < cap ? want : cap);
  launch_pdl(fp8_gemv_stream_kernel<T, N, R, D, kMinBlocks, P>, blocks, kWarps * 32, 0, stream, w, x, n_rows, n_cols,
             n_parts, y, accumulate);
}

// Two blocks (16 warps) per SM: the registers of three spill (ptxas -v).
constexpr int kBlocksPerSm = 2;

// launch_stream for a runtime (R, D) pair among the compiled ones: at one
// token R x D = 8 (and the bench's 4 and 2 loads), from two tokens R = 1
// (the R x N accumulators and an item's x fit without spilling only so).
template <typename T, int N>
void launch_rd(int r, int d, const uint8_t* w, const T* x, int64_t n_rows, int64_t n_cols, float* y, bool accumulate,
               int blocks_per_sm, cudaStream_t stream) {
  auto run = [&](auto kernel_r, auto kernel_d) {
    launch_stream<T, N, decltype(kernel_r)::value, decltype(kernel_d)::value, kBlocksPerSm>(
        w, x, n_rows, n_cols, y, accumulate, blocks_per_sm, stream);
  };
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using I4 = std::integral_constant<int, 4>;
  using I8 = std::integral_constant<int, 8>;
  if constexpr (N == 1) {
    if (r == 1 && d == 8) return run(I1{}, I8{});
    if (r == 2 && d == 4) return run(I2{}, I4{});
    if (r == 4 && d == 2) return run(I4{}, I2{});
    if (r == 4 && d == 1) return run(I4{}, I1{});
    if (r == 2 && d == 2) return run(I2{}, I2{});
  }
  if constexpr (N <= 4) {
    if (r == 1 && d == 4) return run(I1{}, I4{});
  }
  assert(r == 1 && d == 2);
  run(I1{}, I2{});
}

// One token: 8 loads a lane in flight (128 bytes), as 4 rows x 2 items
// (x shared by more rows: at most 4.3 instructions a weight byte in the
// SASS against 4.7 for 2 x 4 and 5.7 for 1 x 8) where the groups of 4 rows keep
// at least half the grid's warps busy, else 2 x 4, else 1 x 8. On the 8B:
// qkv, gate_up and the LM head 4 x 2; o and down (4,096 rows: 1,024 groups
// of 4 for 2,112 warps) 2 x 4 (down's 14 slots a part padded to 16).
int rows_per_item(int64_t n_rows) {
  const int64_t half_the_warps = int64_t{kBlocksPerSm} * sm_count() * kWarps / 2;
  return n_rows / 4 >= half_the_warps ? 4 : n_rows / 2 >= half_the_warps ? 2 : 1;
}

template <typename T>
void launch_tokens(const uint8_t* w, const T* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y,
                   bool accumulate, cudaStream_t stream) {
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kGemvMaxTokens) {
    const int n = static_cast<int>(n_tokens - t0 < kGemvMaxTokens ? n_tokens - t0 : kGemvMaxTokens);
    const T* xt = x + t0 * n_cols;
    float* yt = y + t0 * n_rows;
    switch (n) {
      case 1: {
        const int r = rows_per_item(n_rows);
        launch_rd<T, 1>(r, 8 / r, w, xt, n_rows, n_cols, yt, accumulate, kBlocksPerSm, stream);
        break;
      }
      case 2:
        launch_rd<T, 2>(1, 4, w, xt, n_rows, n_cols, yt, accumulate, kBlocksPerSm, stream);
        break;
      case 3:
        launch_rd<T, 3>(1, 4, w, xt, n_rows, n_cols, yt, accumulate, kBlocksPerSm, stream);
        break;
      case 4:
        launch_rd<T, 4>(1, 4, w, xt, n_rows, n_cols, yt, accumulate, kBlocksPerSm, stream);
        break;
      case 5:
        launch_rd<T, 5>(1, 2, w, xt, n_rows, n_cols, yt, accumulate, kBlocksPerSm, stream);
        break;
      case 6:
        launch_rd<T, 6>(1, 2, w, xt, n_rows, n_cols, yt, accumulate, kBlocksPerSm, stream);
        break;
      case 7:
        launch_rd<T, 7>(1, 2, w, xt, n_rows, n_cols, yt, accumulate, kBlocksPerSm, stream);
        break;
      default:
        launch_rd<T, 8>(1, 2, w, xt, n_rows, n_cols, yt, accumulate, kBlocksPerSm, stream);
        break;
    }
  }
}

// Bench variants: rows an item, items in flight, blocks per SM, steps
// prefetched to L2 before the launch wait.
struct StreamVariant {
  const char* name;
  int r, d, blocks_per_sm, prefetch;
};
constexpr StreamVariant kStreamVariants[] = {
    {"v2 R4D2", 4, 2, 2, 0},     {"v2 R2D4", 2, 4, 2, 0},     {"v2 R1D8", 1, 8, 2, 0},
    {"v2 R4D1", 4, 1, 2, 0},     {"v2 R2D2", 2, 2, 2, 0},     {"v2 R4D2 4/SM", 4, 2, 4, 0},
    {"v2 R4D2 pf1", 4, 2, 2, 1}, {"v2 R4D2 pf3", 4, 2, 2, 3}, {"v2 R2D4 pf1", 2, 4, 2, 1},
};

void launch_variant(const StreamVariant& v, const uint8_t* w, const __nv_bfloat16* x, int64_t n_rows, int64_t n_cols,
                    float* y, cudaStream_t stream) {
  using T = __nv_bfloat16;
  const int b = v.blocks_per_sm;
  if (v.prefetch == 0) {
    launch_rd<T, 1>(v.r, v.d, w, x, n_rows, n_cols, y, false, b, stream);
  } else if (v.r == 4 && v.prefetch == 1) {
    launch_stream<T, 1, 4, 2, kBlocksPerSm, 1>(w, x, n_rows, n_cols, y, false, b, stream);
  } else if (v.r == 4) {
    launch_stream<T, 1, 4, 2, kBlocksPerSm, 3>(w, x, n_rows, n_cols, y, false, b, stream);
  } else {
    launch_stream<T, 1, 2, 4, kBlocksPerSm, 1>(w, x, n_rows, n_cols, y, false, b, stream);
  }
}

}  // namespace

bool fp8_gemv_stream_on() {
  static const bool on = [] {
    const char* e = std::getenv("RILL_FP8_GEMV");
    return e != nullptr && std::strcmp(e, "v2") == 0;
  }();
  return on;
}

void fp8_gemv_stream(const uint8_t* w, DType x_dtype, const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
                     float* y, bool accumulate, cudaStream_t stream) {
  assert(fp8_cols_ok(n_cols) && (x_dtype == DType::kF32 || x_dtype == DType::kBF16));
  if (n_tokens <= 0 || n_rows <= 0) return;
  if (x_dtype == DType::kF32) {
    launch_tokens(w, static_cast<const float*>(x), n_tokens, n_rows, n_cols, y, accumulate, stream);
  } else {
    launch_tokens(w, static_cast<const __nv_bfloat16*>(x), n_tokens, n_rows, n_cols, y, accumulate, stream);
  }
  RILL_CUDA_CHECK_LAUNCH();
}

int fp8_gemv_stream_n_variants() {
  return static_cast<int>(sizeof kStreamVariants / sizeof kStreamVariants[0]);
}

const char* fp8_gemv_stream_variant_name(int variant) {
  return variant >= 0 && variant < fp8_gemv_stream_n_variants() ? kStreamVariants[variant].name : "fp8_gemv_stream";
}

void fp8_gemv_stream_variant(int variant, const uint8_t* w, const void* x_bf16, int64_t n_rows, int64_t n_cols,
                             float* y, cudaStream_t stream) {
  const StreamVariant& v = kStreamVariants[variant >= 0 && variant < fp8_gemv_stream_n_variants() ? variant : 0];
  launch_variant(v, w, static_cast<const __nv_bfloat16*>(x_bf16), n_rows, n_cols, y, stream);
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace rill::cuda
