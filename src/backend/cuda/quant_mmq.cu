// quant_mma's sums for up to 64 tokens with the blocks and x staged in
// shared memory (quant.h: quant_mmq; quant_matmul takes it from 9 tokens
// on tall matrices).
//
// Why: quant_mma's thread block owns 16 rows, so every block reads all of
// x's codes and scales through L1 (at 64 tokens on a 6,144 x 4,096 Q8_0
// matrix ~120 MB for 26.7 MB of weights) and its 2-byte weight loads touch
// 8 rows' lines a warp instruction: it lost to dequantize + cuBLASLt, which
// moves 5 bytes a weight. Here a block owns kRows = 16 kRowTiles rows and
// every token: per stage of kChunkCols columns it copies (cp.async, 16 and
// 8 bytes, a ring of kStages stages) its rows' blocks as stored, the
// tokens' codes and their scales into shared memory; x's bytes cross L2
// once a block, not once a 16 rows. Warp w multiplies row tile w %
// kRowTiles with kRowTiles tiles of 8 tokens (token group w / kRowTiles).
//
// The order of every sum is quant_mma's (quant_mma_units.cuh): a row's
// units are cut into kSplit ranges, each accumulated in unit order with
// the same decode, mma and `apply` steps, and the ranges' sums added in
// range order. quant_mma runs one warp a range; here one warp walks every
// range of its rows in turn, folding each range's sum into the running
// total as it closes (the first one taken as is, empty ranges as +0).
// So a (row, token) gets the same bits from either kernel at any token
// count: quant_matmul's int8 path stays batch invariant per row. The
// cluster variant (kClusterSplit, quant.h's k_split 8) gives each range a
// block of its own instead, for matrices whose row slabs alone leave SMs
// idle, and adds the ranges' sums in the same order at the end.
//
// Layout of a stage in shared memory: the rows' raw bytes (kRows x
// kRowBytes: a row's stage bytes, kChunkBytes, where they are a multiple
// of 16: Q8_0 272, Q4_K 144, rows g of a warp's 8 on distinct banks; Q6_K's
// 210-byte super-block, only 2-byte aligned in W, is staged as the 224
// bytes of 16-byte pieces that hold it, read from its offset in the first
// piece), then x's codes (64 tokens at kXStride
// bytes: the 8-byte fragment loads of 16 lanes hit distinct banks), then
// the scales as [32-column block][token] float2 (a lane's two tokens 2 t,
// 2 t + 1 are one 16-byte load).
#include <cooperative_groups.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/mma_tile.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/quant.h"
#include "backend/cuda/quant_mma_units.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace rill::cuda {
namespace {

namespace cg = cooperative_groups;
using namespace mma_units;
using detail::cp_async;
using detail::cp_async_commit;
using detail::cp_async_wait_one;
using detail::smem_addr;

constexpr int kThreads = 256;  // 8 warps
constexpr int kStages = 3;     // cp_async_wait_one: stage c + 2 loads while c is used
constexpr int kChunkCols = 256;
constexpr int kChunkBlocks = kChunkCols / 32;
constexpr int kTok = static_cast<int>(kMmaMaxTokens);
constexpr int kXStride = kChunkCols + 32;
static_assert(kTok == 64, "8 tiles of 8 tokens: kRowTiles warps a row tile share them");

template <class Q, int kRowTiles>
struct MmqLayout {
  static constexpr int kUnits = kChunkCols / Q::kCols;                    // units a stage
  static constexpr int kChunkBytes = kChunkCols / Q::kElems * Q::kBytes;  // one row's bytes a stage, in W
  // Whether a stage's bytes start 16-byte aligned in every row (W's rows
  // are, quant_mmq_fits); else (Q6_K) the pieces holding them, with room
  // for the largest offset, 14.
  static constexpr bool kAligned = kChunkBytes % 16 == 0;
  static constexpr int kRowBytes = kAligned ? kChunkBytes : (kChunkBytes + 14 + 15) / 16 * 16;
  static constexpr int kRows = 16 * kRowTiles;
  static constexpr int kW = kRows * kRowBytes;
  static constexpr int kX = kTok * kXStride;
  static constexpr int kDs = kChunkBlocks * kTok * 8;
  static constexpr int kStage = kW + kX + kDs;
  static constexpr int kBytes = kStages * kStage;
  static_assert(kRowBytes % 16 == 0 && kW % 16 == 0, "16-byte copies of whole rows");
  static_assert(kChunkCols % Q::kCols == 0, "whole units a stage");
};

// Folds a closed range's sums into the running total (the first range's
// is the total), as quant_mma adds its warps' sums: s = r0; s = s + r_p.
template <int kTiles>
__device__ __forceinline__ void fold(float (&acc)[kTiles][4], float (&total)[kTiles][4], int range) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      total[j][e] = range == 0 ? acc[j][e] : __fadd_rn(total[j][e], acc[j][e]);
      acc[j][e] = 0.0f;
    }
  }
}

// kClusterSplit: a cluster of kSplit blocks (grid y, cluster rank = range)
// a row slab, block r walking range r alone; the ranges' sums then meet
// in the cluster's shared memory and are added in range order (below).
template <class Q, int kRowTiles, bool kClusterSplit>
__global__ void __launch_bounds__(kThreads)
    quant_mmq_kernel(const uint8_t* __restrict__ w, const int8_t* __restrict__ xq, const float2* __restrict__ xds,
                     int n_tok, int64_t n_rows, int64_t n_cols, float* __restrict__ y, int64_t y_stride,
                     bool accumulate) {
  static_assert(!(Q::kHalves && Q::kMin), "a type with 16-column scales and a min term");
  using Lay = MmqLayout<Q, kRowTiles>;
  constexpr int kTiles = kRowTiles;  // tiles of 8 tokens a warp: 8 warps over kRowTiles x (8 / kRowTiles)
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int rt = warp % kRowTiles, tile0 = (warp / kRowTiles) * kTiles;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * Lay::kRows;
  const int64_t row_bytes = n_cols / Q::kElems * Q::kBytes;
  const int64_t x_blocks = n_cols / 32;
  const int n_units = static_cast<int>(n_cols / Q::kCols);
  const int per = (n_units + kSplit - 1) / kSplit;
  const int tok_used = min(kTok, (n_tok + 7) & ~7);  // tokens of the tiles that run
  // The units (and the stages holding them) this block walks: every one,
  // or with kClusterSplit its range's (none for a range past the row).
  int u_begin = 0, u_end = n_units, c_begin = 0, n_mine = static_cast<int>(n_cols / kChunkCols);
  if constexpr (kClusterSplit) {
    u_begin = min(n_units, static_cast<int>(cg::this_cluster().block_rank()) * per);
    u_end = min(n_units, u_begin + per);
    c_begin = u_begin / Lay::kUnits;
    n_mine = (u_end + Lay::kUnits - 1) / Lay::kUnits - c_begin;
  }

  // Stage `chunk` into ring slot `slot`, the rows' blocks (stage_w) apart
  // from x (stage_x): the first stages' blocks are copied before
  // pdl_wait, as they do not depend on the kernel before. Rows past
  // n_rows and tokens past n_tok copy the last valid one (read, never
  // written back).
  auto slot_at = [&](int slot) { return smem + slot * Lay::kStage; };
  // Where row r's stage `chunk` starts in W, and (unaligned types) its
  // offset in the first 16-byte piece staged.
  auto w_at = [&](int64_t row, int chunk) { return row * row_bytes + static_cast<int64_t>(chunk) * Lay::kChunkBytes; };
  const int64_t w_bytes = n_rows * row_bytes;
  auto stage_w = [&](int chunk, int slot) {
    const uint32_t sw = smem_addr(slot_at(slot));
    constexpr int kPieces = Lay::kRowBytes / 16;
    for (int i = threadIdx.x; i < Lay::kRows * kPieces; i += kThreads) {
      const int r = i / kPieces, p = i - r * kPieces;
      const int64_t row = min(row0 + r, n_rows - 1);
      if constexpr (Lay::kAligned) {
        cp_async<16>(sw + r * Lay::kRowBytes + 16 * p, w + w_at(row, chunk) + 16 * p, true);
      } else {
        // The pieces from the one holding the stage's first byte; past W's
        // end (the last row's last stage) zero-filled, a piece across it
        // copied up to it.
        const int64_t at = (w_at(row, chunk) & ~int64_t{15}) + 16 * p;
        const int n = static_cast<int>(max(int64_t{0}, min(int64_t{16}, w_bytes - at)));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sw + r * Lay::kRowBytes + 16 * p),
                     "l"(w + (n > 0 ? at : 0)), "r"(n)
                     : "memory");
      }
    }
  };
  auto stage_x = [&](int chunk, int slot) {
    const uint32_t sx = smem_addr(slot_at(slot) + Lay::kW), sd = smem_addr(slot_at(slot) + Lay::kW + Lay::kX);
    for (int i = threadIdx.x; i < tok_used * (kChunkCols / 16); i += kThreads) {
      const int tok = i / (kChunkCols / 16), p = i % (kChunkCols / 16);
      const int64_t src = min(tok, n_tok - 1);
      cp_async<16>(sx + tok * kXStride + 16 * p, xq + src * n_cols + static_cast<int64_t>(chunk) * kChunkCols + 16 * p,
                   true);
    }
    for (int i = threadIdx.x; i < tok_used * kChunkBlocks; i += kThreads) {
      const int tok = i / kChunkBlocks, b = i % kChunkBlocks;
      const int64_t src = min(tok, n_tok - 1);
      cp_async<8>(sd + (b * kTok + tok) * 8, xds + src * x_blocks + static_cast<int64_t>(chunk) * kChunkBlocks + b,
                  true);
    }
  };

  // Commit groups: group s holds stage s's x (and, for s = 0, the blocks
  // of every prologue stage), so waiting for group c waits for stage c.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_mine) stage_w(c_begin + s, s);
  }
  detail::pdl_wait();
  detail::pdl_trigger();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_mine) stage_x(c_begin + s, s);
    cp_async_commit();
  }
  float acc[kTiles][4], total[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = total[j][e] = 0.0f;
  }
  int range = 0, range_end = per;
  for (int i = 0; i < n_mine; ++i) {
    const int c = c_begin + i;
    cp_async_wait_one();
    __syncthreads();  // stage i is in; every warp is done with slot (i - 1) % kStages
    if (i + kStages - 1 < n_mine) {
      stage_w(c + kStages - 1, (i + kStages - 1) % kStages);
      stage_x(c + kStages - 1, (i + kStages - 1) % kStages);
    }
    cp_async_commit();
    const uint8_t* base = smem + (i % kStages) * Lay::kStage;
    const uint8_t* wa = base + (rt * 16 + g) * Lay::kRowBytes;
    const uint8_t* wb = wa + 8 * Lay::kRowBytes;
    if constexpr (!Lay::kAligned) {  // rows g and g + 8 (as staged: past n_rows the last row)
      wa += w_at(min(row0 + rt * 16 + g, n_rows - 1), c) & 15;
      wb += w_at(min(row0 + rt * 16 + g + 8, n_rows - 1), c) & 15;
    }
    const int8_t* xs = reinterpret_cast<const int8_t*>(base + Lay::kW);
    const float4* ds = reinterpret_cast<const float4*>(base + Lay::kW + Lay::kX);
#pragma unroll
    for (int u = 0; u < Lay::kUnits; ++u) {
      const int unit = c * Lay::kUnits + u;
      if constexpr (kClusterSplit) {
        if (unit < u_begin || unit >= u_end) continue;
      } else {
        while (unit >= range_end) {
          fold(acc, total, range);
          ++range;
          range_end += per;
        }
      }
      typename Q::Raw ra, rb;
      typename Q::Unit A, B;
      Q::template fetch<SharedLoads>(wa, u, t, ra);
      Q::template fetch<SharedLoads>(wb, u, t, rb);
      Q::decode(ra, A);
      Q::decode(rb, B);
#pragma unroll
      for (int blk = 0; blk < Q::kBlocks; ++blk) {
        const int cb = u * Q::kBlocks + blk;  // 32-column block of the stage
#pragma unroll
        for (int jj = 0; jj < kTiles; ++jj) {
          const int j = tile0 + jj;
          if (j * 8 >= n_tok) break;
          const int2 bx = *reinterpret_cast<const int2*>(xs + (j * 8 + g) * kXStride + cb * 32 + 8 * t);
          const float4 dd = ds[(cb * kTok + j * 8 + 2 * t) >> 1];
          const float2 dx0 = make_float2(dd.x, dd.y), dx1 = make_float2(dd.z, dd.w);
          int cc[4] = {0, 0, 0, 0};
          if constexpr (Q::kHalves) {
            // quant_mma's steps for 16-column scales: each half's dot and
            // its scale d * h, the halves applied in order.
            int c1[4] = {0, 0, 0, 0};
            mma_k16(cc, A.q[blk][0], B.q[blk][0], bx.x);
            mma_k16(c1, A.q[blk][1], B.q[blk][1], bx.y);
            const float da0 = __fmul_rn(A.d[blk], static_cast<float>(A.h[blk][0]));
            const float da1 = __fmul_rn(A.d[blk], static_cast<float>(A.h[blk][1]));
            const float db0 = __fmul_rn(B.d[blk], static_cast<float>(B.h[blk][0]));
            const float db1 = __fmul_rn(B.d[blk], static_cast<float>(B.h[blk][1]));
            acc[jj][0] = apply(apply(acc[jj][0], da0, 0.0f, cc[0], dx0, false), da1, 0.0f, c1[0], dx0, false);
            acc[jj][1] = apply(apply(acc[jj][1], da0, 0.0f, cc[1], dx1, false), da1, 0.0f, c1[1], dx1, false);
            acc[jj][2] = apply(apply(acc[jj][2], db0, 0.0f, cc[2], dx0, false), db1, 0.0f, c1[2], dx0, false);
            acc[jj][3] = apply(apply(acc[jj][3], db0, 0.0f, cc[3], dx1, false), db1, 0.0f, c1[3], dx1, false);
          } else {
            mma_k32(cc, A.q[blk][0], B.q[blk][0], A.q[blk][1], B.q[blk][1], bx.x, bx.y);
            float ma = 0.0f, mb = 0.0f;
            if constexpr (Q::kMin) {
              ma = A.m[blk];
              mb = B.m[blk];
            }
            acc[jj][0] = apply(acc[jj][0], A.d[blk], ma, cc[0], dx0, Q::kMin);
            acc[jj][1] = apply(acc[jj][1], A.d[blk], ma, cc[1], dx1, Q::kMin);
            acc[jj][2] = apply(acc[jj][2], B.d[blk], mb, cc[2], dx0, Q::kMin);
            acc[jj][3] = apply(acc[jj][3], B.d[blk], mb, cc[3], dx1, Q::kMin);
          }
        }
      }
    }
  }
  if constexpr (kClusterSplit) {
    // This range's sums into this block's shared memory as [kRows][kTok]
    // (the ring's first bytes: every copy has landed and been read), then
    // cluster rank q adds outputs q, q + kSplit, .. over the ranks in
    // order, reading the others' sums through distributed shared memory.
    cg::cluster_group cluster = cg::this_cluster();
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
    float* part = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int jj = 0; jj < kTiles; ++jj) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = rt * 16 + g + (e < 2 ? 0 : 8), tk = (tile0 + jj) * 8 + 2 * t + (e & 1);
        part[r * kTok + tk] = acc[jj][e];
      }
    }
    cluster.sync();
    const int rank = static_cast<int>(cluster.block_rank());
    for (int o = rank * kThreads + threadIdx.x; o < Lay::kRows * kTok; o += kSplit * kThreads) {
      const int r = o / kTok, tk = o % kTok;
      if (tk >= n_tok || row0 + r >= n_rows) continue;
      float sum = *cluster.map_shared_rank(part + o, 0);
#pragma unroll
      for (int q = 1; q < kSplit; ++q) sum = __fadd_rn(sum, *cluster.map_shared_rank(part + o, q));
      float* out = y + tk * y_stride + row0 + r;
      *out = accumulate ? __fadd_rn(*out, sum) : sum;
    }
    cluster.sync();  // no block leaves while another still reads its sums
  } else {
    for (; range < kSplit; ++range) fold(acc, total, range);
    const int64_t ra = row0 + rt * 16 + g, rb = ra + 8;
#pragma unroll
    for (int jj = 0; jj < kTiles; ++jj) {
      const int tok = (tile0 + jj) * 8 + 2 * t;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tk = tok + (e & 1);
        const int64_t r = e < 2 ? ra : rb;
        if (tk >= n_tok || r >= n_rows) continue;
        float* out = y + tk * y_stride + r;
        *out = accumulate ? __fadd_rn(*out, total[jj][e]) : total[jj][e];
      }
    }
  }
}

// Rows a block: RILL_QUANT_MMQ_ROWS (32, 64 or 128; read once) or else
// the most that still give every SM a block (on the H100 at 64 tokens
// 128 rows ran gate_up 1.32x faster than 64 and 32 rows, docs/perf.md).
int default_rows_a_block(int64_t n_rows) {
  static const int forced = [] {
    const char* e = std::getenv("RILL_QUANT_MMQ_ROWS");
    const int v = e == nullptr ? 0 : std::atoi(e);
    return v == 32 || v == 64 || v == 128 ? v : 0;
  }();
  if (forced != 0) return forced;
  const int64_t sms = sm_count();
  if ((n_rows + 127) / 128 >= sms) return 128;
  if ((n_rows + 63) / 64 >= sms) return 64;
  return 32;
}

template <class Q, int kRowTiles, bool kClusterSplit>
void launch_rows(const uint8_t* w, const int8_t* xq, const float2* xds, int n_tok, int64_t n_rows, int64_t n_cols,
                 float* y, int64_t y_stride, bool accumulate, cudaStream_t stream) {
  using Lay = MmqLayout<Q, kRowTiles>;
  auto* kernel = quant_mmq_kernel<Q, kRowTiles, kClusterSplit>;
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(kernel), Lay::kBytes, true);
  const auto blocks = static_cast<unsigned>((n_rows + Lay::kRows - 1) / Lay::kRows);
  if constexpr (!kClusterSplit) {
    launch_pdl(kernel, blocks, kThreads, Lay::kBytes, stream, w, xq, xds, n_tok, n_rows, n_cols, y, y_stride,
               accumulate);
  } else {
    // launch_pdl's launch plus the cluster: kSplit blocks along y.
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks, kSplit);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = Lay::kBytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = 1;
    attr[1].val.clusterDim.y = kSplit;
    attr[1].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 2;
    RILL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, w, xq, xds, n_tok, n_rows, n_cols, y, y_stride, accumulate));
  }
}

template <class Q, bool kClusterSplit>
void launch(const void* w, const void* xq, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y, int64_t y_stride,
            bool accumulate, cudaStream_t stream, int rows) {
  const auto* wq = static_cast<const uint8_t*>(w);
  const auto* q = static_cast<const int8_t*>(xq);
  const auto* ds = reinterpret_cast<const float2*>(q + n_tokens * n_cols);
  const int n = static_cast<int>(n_tokens);
  switch (rows) {
    case 128:
      launch_rows<Q, 8, kClusterSplit>(wq, q, ds, n, n_rows, n_cols, y, y_stride, accumulate, stream);
      break;
    case 64:
      launch_rows<Q, 4, kClusterSplit>(wq, q, ds, n, n_rows, n_cols, y, y_stride, accumulate, stream);
      break;
    default:
      launch_rows<Q, 2, kClusterSplit>(wq, q, ds, n, n_rows, n_cols, y, y_stride, accumulate, stream);
      break;
  }
}

// Whether a matrix has rows enough for a 128-row block on every SM.
bool fills_the_gpu(int64_t n_rows) {
  return (n_rows + 127) / 128 >= sm_count();
}

}  // namespace

bool quant_mmq_on() {
  static const bool on = [] {
    const char* e = std::getenv("RILL_QUANT_MMQ");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

bool quant_mmq_fits(DType w_dtype, const void* w, int64_t n_tokens, int64_t n_cols) {
  return (w_dtype == DType::kQ8_0 || w_dtype == DType::kQ4_K || w_dtype == DType::kQ6_K) && n_tokens >= 1 &&
         n_tokens <= kMmaMaxTokens && n_cols % kChunkCols == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

// Q6_K (Q4_K_M's LM head and half its v / down parts) was written without
// a GPU at hand: quant_mmq takes it when called, but quant_matmul hands it
// Q6_K only with RILL_QUANT_MMQ_Q6K=1 (read once) until its bit-for-bit
// test and timing have run.
bool quant_mmq_q6k_on() {
  static const bool on = [] {
    const char* e = std::getenv("RILL_QUANT_MMQ_Q6K");
    return e != nullptr && std::strcmp(e, "1") == 0;
  }();
  return on;
}

bool quant_mmq_split_on() {
  static const bool on = [] {
    const char* e = std::getenv("RILL_QUANT_MMQ_SPLIT");
    return e != nullptr && std::strcmp(e, "1") == 0;
  }();
  return on;
}

bool quant_mmq_eligible(DType w_dtype, const void* w, int64_t n_tokens, int64_t n_rows, int64_t n_cols) {
  return quant_mmq_on() && n_tokens >= kMmqMinTokens && (fills_the_gpu(n_rows) || quant_mmq_split_on()) &&
         (w_dtype != DType::kQ6_K || quant_mmq_q6k_on()) && quant_mmq_fits(w_dtype, w, n_tokens, n_cols);
}

void quant_mmq(DType w_dtype, const void* w, const void* xq, int64_t n_tokens, int64_t n_rows, int64_t n_cols, float* y,
               int64_t y_stride, bool accumulate, cudaStream_t stream, int rows_a_block, int k_split) {
  if (n_tokens <= 0 || n_rows <= 0) return;
  if (!quant_mmq_fits(w_dtype, w, n_tokens, n_cols) || reinterpret_cast<uintptr_t>(xq) % 16 != 0) {
    std::fprintf(stderr,
                 "quant_mmq: %s, %lld tokens, %lld columns (Q8_0, Q4_K or Q6_K, 1 to %lld tokens, columns a multiple "
                 "of %d, W and xq 16-byte aligned)\n",
                 std::string(dtype_name(w_dtype)).c_str(), static_cast<long long>(n_tokens),
                 static_cast<long long>(n_cols), static_cast<long long>(kMmaMaxTokens), kChunkCols);
    std::abort();
  }
  const int rows =
      rows_a_block == 32 || rows_a_block == 64 || rows_a_block == 128 ? rows_a_block : default_rows_a_block(n_rows);
  const bool split = k_split == kSplit || (k_split == 0 && quant_mmq_split_on() && !fills_the_gpu(n_rows));
  if (w_dtype == DType::kQ8_0) {
    (split ? launch<MmaQ8_0, true> : launch<MmaQ8_0, false>)(w, xq, n_tokens, n_rows, n_cols, y, y_stride, accumulate,
                                                             stream, rows);
  } else if (w_dtype == DType::kQ6_K) {
    (split ? launch<MmaQ6_K, true> : launch<MmaQ6_K, false>)(w, xq, n_tokens, n_rows, n_cols, y, y_stride, accumulate,
                                                             stream, rows);
  } else {
    (split ? launch<MmaQ4_K, true> : launch<MmaQ4_K, false>)(w, xq, n_tokens, n_rows, n_cols, y, y_stride, accumulate,
                                                             stream, rows);
  }
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace rill::cuda
