// gemm_stream: decode-batch GEMM over 16-bit or FP8 weights on TMA + wgmma
// (gemm_stream.h states the contract).
//
// Work: block (split, slab) owns weight rows [128 slab, 128 slab + 128) and
// the chunks [chunks split / S, chunks (split + 1) / S) of every row (a
// chunk: one 128-byte box a row, 64 f16 / bf16 or 128 e4m3 columns; two
// boxes in variant 2), for all tokens (the token tile BN: 16, 32, 64 or
// 128; x's rows past n arrive as zeros from the copy engine). Warp 8 is the
// producer: its lane 0 fills a ring of kStages stages, each the W boxes
// [128][128 bytes] and the x boxes [BN][128 bytes], in the 128-byte swizzle
// wgmma reads, completing on the stage's "full" mbarrier; where the caller
// says W is not written by the previous kernel (w_stable), it fetches the
// first stages' W before the programmatic-launch wait, their x after it.
// Warpgroups 0 and 1 (warps 0-7) take rows 64 wg .. 64 wg + 63 of the
// slab: per box four wgmmas of 32 bytes of K each (m64nBNk16 for 16-bit,
// m64nBNk32 for e4m3; the descriptor's start moves 32 bytes, as the swizzle
// is applied to the address), then every consumer thread arrives on the
// stage's "empty" mbarrier, which the producer waits on before refilling it.
//
// Epilogue: the accumulators go to shared memory as [BN][kOutLd] f32 (the
// ring is free by then), token-major so the output's rows are contiguous.
// With S > 1 the S blocks of a slab form a cluster: after a cluster
// barrier, rank r sums rows [r 128 / S, (r + 1) 128 / S) of all S tiles,
// rank 0's first, through distributed shared memory, scales them (e4m3),
// and writes them; a second barrier keeps every tile alive until its
// readers are done.
//
// Why TMA + wgmma: cuBLASLt's decode shapes leave the small matrices (o,
// qkv, down at 64-128 tokens) at 71-84% of the copy rate on the H100
// (docs/perf.md), and rill's earlier skinny GEMM on cp.async + mma.sync
// lost to it where split-K was needed (the ring's fill and a global
// reduction weighed on short splits). Here a split's partials never leave
// the chip and a block's copies are a handful of instructions.
#include "backend/cuda/hopper/gemm_stream.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/hopper/wgmma_asm.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace rill::cuda {
namespace {

constexpr int kBM = 128;    // rows of a W tile
constexpr int kBoxB = 128;  // bytes of a tile row: one 128-byte swizzle span (64 f16 / bf16, 128 e4m3)

// Columns a 128-byte box row holds.
template <typename Tag>
inline constexpr int kBoxCols = std::is_same_v<Tag, hopper::WgmmaE4M3> ? kBoxB : kBoxB / 2;
constexpr int kConsumerWarps = 8, kThreads = kConsumerWarps * 32 + 32;
constexpr int kProducerWarp = kConsumerWarps;
constexpr int kOutLd = kBM + 4;  // floats a token row of the output tile: 4 banks apart per token pair

// A kernel configuration: the token tile BN, the variant V (gemm_stream.h:
// 0 two blocks an SM, 1 one block with a ring twice as deep, 2 one block
// with 128-column stages).
template <int BN, int V>
struct Shape {
  static constexpr int kBoxes = V == 2 ? 2 : 1;  // 64-column boxes a stage
  static constexpr int kMinBlocks = V == 0 ? 2 : 1;
  static constexpr int kBaseStages = BN >= 64 ? (BN == 128 ? 3 : 4) : 5;
  static constexpr int kStages = V == 0 ? kBaseStages : V == 1 ? 2 * kBaseStages : (BN == 128 ? 3 : 4);
  static constexpr uint32_t kWBytes = kBM * kBoxB;                       // one box of W
  static constexpr uint32_t kXBytes = BN * kBoxB;                        // one box of x
  static constexpr uint32_t kStageBytes = kBoxes * (kWBytes + kXBytes);  // a multiple of 1,024 (swizzle atoms)
  static constexpr uint32_t kXOffset = kBoxes * kWBytes;                 // x's boxes after W's in a stage
  static constexpr uint32_t kRing = kStages * kStageBytes;
  static constexpr uint32_t kOut = BN * kOutLd * 4;
  static constexpr uint32_t kData = kRing > kOut ? kRing : kOut;
  static constexpr uint32_t kBarriers = kData;  // full[s] then empty[s], 8 bytes each
  // + 1,024: the dynamic window is aligned up to 1,024 bytes in the kernel.
  static constexpr uint32_t kSmem = kData + 2 * kStages * 8 + 1024;
  static_assert(kStageBytes % 1024 == 0, "stages keep the swizzle atoms aligned");
  static_assert(kSmem <= (kMinBlocks == 2 ? 112 : 225) * 1024, "the blocks an SM fit");
};

struct Params {
  void* y;
  const float* ws;  // e4m3 with scales: W's row scales and x's token scales; else null
  const float* xs;
  int n, rows, chunks, splits;
  bool accumulate, narrow, w_stable;
  bool l2_hints;  // l2_policy's hints (RILL_GEMM_STREAM_L2=0: off, to measure what they do)
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// One 2-D tile of `map` at (column c0, row c1) into shared memory at dst,
// completing `bytes` on bar (the box's whole size, zeros included).
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar,
                                         uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
      : "memory");
}
// The cache policy of a copy: evict-first for W (one pass), evict-last for
// x (every slab reads it); with hints off, evict-normal for both.
__device__ __forceinline__ uint64_t l2_policy(bool evict_first, bool hints) {
  uint64_t p;
  if (!hints) {
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
  } else if (evict_first) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  }
  return p;
}
// A K-major operand in the 128-byte swizzle: 8-row groups 1,024 bytes
// apart (the stride offset), the leading offset unused, tile bases aligned
// to 1,024 bytes (base offset 0).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ float4 ld_cluster(uint32_t addr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}
#endif

// The sum of the S blocks' output tiles at one quad, rank 0's first: all
// S loads issued before the first add (S = 1: this block's own tile).
__device__ __forceinline__ float4 gather_parts(const uint8_t* local, uint32_t addr, int splits) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if (splits == 1) return *reinterpret_cast<const float4*>(local);
  float4 v[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    if (q < splits) v[q] = ld_cluster(addr, static_cast<uint32_t>(q));
  }
  float4 s = v[0];
#pragma unroll
  for (int q = 1; q < 8; ++q) {
    if (q < splits) {
      s.x += v[q].x;
      s.y += v[q].y;
      s.z += v[q].z;
      s.w += v[q].w;
    }
  }
  return s;
#else
  (void)local;
  (void)addr;
  (void)splits;
  return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#endif
}

// Four 16-bit outputs in one 8-byte store (y 8-byte aligned there).
template <typename T>
__device__ __forceinline__ void store_quad(T* y, float4 v) {
  union {
    T h[4];
    uint2 u;
  } q;
  q.h[0] = detail::from_f32<T>(v.x);
  q.h[1] = detail::from_f32<T>(v.y);
  q.h[2] = detail::from_f32<T>(v.z);
  q.h[3] = detail::from_f32<T>(v.w);
  *reinterpret_cast<uint2*>(y) = q.u;
}

template <typename T, typename Tag, int BN, int V>
__global__ void __launch_bounds__(kThreads, Shape<BN, V>::kMinBlocks)
    gemm_stream_kernel(const __grid_constant__ CUtensorMap map_w, const __grid_constant__ CUtensorMap map_x, Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = Shape<BN, V>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* const gbase = smem_raw + (base - raw);
  const uint32_t full0 = base + S::kBarriers, empty0 = full0 + 8 * S::kStages;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int split = static_cast<int>(blockIdx.x), slab = static_cast<int>(blockIdx.y);
  const int c_begin = split * p.chunks / p.splits, c_end = (split + 1) * p.chunks / p.splits;
  const int count = c_end - c_begin;

  if (threadIdx.x == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, kConsumerWarps * 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  float acc[BN / 2];
  if (warp == kProducerWarp) {
    if (lane == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_x)) : "memory");
      const uint64_t stream_w = l2_policy(true, p.l2_hints), keep_x = l2_policy(false, p.l2_hints);
      const int first = count < S::kStages ? count : S::kStages;
      constexpr int kCols = kBoxCols<Tag>;
      const int chunk_cols = kCols * S::kBoxes;
      // W ahead of the wait only where no kernel before this one writes it
      // (placed weights; not a dequantization scratch).
      if (!p.w_stable) detail::pdl_wait();
      for (int i = 0; i < first; ++i) {
        const uint32_t st = base + i * S::kStageBytes, bar = full0 + 8 * i;
        mbar_expect_tx(bar, S::kStageBytes);
        for (int b = 0; b < S::kBoxes; ++b) {
          tma_load(st + b * S::kWBytes, &map_w, (c_begin + i) * chunk_cols + b * kCols, slab * kBM, bar, stream_w);
        }
      }
      if (p.w_stable) detail::pdl_wait();
      for (int i = 0; i < first; ++i) {
        const uint32_t st = base + i * S::kStageBytes, bar = full0 + 8 * i;
        for (int b = 0; b < S::kBoxes; ++b) {
          tma_load(st + S::kXOffset + b * S::kXBytes, &map_x, (c_begin + i) * chunk_cols + b * kCols, 0, bar, keep_x);
        }
      }
      for (int i = first; i < count; ++i) {
        const int s = i % S::kStages;
        mbar_wait(empty0 + 8 * s, ((i / S::kStages) - 1) & 1);
        const uint32_t st = base + s * S::kStageBytes, bar = full0 + 8 * s;
        mbar_expect_tx(bar, S::kStageBytes);
        for (int b = 0; b < S::kBoxes; ++b) {
          tma_load(st + b * S::kWBytes, &map_w, (c_begin + i) * chunk_cols + b * kCols, slab * kBM, bar, stream_w);
          tma_load(st + S::kXOffset + b * S::kXBytes, &map_x, (c_begin + i) * chunk_cols + b * kCols, 0, bar, keep_x);
        }
      }
    } else {
      detail::pdl_wait();
    }
  } else {
    detail::pdl_wait();
    const int wg = warp >> 2;
#pragma unroll
    for (int j = 0; j < BN / 2; ++j) acc[j] = 0.0f;
    for (int i = 0; i < count; ++i) {
      const int s = i % S::kStages;
      mbar_wait(full0 + 8 * s, (i / S::kStages) & 1);
      const uint32_t st = base + s * S::kStageBytes;
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int b = 0; b < S::kBoxes; ++b) {
        const uint32_t w_tile = st + b * S::kWBytes + wg * (64 * 128), x_tile = st + S::kXOffset + b * S::kXBytes;
#pragma unroll
        for (int k = 0; k < kBoxB / 32; ++k) {
          hopper::Wgmma<Tag, BN>::run(acc, sw128_desc(w_tile + 32 * k), sw128_desc(x_tile + 32 * k), 1);
        }
      }
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      mbar_arrive(empty0 + 8 * s);
    }
  }
  __syncthreads();  // every stage consumed: the ring becomes the output tile
  detail::pdl_trigger();

  float* const out = reinterpret_cast<float*>(gbase);
  if (warp < kConsumerWarps) {
    const int g = lane >> 2, t = lane & 3;
    const int r0 = (warp >> 2) * 64 + (warp & 3) * 16 + g;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int c = 8 * j + 2 * t;
      out[c * kOutLd + r0] = acc[4 * j];
      out[(c + 1) * kOutLd + r0] = acc[4 * j + 1];
      out[c * kOutLd + r0 + 8] = acc[4 * j + 2];
      out[(c + 1) * kOutLd + r0 + 8] = acc[4 * j + 3];
    }
  }
  __syncthreads();
  if (p.splits > 1) cluster_sync();

  // Rank `split` writes rows [split R, split R + R) of the slab, R = 128 / S,
  // as quads of 4 rows, two quads a thread at a time so that their loads
  // (the S parts, y's old values) are in flight together.
  const int rows_per_rank = kBM / p.splits, quads = rows_per_rank / 4;
  const int total = p.n * quads;
  // A quad wholly in y's rows or wholly past them, y 16-byte aligned: one
  // vector access a quad (else element by element).
  const bool whole_quads = (p.rows & 3) == 0 && (reinterpret_cast<uintptr_t>(p.y) & 15) == 0;
  constexpr int kU = 2;
  for (int idx0 = static_cast<int>(threadIdx.x); idx0 < total; idx0 += kU * kThreads) {
    float4 sum[kU], prev[kU];
    int64_t at[kU], gr[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int idx = idx0 + u * kThreads;
      const int t = idx / quads, row = split * rows_per_rank + 4 * (idx % quads);
      gr[u] = static_cast<int64_t>(slab) * kBM + row;
      at[u] = static_cast<int64_t>(t) * p.rows + gr[u];
      prev[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (idx >= total) continue;
      if (p.accumulate && whole_quads && gr[u] < p.rows) {
        prev[u] = *reinterpret_cast<const float4*>(static_cast<const float*>(p.y) + at[u]);
      }
      const uint32_t off = static_cast<uint32_t>((t * kOutLd + row) * 4);
      sum[u] = gather_parts(gbase + off, base + off, p.splits);
      if (p.xs) {  // e4m3's scales, in fp8_scale_rows' order: sum x xs[t] x ws[r] (rows past y: the last row's)
        const float xt = p.xs[t];
        const int64_t last = p.rows - 1;
        sum[u].x = sum[u].x * xt * p.ws[gr[u] < last ? gr[u] : last];
        sum[u].y = sum[u].y * xt * p.ws[gr[u] + 1 < last ? gr[u] + 1 : last];
        sum[u].z = sum[u].z * xt * p.ws[gr[u] + 2 < last ? gr[u] + 2 : last];
        sum[u].w = sum[u].w * xt * p.ws[gr[u] + 3 < last ? gr[u] + 3 : last];
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (idx0 + u * kThreads >= total) continue;
      if (whole_quads) {
        if (gr[u] >= p.rows) continue;
        if (p.narrow) {
          store_quad(static_cast<T*>(p.y) + at[u], sum[u]);
        } else {
          const float4 v = p.accumulate ? make_float4(prev[u].x + sum[u].x, prev[u].y + sum[u].y, prev[u].z + sum[u].z,
                                                      prev[u].w + sum[u].w)
                                        : sum[u];
          *reinterpret_cast<float4*>(static_cast<float*>(p.y) + at[u]) = v;
        }
        continue;
      }
      const float vals[4] = {sum[u].x, sum[u].y, sum[u].z, sum[u].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (gr[u] + e >= p.rows) break;
        if (p.narrow) {
          static_cast<T*>(p.y)[at[u] + e] = detail::from_f32<T>(vals[e]);
        } else {
          float* y = static_cast<float*>(p.y);
          y[at[u] + e] = p.accumulate ? y[at[u] + e] + vals[e] : vals[e];
        }
      }
    }
  }
  if (p.splits > 1) cluster_sync();
#else
  (void)map_w;
  (void)map_x;
  (void)p;
  __trap();
#endif
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no
// link against libcuda); null where the driver has none.
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A row-major matrix of `outer` rows, `inner` elements a row (16-bit, or
// e4m3 bytes) `ld` bytes apart, in tiles of box_rows x 128 bytes in the
// 128-byte swizzle; out-of-range elements read as zeros.
bool encode_map(CUtensorMap* map, CUtensorMapDataType type, int elem_bytes, const void* ptr, int64_t outer,
                int64_t inner, int64_t ld, uint32_t box_rows) {
  const auto fn = encode_fn();
  if (!fn) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kBoxB / elem_bytes), box_rows};
  const cuuint32_t elem[2] = {1, 1};
  return fn(map, type, 2, const_cast<void*>(ptr), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int elem_bytes(const GemmStreamArgs& a) {
  return a.e4m3 ? 1 : 2;
}

bool l2_hints() {
  static const bool on = [] {
    const char* e = std::getenv("RILL_GEMM_STREAM_L2");
    return !(e && e[0] == '0');
  }();
  return on;
}

int token_tile(int64_t n) {
  return n <= 16 ? 16 : n <= 32 ? 32 : n <= 64 ? 64 : 128;
}

template <typename T, typename Tag, int BN, int V>
bool launch(const GemmStreamArgs& a, cudaStream_t stream) {
  using S = Shape<BN, V>;
  CUtensorMap map_w, map_x;
  const int eb = elem_bytes(a);
  const CUtensorMapDataType type = a.e4m3                    ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : a.dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                             : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const int64_t w_ld = a.w_ld > 0 ? a.w_ld : a.cols * eb;
  if (!encode_map(&map_w, type, eb, a.w, a.rows, a.cols, w_ld, kBM) ||
      !encode_map(&map_x, type, eb, a.x, a.n, a.cols, a.cols * eb, BN)) {
    return false;
  }
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(&gemm_stream_kernel<T, Tag, BN, V>), S::kSmem, true);
  const int64_t chunk_cols = int64_t{kBoxCols<Tag>} * S::kBoxes;
  const Params p{a.y,
                 a.ws,
                 a.xs,
                 static_cast<int>(a.n),
                 static_cast<int>(a.rows),
                 static_cast<int>((a.cols + chunk_cols - 1) / chunk_cols),
                 a.splits,
                 a.accumulate,
                 a.narrow,
                 a.w_stable,
                 l2_hints()};
  if (p.splits > p.chunks) return false;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(a.splits), static_cast<unsigned>((a.rows + kBM - 1) / kBM));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = S::kSmem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = static_cast<unsigned>(a.splits);
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = a.splits > 1 ? 2 : 1;  // no cluster attribute where no cluster is needed
  if (cudaLaunchKernelEx(&cfg, gemm_stream_kernel<T, Tag, BN, V>, map_w, map_x, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

template <typename T, typename Tag, int BN>
bool launch_variant(const GemmStreamArgs& a, cudaStream_t stream) {
  switch (a.variant) {
    case 1:
      return launch<T, Tag, BN, 1>(a, stream);
    case 2:
      return launch<T, Tag, BN, 2>(a, stream);
    default:
      return launch<T, Tag, BN, 0>(a, stream);
  }
}

template <typename T, typename Tag>
bool launch_typed(const GemmStreamArgs& a, cudaStream_t stream) {
  switch (token_tile(a.n)) {
    case 16:
      return launch_variant<T, Tag, 16>(a, stream);
    case 32:
      return launch_variant<T, Tag, 32>(a, stream);
    case 64:
      return launch_variant<T, Tag, 64>(a, stream);
    default:
      return launch_variant<T, Tag, 128>(a, stream);
  }
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

}  // namespace

bool gemm_stream_available() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  // Per device: 0 not asked yet, 1 no, 2 yes.
  static std::atomic<int> known[64];
  std::atomic<int>& k = known[device & 63];
  if (int v = k.load(std::memory_order_acquire); v != 0) return v == 2;
  int major = 0, minor = 0;
  bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess && major == 9 &&
            minor == 0 && encode_fn() != nullptr;
  cudaFuncAttributes attr{};
  // No sm_90a image for this device: the query fails, and its error is
  // cleared (only that one: the call is made only when it would be the last).
  if (ok && cudaFuncGetAttributes(
                &attr, reinterpret_cast<const void*>(&gemm_stream_kernel<__nv_bfloat16, hopper::WgmmaBF16, 128, 0>)) !=
                cudaSuccess) {
    cudaGetLastError();
    ok = false;
  }
  k.store(ok ? 2 : 1, std::memory_order_release);
  return ok;
}

bool gemm_stream_supported(const GemmStreamArgs& a) {
  bool split_ok = false;
  for (int s : kGemmStreamSplits) split_ok = split_ok || s == a.splits;
  const int64_t row_bytes = a.cols * (a.e4m3 ? 1 : 2);
  const int64_t chunk_bytes = int64_t{kBoxB} * (a.variant == 2 ? 2 : 1);
  const bool types_ok = a.e4m3 ? !a.narrow && (a.ws == nullptr) == (a.xs == nullptr) &&
                                     (a.w_ld == 0 || (a.w_ld >= row_bytes && a.w_ld % 16 == 0))
                               : (a.dtype == DType::kBF16 || a.dtype == DType::kF16) && a.w_ld == 0 && !a.ws && !a.xs;
  return types_ok && a.n >= 1 && a.n <= kGemmStreamMaxTokens && a.rows >= 1 && a.rows <= int64_t{65535} * kBM &&
         row_bytes >= kBoxB && row_bytes % 16 == 0 && a.w && a.x && a.y && aligned16(a.w) && aligned16(a.x) &&
         !(a.narrow && a.accumulate) && split_ok && a.variant >= 0 && a.variant < kGemmStreamVariants &&
         a.splits <= (row_bytes + chunk_bytes - 1) / chunk_bytes;
}

bool gemm_stream(const GemmStreamArgs& a, cudaStream_t stream) {
  if (!gemm_stream_supported(a) || !gemm_stream_available()) return false;
  if (a.e4m3) return launch_typed<__nv_bfloat16, hopper::WgmmaE4M3>(a, stream);  // T: no narrow output
  return a.dtype == DType::kBF16 ? launch_typed<__nv_bfloat16, hopper::WgmmaBF16>(a, stream)
                                 : launch_typed<__half, hopper::WgmmaF16>(a, stream);
}

}  // namespace rill::cuda
