// fp8_mma: the FP8 weights' GEMM for decode batches of 2..64 tokens (fp8.h),
// on the tensor cores through mma.sync, the row and token scales applied in
// its epilogue (no scale pass), optionally with the GLU there too.
//
// Why f16 mma and not mma...e4m3: on sm_90, ptxas lowers
// mma.sync.m16n8k32.row.col.f32.e4m3.e4m3.f32 to F2FP.F16.E4M3.UNPACK_B
// conversions of both operands (12 a warp per mma) and two HMMA.16816.F32
// (the SASS of CUDA 13.0; Hopper has FP8 arithmetic only in wgmma). So this
// kernel does that conversion itself, once per loaded fragment instead of
// once per mma: each weight pair once (cvt.rn.f16x2.e4m3x2, exact), each
// token's pair once per 32 rows, then mma.m16n8k16 f16 x f16 with f32
// accumulation: the products of the same e4m3 operands cuBLASLt's FP8 GEMM
// multiplies (xq, xs from quantize_fp8_tokens), each exact in f32.
//
// Work: a block (8 warps) owns a slab of kBM = 128 weight rows (GLU: 64
// gate rows and the 64 up rows that pair with them) and one part of the
// columns (split-K where the slabs alone would not fill the SMs: the plan,
// plan_for, depends on the shape and the SM count only), and all the
// tokens (NT tiles of 8, zero-padded). Weights stream from HBM once through
// a kStages-deep cp.async ring of 16-byte copies (128 rows x kKT = 128
// columns a stage) issued before the wait for the previous kernel (weights
// are never written); the tokens' xq (L2-resident) rides in the same stages.
// Warp w takes rows 32 (w % 4) .. + 32 of the slab (two m-tiles) and the
// k-half w / 4 of every stage (64 columns), for all NT token tiles.
//
// Shared memory: a stage is [kBM rows][128 B] of weights then [8 NT
// tokens][128 B] of xq, 16-byte chunk c of row r stored at chunk c ^ 4 (r &
// 1): a quarter-warp's 16-byte fragment loads (rows g, g + 1, same chunk)
// then fall on distinct banks.
//
// Fragments (PTX ISA, mma.m16n8k16 .f16 .row.col; lane = 4 g + t): A a0 =
// (row g, k 2t, 2t+1), a1 = (row g+8, k 2t, 2t+1), a2 = (row g, k 2t+8,
// 2t+9), a3 = (row g+8, k 2t+8, 2t+9); B b0 = (k 2t, 2t+1; column g), b1 =
// (k 2t+8, 2t+9; column g); C c0, c1 = (row g; columns 2t, 2t+1), c2, c3 =
// (row g+8; the same); in each f16 pair the lower k is the low half.
// A k16 step may take any 16 columns as long as A and B agree, so a warp's
// 64 columns of a stage are dealt so that each lane reads 16 contiguous
// bytes: lane (g, t) loads bytes [16 t, 16 t + 16) of the block of rows g
// and g + 8 (weights) and of token g of each token tile (xq); step s (0..3)
// takes 32-bit word s of each load, its bytes p = 0..3 (column 16 t + 4 s +
// p) at k positions 2t, 2t+1, 2t+8, 2t+9: the low 16 bits give a0 / a1 / b0
// and the high 16 bits a2 / a3 / b1 (cvt.rn.f16x2.e4m3x2 puts the low byte
// in the low half).
//
// Summation order of an output (row r, token t), fixed by the shape: per
// column part, per k-half warp the HMMA chain over its k16 steps in stage
// order; then k-half 0 + k-half 1; then the parts in order (fp8_mma_reduce
// for a split). The token count and a token's place among the tokens never
// enter it (a column of an mma's result depends on its B column alone), so
// a token's result is the same bits alone and in any batch (fp8.h's
// contract). Then y = sum x xs[t] x ws[r] (+ y), as fp8_scale_rows does.
#include <cuda_fp8.h>

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/fp8.h"
#include "backend/cuda/fp8_glu.cuh"
#include "backend/cuda/mma_tile.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/smem_opt_in.h"

namespace rill::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBM = 128;  // weight rows of a slab
constexpr int kKT = 128;  // columns (e4m3 bytes) of a stage
// Ring depth: 4 stages with e4m3 x (two blocks of 96 KB an SM at 64
// tokens), 3 with bf16 x (its x doubles the stage: 96 KB).
template <bool kXb>
inline constexpr int kStagesOf = kXb ? 3 : 4;
constexpr int kTileLd = kBM + 4;  // floats per token of the epilogue tile
constexpr int kMaxSplit = 8;

enum Final : int { kToY = 0, kToGlu = 1 };

struct MmaParams {
  const uint8_t* w;                       // kFp8Rows [n_rows, n_cols]
  const float* ws;                        // its scales
  const uint8_t* x;                       // [n_tokens, n_cols]: e4m3 codes (xq), or bf16 x (x_bf16)
  const float* xs;                        // [n_tokens] e4m3 codes' scales; null with bf16 x
  int64_t n_rows, n_cols, ld, x_ld;       // x_ld: bytes per token of x
  int64_t n_ff;                           // GLU: n_rows / 2 (gate rows [0, n_ff), up rows [n_ff, 2 n_ff)); else 0
  int n_tokens;                           // at most kFp8MmaMaxTokens
  int n_slabs, n_parts, chunks_per_part;  // the plan (Plan)
  int final_out;                          // Final
  bool accumulate, gelu;
  float* part;  // split-K: [parts][n_tokens][n_rows] sums before the scales
  float* y;     // kToY: [n_tokens, n_rows]
  void* out;    // kToGlu: [n_tokens, n_ff] in out_dtype
  DType out_dtype;
};

// Global row of slab row lr (0..kBM): plain, the slab's rows in order;
// GLU, rows [0, 64) are gate rows slab 64 + lr, rows [64, 128) the up rows
// n_ff + slab 64 + lr - 64 (the same outputs of the GLU).
__device__ __forceinline__ int64_t slab_row(const MmaParams& p, int64_t slab, int lr, bool& valid) {
  if (p.n_ff > 0) {
    const int64_t i = slab * (kBM / 2) + (lr & (kBM / 2 - 1));
    valid = i < p.n_ff;
    return lr < kBM / 2 ? i : p.n_ff + i;
  }
  const int64_t r = slab * kBM + lr;
  valid = r < p.n_rows;
  return r;
}

// Byte offset of 16-byte chunk c (0..7) of row r in a stage's region.
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return static_cast<uint32_t>(r * kKT + ((c ^ ((r & 1) << 2)) << 4));
}

// The same for the tokens' x: e4m3 rows as weight rows; bf16 rows of 256
// bytes (16 chunks) with chunk c of token r at c ^ (r & 1) (a lane reads
// chunks 2 c' and 2 c' + 1: rows g, g + 1 of a quarter-warp then fall on
// even and odd chunks).
template <bool kXb>
__device__ __forceinline__ uint32_t xswz(int r, int c) {
  if constexpr (kXb) {
    return static_cast<uint32_t>(r * 2 * kKT + ((c ^ (r & 1)) << 4));
  } else {
    return swz(r, c);
  }
}

// The two e4m3 values of the low 16 bits of v as an f16 pair (exact), the
// low byte in the low half.
__device__ __forceinline__ uint32_t f16x2_of(uint32_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// The same as a bf16 pair (exact: an e4m3 value has 4 significant bits
// and an exponent within bf16's range; e4m3 -> f16 -> f32 -> bf16).
__device__ __forceinline__ uint32_t bf16x2_of(uint32_t v) {
  const uint32_t h = f16x2_of(v);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// threadIdx.x read afresh: asm volatile is not hoisted out of the main
// loop, so what the copies derive from it is recomputed there (a few
// integer ops) instead of held in registers through the mma steps.
__device__ __forceinline__ int fresh_tid() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

__device__ __forceinline__ uint32_t word(const uint4& u, int s) {
  return s == 0 ? u.x : s == 1 ? u.y : s == 2 ? u.z : u.w;
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void store_out(const MmaParams& p, int64_t i, float v) {
  if (p.out_dtype == DType::kF32) {
    static_cast<float*>(p.out)[i] = v;
  } else if (p.out_dtype == DType::kF16) {
    static_cast<__half*>(p.out)[i] = detail::from_f32<__half>(v);
  } else {
    static_cast<__nv_bfloat16*>(p.out)[i] = detail::from_f32<__nv_bfloat16>(v);
  }
}

// sum x xs[t] x ws[r], rounded after each product (no contraction with an
// add that follows: y + scaled(...) is y + the overwriting result).
__device__ __forceinline__ float scaled(float sum, float xs, float ws) {
  return __fmul_rn(__fmul_rn(sum, xs), ws);
}

__device__ __forceinline__ float glu(const MmaParams& p, float g, float u) {
  return p.gelu ? detail::fp8_glu_times<true>(g, u) : detail::fp8_glu_times<false>(g, u);
}

template <int NT, bool kXb>
constexpr size_t smem_bytes() {
  const size_t ring = size_t{kStagesOf<kXb>} * (kBM + 8 * NT * (kXb ? 2 : 1)) * kKT;
  const size_t tile = size_t{8} * NT * kTileLd * 4;
  return ring > tile ? ring : tile;
}

// One slab x one column part, blockIdx.x = part x n_slabs + slab (one
// grid dimension: with blockIdx.y the part's values sat in vector
// registers and spilled at NT = 8); p.n_parts > 1: the part's sums go to
// p.part for fp8_mma_reduce_kernel, else the scaled result (or the GLU)
// goes out here. kXb: x is bf16 (p.xs null): the weights go to bf16
// instead of f16 and x is taken as it is.
//
// Registers: __launch_bounds__(256, 2) gives 128; at NT = 8 the sums (64),
// a stage's fragments (ra 16, rb 32) and a step's A (8) leave a handful,
// so at NT >= 5 nothing per-thread that a few integer ops recompute is
// held through the loop (loop_tid), and the copies' addresses are a
// block-wide base plus a 32-bit offset, not arrays of 64-bit pointers
// (issue 23: those spilled 80-84 B at NT = 7, 8, reloaded 18 times a
// stage; now the e4m3 form spills nothing, the bf16 form 16-24 B at NT =
// 6..8, one accumulator tile around the x loads, 4 registers over).
template <int NT, bool kXb>
__global__ void __launch_bounds__(kThreads, 2) fp8_mma_kernel(const MmaParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kStages = kStagesOf<kXb>;
  constexpr int kNP = 8 * NT;                               // tokens, padded
  constexpr int kXBytes = kXb ? 2 : 1;                      // bytes of an x element
  constexpr int kXChunks = kKT * kXBytes / 16;              // 16-byte chunks of a token a stage
  constexpr int kStageBytes = (kBM + kNP * kXBytes) * kKT;  // a stage: weights, then x
  constexpr int kALoads = kBM * (kKT / 16) / kThreads;      // 16-byte copies a thread a stage
  constexpr int kBChunks = kNP * kXChunks;
  constexpr int kBLoads = (kBChunks + kThreads - 1) / kThreads;
  using MmaT = std::conditional_t<kXb, __nv_bfloat16, __half>;
  static_assert(kThreads % kXChunks == 0 && kALoads * kThreads == kBM * (kKT / 16), "copies per thread");
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // threadIdx.x in the main loop: afresh where registers are tight (NT >=
  // 5, see fresh_tid), else the value held (fewer instructions a stage).
  auto loop_tid = [&] { return NT >= 5 ? fresh_tid() : tid; };
  const int g = lane >> 2, t = lane & 3;
  const int rg = warp & 3, kh = warp >> 2;
  const int kp = static_cast<int>(blockIdx.x) / p.n_slabs;
  const int64_t slab = static_cast<int>(blockIdx.x) - kp * p.n_slabs;
  const int n_chunks = static_cast<int>((p.n_cols + kKT - 1) / kKT);
  const int c_begin = kp * p.chunks_per_part;
  const int n_iter = min(n_chunks, c_begin + p.chunks_per_part) - c_begin;
  const uint32_t sbase = detail::smem_addr(smem);

  // This thread's copies: 16-byte chunk cc of slab rows lr + 32 i (lr =
  // tid / 8) and chunk cb of tokens tok + kTokStep i (tok = tid / kXChunks),
  // each address a block-wide base (the rows' or x's start at the stage's
  // column) plus a 32-bit offset (run_chunks asserts it fits). Row lr + 32 i
  // has lr's parity, so its slot is swz(lr, cc) + i 32 kKT, a token's
  // likewise (kTokStep even); slab rows [0, 64) are global rows row0[0] +
  // 0..63, rows [64, 128) row0[1] + 0..63 (slab_row: plain, row0[0] + 64;
  // GLU, the up rows), of which the first n_ok[h] exist. Rows and tokens
  // out of range copy zeros (from the matrix's or x's first bytes, a valid
  // address).
  constexpr int kTokStep = kThreads / kXChunks;
  static_assert(kALoads == 4 && kTokStep % 2 == 0, "two rows of each half; a token's parity kept");
  const uint8_t* a_rows[2];  // block-wide: row0[h]'s bytes
  int n_ok[2];               // slab rows of half h that exist, 0..64
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    bool unused = false;
    const int64_t row0 = slab_row(p, slab, kBM / 2 * h, unused);
    a_rows[h] = p.w + row0 * p.ld;
    const int64_t end = h == 0 && p.n_ff > 0 ? p.n_ff : p.n_rows;
    n_ok[h] = static_cast<int>(max(int64_t{0}, min(end - row0, int64_t{kBM / 2})));
  }
  const int n_cols_left = static_cast<int>(p.n_cols) - c_begin * kKT;  // columns from the part's start
  auto load_w = [&](int it) {
    const int tid_now = loop_tid(), cc = tid_now & 7, lr = tid_now >> 3;
    const uint32_t a_off = static_cast<uint32_t>(lr) * static_cast<uint32_t>(p.ld) + kFp8RowHeader + cc * 16;
    const uint32_t a_dst = swz(lr, cc);
    const bool in = cc * 16 + it * kKT < n_cols_left;  // n_cols % 16 == 0: a chunk is whole or out
    const uint32_t slot = sbase + static_cast<uint32_t>((it % kStages) * kStageBytes);
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const int h = i >> 1, step = 32 * (i & 1);
      const bool ok = lr + step < n_ok[h] && in;
      const uint8_t* rows = a_rows[h] + int64_t{c_begin + it} * kKT;
      const uint32_t off = a_off + static_cast<uint32_t>(step) * static_cast<uint32_t>(p.ld);
      detail::cp_async16(slot + a_dst + i * 32 * kKT, ok ? rows + off : p.w, ok);
    }
  };
  auto load_x = [&](int it) {
    const int tid_now = loop_tid(), cb = tid_now % kXChunks, tok = tid_now / kXChunks;
    const uint32_t b_off = static_cast<uint32_t>(tok) * static_cast<uint32_t>(p.x_ld) + cb * 16;
    const uint32_t b_dst = kBM * kKT + xswz<kXb>(tok, cb);
    const bool in = cb * 16 / kXBytes + it * kKT < n_cols_left;  // whole 8s: a chunk is whole or out
    const uint32_t slot = sbase + static_cast<uint32_t>((it % kStages) * kStageBytes);
#pragma unroll
    for (int i = 0; i < kBLoads; ++i) {
      if (kThreads * (i + 1) > kBChunks && tid_now + kThreads * i >= kBChunks) continue;  // past the padded tokens
      const bool ok = tok + kTokStep * i < p.n_tokens && in;
      const uint8_t* cols = p.x + int64_t{c_begin + it} * kKT * kXBytes;
      const uint32_t off = b_off + static_cast<uint32_t>(kTokStep * i) * static_cast<uint32_t>(p.x_ld);
      detail::cp_async16(slot + b_dst + i * kTokStep * kXChunks * 16, ok ? cols + off : p.x, ok);
    }
  };

  // The first stages' weights before the wait; xq is the previous kernel's
  // output. Group s holds stage s's xq (group 0 also the weights of the
  // first kStages - 1 stages), so waiting for group it covers stage it.
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_iter) load_w(s);
  }
  detail::pdl_wait();
  detail::pdl_trigger();
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_iter) load_x(s);
    detail::cp_async_commit();
  }

  float acc[2][NT][4];
#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.0f;
    }
  }
  for (int it = 0; it < n_iter; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage it landed for every thread; slot (it - 1) % kStages is free
    const int next = it + kStages - 1;
    if (next < n_iter) {
      load_w(next);
      load_x(next);
    }
    detail::cp_async_commit();

    const uint8_t* st = smem + (it % kStages) * kStageBytes;
    // This lane's rows g (+ 32 rg) and chunk, from threadIdx.x afresh (fresh_tid).
    const int tid_now = loop_tid(), g_now = (tid_now & 31) >> 2;
    const int row_now = 32 * ((tid_now >> 5) & 3) + g_now, chunk_now = 4 * (tid_now >> 7) + (tid_now & 3);
    uint4 ra[2][2];  // [m-tile][rows g, g + 8]
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        ra[m][h] = *reinterpret_cast<const uint4*>(st + swz(row_now + 16 * m + 8 * h, chunk_now));
      }
    }
    // Step s's A fragments of both m-tiles (word s of each row's 16 bytes).
    auto a_frags = [&](int s, uint32_t(&a)[2][4]) {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const uint32_t lo = word(ra[m][0], s), hi = word(ra[m][1], s);
        if constexpr (kXb) {
          a[m][0] = bf16x2_of(lo);
          a[m][1] = bf16x2_of(hi);
          a[m][2] = bf16x2_of(lo >> 16);
          a[m][3] = bf16x2_of(hi >> 16);
        } else {
          a[m][0] = f16x2_of(lo);
          a[m][1] = f16x2_of(hi);
          a[m][2] = f16x2_of(lo >> 16);
          a[m][3] = f16x2_of(hi >> 16);
        }
      }
    };
    if constexpr (!kXb) {
      uint4 rb[NT];  // token g of each tile: its 16 e4m3 bytes
#pragma unroll
      for (int j = 0; j < NT; ++j)
        rb[j] = *reinterpret_cast<const uint4*>(st + kBM * kKT + swz(8 * j + g_now, chunk_now));
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        uint32_t a[2][4];
        a_frags(s, a);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint32_t wb = word(rb[j], s);
          const uint32_t b0 = f16x2_of(wb), b1 = f16x2_of(wb >> 16);
#pragma unroll
          for (int m = 0; m < 2; ++m) mma_m16n8k16<MmaT>(acc[m][j], a[m][0], a[m][1], a[m][2], a[m][3], b0, b1);
        }
      }
    } else {
      // Token g's 16 columns are 32 bytes of bf16: chunk 2 chunk + hs holds
      // columns 8 hs .. 8 hs + 7, steps 2 hs and 2 hs + 1 (b0 word 2 s2,
      // b1 word 2 s2 + 1 of it).
#pragma unroll
      for (int hs = 0; hs < 2; ++hs) {
        uint4 rb[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          rb[j] = *reinterpret_cast<const uint4*>(st + kBM * kKT + xswz<true>(8 * j + g_now, 2 * chunk_now + hs));
        }
#pragma unroll
        for (int s2 = 0; s2 < 2; ++s2) {
          uint32_t a[2][4];
          a_frags(2 * hs + s2, a);
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const uint32_t b0 = word(rb[j], 2 * s2), b1 = word(rb[j], 2 * s2 + 1);
#pragma unroll
            for (int m = 0; m < 2; ++m) mma_m16n8k16<MmaT>(acc[m][j], a[m][0], a[m][1], a[m][2], a[m][3], b0, b1);
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: the tile takes its place

  // The slab's sums, [kNP tokens][kTileLd] (token-major: the stores below
  // run along rows), k-half 0 + k-half 1.
  float* tile = reinterpret_cast<float*>(smem);
  auto at = [&](int m, int j, int e) -> float& {
    const int lr = 32 * rg + 16 * m + g + 8 * (e >> 1), tok = 8 * j + 2 * t + (e & 1);
    return tile[tok * kTileLd + lr];
  };
  if (kh == 1) {
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) at(m, j, e) = acc[m][j][e];
      }
    }
  }
  __syncthreads();
  if (kh == 0) {
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) at(m, j, e) = acc[m][j][e] + at(m, j, e);
      }
    }
  }
  __syncthreads();

  const int n = p.n_tokens;
  if (p.n_parts > 1) {
    float* part = p.part + static_cast<int64_t>(kp) * n * p.n_rows;
    for (int i = tid; i < n * kBM; i += kThreads) {
      const int tok = i / kBM, lr = i % kBM;
      bool ok = false;
      const int64_t row = slab_row(p, slab, lr, ok);
      if (ok) part[tok * p.n_rows + row] = tile[tok * kTileLd + lr];
    }
  } else if (p.final_out == kToY) {
    for (int i = tid; i < n * kBM; i += kThreads) {
      const int tok = i / kBM, lr = i % kBM;
      bool ok = false;
      const int64_t row = slab_row(p, slab, lr, ok);
      if (!ok) continue;
      const float v = scaled(tile[tok * kTileLd + lr], p.xs ? p.xs[tok] : 1.0f, p.ws[row]);
      float* yp = p.y + tok * p.n_rows + row;
      *yp = p.accumulate ? __fadd_rn(*yp, v) : v;
    }
  } else {
    for (int i = tid; i < n * kBM; i += kThreads) {
      const int tok = i / kBM, lr = i % kBM;
      bool ok = false;
      const int64_t row = slab_row(p, slab, lr, ok);
      if (ok) tile[tok * kTileLd + lr] = scaled(tile[tok * kTileLd + lr], p.xs ? p.xs[tok] : 1.0f, p.ws[row]);
    }
    __syncthreads();
    for (int i = tid; i < n * (kBM / 2); i += kThreads) {
      const int tok = i / (kBM / 2), c = i % (kBM / 2);
      const int64_t gi = slab * (kBM / 2) + c;
      if (gi < p.n_ff) {
        store_out(p, tok * p.n_ff + gi, glu(p, tile[tok * kTileLd + c], tile[tok * kTileLd + kBM / 2 + c]));
      }
    }
  }
}

// The parts of a split in order (part 0 + part 1 + ...), then the scales
// and y or the GLU, as fp8_mma_kernel's unsplit epilogue.
__global__ void __launch_bounds__(256) fp8_mma_reduce_kernel(const MmaParams p, int n_parts) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t n = p.n_tokens, rows = p.n_rows, per_part = n * rows;
  auto sum = [&](int64_t tok, int64_t row) {
    const float* q = p.part + tok * rows + row;
    float v = q[0];
    for (int k = 1; k < n_parts; ++k) v += q[k * per_part];
    return v;
  };
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (p.final_out == kToY) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < per_part; i += stride) {
      const int64_t tok = i / rows, row = i - tok * rows;
      const float v = scaled(sum(tok, row), p.xs ? p.xs[tok] : 1.0f, p.ws[row]);
      float* yp = p.y + i;
      *yp = p.accumulate ? __fadd_rn(*yp, v) : v;
    }
  } else {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n * p.n_ff; i += stride) {
      const int64_t tok = i / p.n_ff, c = i - tok * p.n_ff;
      const float xt = p.xs ? p.xs[tok] : 1.0f;
      const float gv = scaled(sum(tok, c), xt, p.ws[c]);
      const float uv = scaled(sum(tok, p.n_ff + c), xt, p.ws[p.n_ff + c]);
      store_out(p, i, glu(p, gv, uv));
    }
  }
}

// How a shape is cut: slabs of kBM rows (GLU: 64 gate/up pairs), and the
// columns in `ksplit` parts of chunks_per_part stages where the slabs alone
// would leave SMs idle. The split is the k (at most kMaxSplit, and only
// while the blocks fit one wave of two an SM) that minimises the busiest
// SM's share of the bytes, ceil(blocks / SMs) / blocks, the smaller k on
// a tie: at 132 SMs o and down (32 slabs) take 4 parts, 128 blocks of
// 1/128 each, where "about one block per SM" (5 parts, 160 blocks) left
// 28 SMs streaming two 1/160 shares, 1/80 of the matrix; qkv (48 slabs)
// takes 5. One wave keeps parts x rows within 2 x 132 x 128, which
// Fp8Scratch's 40,960 rows a token cover. From the shape, the SM count and
// the benchmark's override alone.
struct Plan {
  int64_t n_slabs;
  int ksplit, chunks_per_part;
};

Plan plan_for(int64_t n_rows, int64_t n_cols, bool glu, int ksplit_override) {
  Plan pl{};
  pl.n_slabs = glu ? (n_rows / 2 + kBM / 2 - 1) / (kBM / 2) : (n_rows + kBM - 1) / kBM;
  const int64_t n_chunks = (n_cols + kKT - 1) / kKT;
  const int64_t max_k = std::min<int64_t>(kMaxSplit, n_chunks);
  int64_t want = 1;
  if (ksplit_override > 0) {
    want = std::clamp<int64_t>(ksplit_override, 1, max_k);
  } else {
    const int64_t sms = sm_count();
    // The busiest SM's share, ceil(blocks / sms) / blocks, compared as
    // cross products (k grows only while the blocks fit one wave).
    for (int64_t k = 2; k <= max_k && pl.n_slabs * k <= 2 * sms; ++k) {
      const int64_t b = pl.n_slabs * k, bw = pl.n_slabs * want;
      if ((b + sms - 1) / sms * bw < (bw + sms - 1) / sms * b) want = k;
    }
  }
  const int64_t per = (n_chunks + want - 1) / want;
  pl.chunks_per_part = static_cast<int>(per);
  pl.ksplit = static_cast<int>((n_chunks + per - 1) / per);
  return pl;
}

template <int NT, bool kXb>
void launch_nt(const MmaParams& p, const Plan& pl, cudaStream_t stream) {
  constexpr size_t kSmem = smem_bytes<NT, kXb>();
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(fp8_mma_kernel<NT, kXb>), kSmem, true);
  launch_pdl(fp8_mma_kernel<NT, kXb>, static_cast<unsigned>(pl.n_slabs * pl.ksplit), kThreads, kSmem, stream, p);
}

template <bool kXb>
void launch(const MmaParams& p, const Plan& pl, cudaStream_t stream) {
  switch ((p.n_tokens + 7) / 8) {
    case 1:
      launch_nt<1, kXb>(p, pl, stream);
      break;
    case 2:
      launch_nt<2, kXb>(p, pl, stream);
      break;
    case 3:
      launch_nt<3, kXb>(p, pl, stream);
      break;
    case 4:
      launch_nt<4, kXb>(p, pl, stream);
      break;
    case 5:
      launch_nt<5, kXb>(p, pl, stream);
      break;
    case 6:
      launch_nt<6, kXb>(p, pl, stream);
      break;
    case 7:
      launch_nt<7, kXb>(p, pl, stream);
      break;
    default:
      launch_nt<8, kXb>(p, pl, stream);
      break;
  }
}

// p for up to kFp8MmaMaxTokens tokens.
void run(const MmaParams& p, const Plan& pl, cudaStream_t stream) {
  if (p.xs) {
    launch<false>(p, pl, stream);
  } else {
    launch<true>(p, pl, stream);
  }
  if (pl.ksplit > 1) {
    const int64_t outs = int64_t{p.n_tokens} * (p.final_out == kToY ? p.n_rows : p.n_ff);
    const auto blocks = static_cast<unsigned>(std::clamp<int64_t>((outs + 255) / 256, 1, int64_t{sm_count()} * 8));
    launch_pdl(fp8_mma_reduce_kernel, blocks, 256, 0, stream, p, pl.ksplit);
  }
  RILL_CUDA_CHECK_LAUNCH();
}

// fp8_mma and fp8_mma_glu: chunks of kFp8MmaMaxTokens tokens.
void run_chunks(MmaParams p, int64_t n_tokens, int ksplit, size_t out_elem, int64_t part_floats, cudaStream_t stream) {
  const Plan pl = plan_for(p.n_rows, p.n_cols, p.n_ff > 0, ksplit);
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kFp8MmaMaxTokens) {
    MmaParams c = p;
    c.n_tokens = static_cast<int>(std::min<int64_t>(kFp8MmaMaxTokens, n_tokens - t0));
    // fp8_mma_kernel's 32-bit copy offsets: a slab's rows, the tokens' x.
    assert(kBM * p.ld < (int64_t{1} << 32) && int64_t{kFp8MmaMaxTokens} * p.x_ld < (int64_t{1} << 32));
    c.n_slabs = static_cast<int>(pl.n_slabs);
    c.n_parts = pl.ksplit;
    c.chunks_per_part = pl.chunks_per_part;
    c.x = p.x + t0 * p.x_ld;
    c.xs = p.xs ? p.xs + t0 : nullptr;
    if (p.y) c.y = p.y + t0 * p.n_rows;
    if (p.out) c.out = static_cast<uint8_t*>(p.out) + static_cast<size_t>(t0 * p.n_ff) * out_elem;
    assert(pl.ksplit == 1 || (p.part && int64_t{pl.ksplit} * c.n_tokens * p.n_rows <= part_floats));
    (void)part_floats;
    run(c, pl, stream);
  }
}

// xs null: x is bf16.
MmaParams params(const uint8_t* w, const void* x, const float* xs, int64_t n_rows, int64_t n_cols, float* part) {
  MmaParams p{};
  p.w = w;
  p.ws = fp8_scales(w, n_rows, n_cols);
  p.x = static_cast<const uint8_t*>(x);
  p.xs = xs;
  p.x_ld = xs ? n_cols : 2 * n_cols;
  p.n_rows = n_rows;
  p.n_cols = n_cols;
  p.ld = static_cast<int64_t>(fp8_row_bytes(n_cols));
  p.part = part;
  return p;
}

}  // namespace

bool fp8_mma_on() {
  static const bool on = [] {
    const char* e = std::getenv("RILL_FP8_MMA");
    return e != nullptr && (std::strcmp(e, "1") == 0 || std::strcmp(e, "2") == 0);
  }();
  return on;
}

Fp8MmaTokens fp8_mma_tokens() {
  static const Fp8MmaTokens range = [] {
    Fp8MmaTokens r;
    const char* e = std::getenv("RILL_FP8_MMA_TOKENS");
    if (e == nullptr) return r;
    int lo = 0, hi = 0, used = 0;
    if (std::sscanf(e, "%d-%d%n", &lo, &hi, &used) == 2 && e[used] == '\0' && lo >= 2 && lo <= hi &&
        hi <= kFp8MmaMaxTokens) {
      r.lo = lo;
      r.hi = hi;
    } else {
      std::fprintf(stderr, "RILL_FP8_MMA_TOKENS=%s ignored: want LO-HI with 2 <= LO <= HI <= %d\n", e,
                   static_cast<int>(kFp8MmaMaxTokens));
    }
    return r;
  }();
  return range;
}

bool fp8_mma_bf16x_on() {
  static const bool on = [] {
    const char* e = std::getenv("RILL_FP8_MMA");
    return e != nullptr && std::strcmp(e, "2") == 0;
  }();
  return on;
}

int64_t fp8_mma_part_floats(int64_t n_tokens, int64_t n_rows, int64_t n_cols, bool glu, int ksplit) {
  const Plan pl = plan_for(n_rows, n_cols, glu, ksplit);
  return pl.ksplit > 1 ? int64_t{pl.ksplit} * std::min(n_tokens, kFp8MmaMaxTokens) * n_rows : 0;
}

void fp8_mma(const uint8_t* w, const uint8_t* xq, const float* xs, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
             float* y, bool accumulate, float* part, int64_t part_floats, cudaStream_t stream, int ksplit) {
  assert(fp8_cols_ok(n_cols));
  if (n_tokens <= 0 || n_rows <= 0) return;
  MmaParams p = params(w, xq, xs, n_rows, n_cols, part);
  p.final_out = kToY;
  p.accumulate = accumulate;
  p.y = y;
  run_chunks(p, n_tokens, ksplit, 0, part_floats, stream);
}

void fp8_mma_bf16x(const uint8_t* w, const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y,
                   bool accumulate, float* part, int64_t part_floats, cudaStream_t stream, int ksplit) {
  assert(fp8_cols_ok(n_cols));
  if (n_tokens <= 0 || n_rows <= 0) return;
  MmaParams p = params(w, x, nullptr, n_rows, n_cols, part);
  p.final_out = kToY;
  p.accumulate = accumulate;
  p.y = y;
  run_chunks(p, n_tokens, ksplit, 0, part_floats, stream);
}

void fp8_mma_glu_bf16x(const uint8_t* w, const void* x, int64_t n_tokens, int64_t n_rows, int64_t n_cols, bool gelu,
                       DType out_dtype, void* out, float* part, int64_t part_floats, cudaStream_t stream, int ksplit) {
  assert(fp8_cols_ok(n_cols) && n_rows % 2 == 0);
  if (n_tokens <= 0 || n_rows <= 0) return;
  MmaParams p = params(w, x, nullptr, n_rows, n_cols, part);
  p.n_ff = n_rows / 2;
  p.final_out = kToGlu;
  p.gelu = gelu;
  p.out = out;
  p.out_dtype = out_dtype;
  run_chunks(p, n_tokens, ksplit, out_dtype == DType::kF32 ? 4 : 2, part_floats, stream);
}

void fp8_mma_glu(const uint8_t* w, const uint8_t* xq, const float* xs, int64_t n_tokens, int64_t n_rows, int64_t n_cols,
                 bool gelu, DType out_dtype, void* out, float* part, int64_t part_floats, cudaStream_t stream,
                 int ksplit) {
  assert(fp8_cols_ok(n_cols) && n_rows % 2 == 0);
  if (n_tokens <= 0 || n_rows <= 0) return;
  MmaParams p = params(w, xq, xs, n_rows, n_cols, part);
  p.n_ff = n_rows / 2;
  p.final_out = kToGlu;
  p.gelu = gelu;
  p.out = out;
  p.out_dtype = out_dtype;
  run_chunks(p, n_tokens, ksplit, out_dtype == DType::kF32 ? 4 : 2, part_floats, stream);
}

}  // namespace rill::cuda
