// Prefill attention on Hopper's warpgroup MMA (wgmma) for f16 KV at
// head_dim 64 and 128: attention_flash.cu's loop (one block of 4 warps per
// 64 queries of one head, K/V tiles of 64 keys in a two-stage cp.async
// ring, Q and the probabilities in registers, the online softmax in f32 in
// the same order and operations) with its products as wgmma: S = Q K^T as
// HD / 16 wgmma.m64n64k16 and O += P V as 4 wgmma.m64n{HD}k16, A (Q's and
// P's fragments, the same registers as mma.sync's A) from registers and B
// (K, V) read by the tensor cores straight from shared memory. The four
// warps' mma.sync read every K and V tile through ldmatrix, each warp the
// whole tile (128 KB of shared-memory reads a tile at head_dim 128, over
// the 32 KB copied in); a warpgroup's wgmma reads it once.
// Shared memory holds K and V in the descriptors' no-swizzle layout of
// 8 x 16-byte core matrices (128 contiguous bytes): K (B of Q K^T,
// K-major: a key's head_dim contiguous) with key n, element k at
// (n / 8) * (HD * 16) + (k / 8) * 128 + (n % 8) * 16 + (k % 8) * 2 (LBO 128
// along head_dim, SBO HD * 16 along keys); V (B of P V, N-major, as
// transposed) with key k, element n at (n / 8) * 1024 + k * 16 + (n % 8) * 2
// (LBO 128 along keys, SBO 1024 along head_dim). A thread copies 16-byte
// pieces of one key (a quarter-warp's 8 copies land on 128 contiguous bytes:
// no bank conflicts) and looks up that key's cache row a tile ahead.
// The products are exact in f32 from the same f16 inputs as the mma.sync
// kernel, summed in another order: outputs agree to rounding (the tests
// compare both with the CPU reference). Built for sm_90a alone (CMake: the
// rill_cuda_sm90a objects); prefill_attention_flash_wgmma declines other
// devices, other KV types and head sizes, and RILL_CUDA_FLASH_WGMMA=0.
#include <cuda_fp16.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_mma.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/mma_tile.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace rill::cuda {
namespace {

constexpr int kBQ = 64, kBK = 64, kThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;

using detail::cp_async16;
using detail::cp_async_commit;
using detail::cp_async_wait_one;
using detail::ldmatrix_x4;
using detail::pack_half2;
using detail::smem_addr;

// A shared-memory matrix descriptor, no swizzle: start, LBO and SBO in
// bytes (multiples of 16).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | static_cast<uint64_t>(lbo >> 4) << 16 |
         static_cast<uint64_t>(sbo >> 4) << 32;
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// cp.async's writes (generic proxy) made visible to wgmma's reads (async proxy).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// D (64 x 64, f32) (+)= A (64 x 16 f16, registers) B (16 x 64 f16, shared memory, desc);
// kTransB: B is N-major (transposed). accumulate: false zeroes D first.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc,
                                                   bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(static_cast<int>(accumulate)), "n"(kTransB)
      : "memory");
}

// D (64 x 128, f32) (+)= A (64 x 16 f16, registers) B (16 x 128 f16, shared memory, desc);
// kTransB: B is N-major (transposed). accumulate: false zeroes D first.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc,
                                                    bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, {%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(static_cast<int>(accumulate)), "n"(kTransB)
      : "memory");
}

template <int HD>
struct WgLayout {
  static constexpr uint32_t kTile = kBK * HD * 2;  // bytes of one K or V tile
  static constexpr uint32_t kStage = 2 * kTile;    // K, then V
  static constexpr uint32_t kKeyGroup = HD * 16;   // K: 8 keys' core matrices (SBO)
  static constexpr uint32_t kVGroup = kBK * 16;    // V: 8 elements' core matrices over the tile's keys (SBO)
  // Q ([kBQ][kLdQ] f16, into registers before the loop) borrows stage 1,
  // whose first copy is issued after the barrier behind the fragments' loads.
  static constexpr int kLdQ = HD + 8;  // a 16-byte pad keeps ldmatrix free of bank conflicts
  static constexpr uint32_t kQ = kStage;
  static constexpr size_t kBytes = 2 * kStage;
  static_assert(kBQ * kLdQ * 2 <= kStage, "Q fits in a stage");
};

template <int HD>
constexpr int kWgBlocks = HD <= 64 ? 4 : 3;

template <int HD, typename Out>
__global__ void __launch_bounds__(kThreads, kWgBlocks<HD>) flash_wgmma_kernel(AttentionArgs a) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = WgLayout<HD>;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t base = smem_addr(smem);
  __half* qs = reinterpret_cast<__half*>(smem + L::kQ);

  // The longest tiles (latest queries) first, over every head (as
  // attention_flash.cu).
  const PrefillTile tile = a.tiles[gridDim.y - 1 - blockIdx.y];
  const int h = blockIdx.x, kvh = h / (a.n_head / a.n_head_kv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int32_t* table = a.block_tables + a.table_start[tile.seq];
  const int32_t p_first = a.pos[tile.t0], p_last = a.pos[tile.t0 + tile.n_q - 1];
  const int32_t k_lo = a.window > 0 ? max(0, p_first - a.window + 1) : 0, k_hi = p_last + 1;
  const int n_kv_tiles = (k_hi - k_lo + kBK - 1) / kBK;

  // Copies: thread (warp w, lane l) copies key 16 w + l % 8 + 8 (l / 16) of
  // each tile, its 16-byte pieces 2 u + (l / 8) % 2 (u < kPer); it looks
  // up that key's cache row a tile ahead of the copy.
  constexpr int kPer = HD / 16;
  const int my_key = warp * 16 + (lane & 7) + ((lane >> 4) << 3), my_half = (lane >> 3) & 1;
  constexpr uint32_t kNoRow = 0xffffffffu;
  uint32_t row = kNoRow;
  const int64_t row_elems = static_cast<int64_t>(a.n_head_kv) * HD;
  auto look_up = [&](int it) {
    const int32_t j = k_lo + it * kBK + my_key;
    const int64_t r = j < k_hi ? detail::cache_row(a, table, j) : -1;  // a table hole (negative) is no row
    row = r < 0 ? kNoRow : static_cast<uint32_t>(r);
  };
  const __half* kbase = static_cast<const __half*>(a.k_cache) + static_cast<int64_t>(kvh) * HD;
  const __half* vbase = static_cast<const __half*>(a.v_cache) + static_cast<int64_t>(kvh) * HD;
  auto copy_tile = [&](int it) {
    const uint32_t ks = base + (it & 1) * L::kStage, vs = ks + L::kTile;
    const bool ok = row != kNoRow;
    const int64_t src = ok ? row * row_elems : 0;
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int p = 2 * u + my_half;
      cp_async16(ks + (my_key >> 3) * L::kKeyGroup + p * 128 + (my_key & 7) * 16, kbase + src + p * 8, ok);
      cp_async16(vs + p * L::kVGroup + my_key * 16, vbase + src + p * 8, ok);
    }
    cp_async_commit();
  };
  look_up(0);
  copy_tile(0);
  if (n_kv_tiles > 1) look_up(1);

  // Q rounded to f16, rows past n_q zero (as attention_flash.cu).
  const float* q_tile = a.q + static_cast<int64_t>(tile.t0) * a.q_stride + static_cast<int64_t>(h) * HD;
  if (a.q_stride % 4 == 0 && reinterpret_cast<uintptr_t>(a.q) % 16 == 0) {
    constexpr int kQuads = kBQ * HD / 4 / kThreads;
    float4 qv[kQuads];
#pragma unroll
    for (int u = 0; u < kQuads; ++u) {
      const int i = (threadIdx.x + u * kThreads) * 4, r = i / HD, d = i % HD;
      qv[u] = r < tile.n_q ? *reinterpret_cast<const float4*>(q_tile + static_cast<int64_t>(r) * a.q_stride + d)
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kQuads; ++u) {
      const int i = (threadIdx.x + u * kThreads) * 4, r = i / HD, d = i % HD;
      __half2* dst = reinterpret_cast<__half2*>(qs + r * L::kLdQ + d);
      dst[0] = __floats2half2_rn(qv[u].x, qv[u].y);
      dst[1] = __floats2half2_rn(qv[u].z, qv[u].w);
    }
  } else {
    for (int i = threadIdx.x; i < kBQ * HD; i += kThreads) {
      const int r = i / HD, d = i % HD;
      qs[r * L::kLdQ + d] = __float2half_rn(r < tile.n_q ? q_tile[static_cast<int64_t>(r) * a.q_stride + d] : 0.0f);
    }
  }
  __syncthreads();
  // This warp's Q as A fragments (rows warp * 16 + [0, 16) of the
  // warpgroup's 64: wgmma's register A layout is mma.sync's per warp).
  uint32_t qf[HD / 16][4];
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) {
    const int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, col = k * 16 + (lane >> 4) * 8;
    ldmatrix_x4(qf[k], smem_addr(qs + r * L::kLdQ + col));
  }
  __syncthreads();  // Q's stage is free once every warp has its fragments

  int32_t p_row[2], lo_row[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int rr = warp * 16 + (lane >> 2) + 8 * r;
    p_row[r] = rr < tile.n_q ? a.pos[tile.t0 + rr] : -1;
    lo_row[r] = a.window > 0 ? max(0, p_row[r] - a.window + 1) : 0;
  }

  // Accumulators in wgmma's layout: per 8 columns n, (row, c), (row, c + 1),
  // (row + 8, c), (row + 8, c + 1) at 4 n + [0, 4) (mma.sync's C per n).
  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // m in log2 units; l this lane's part of the row's sum

  for (int it = 0; it < n_kv_tiles; ++it) {
    if (it + 1 < n_kv_tiles) {
      copy_tile(it + 1);
      if (it + 2 < n_kv_tiles) look_up(it + 2);
    } else {
      cp_async_commit();  // an empty group: the wait below stays "all but the newest"
    }
    cp_async_wait_one();
    fence_proxy_async();
    __syncthreads();
    const int32_t kc = k_lo + it * kBK;
    const uint32_t ks = base + (it & 1) * L::kStage, vs = ks + L::kTile;
    // S = Q K^T: 64 rows x 64 keys, HD / 16 steps of 16 (two core matrices
    // of 128 bytes along head_dim each).
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < HD / 16; ++k) {
      wgmma_m64n64k16_rs<0>(s, qf[k], smem_desc(ks + k * 256, 128, L::kKeyGroup), k > 0);
    }
    wgmma_commit();
    wgmma_wait_all();
    // Scale, softcap, mask; the rows' maxima over the 4 lanes sharing a row.
    float mx[2] = {-INFINITY, -INFINITY};
    auto scale_mask = [&](auto masked) {
#pragma unroll
      for (int n = 0; n < kBK / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          float x = s[4 * n + e] * a.scale;
          if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
          if constexpr (decltype(masked)::value) {
            const int32_t j = kc + n * 8 + (lane & 3) * 2 + (e & 1);
            const bool ok = j < k_hi && j <= p_row[r] && j >= lo_row[r];
            s[4 * n + e] = ok ? x * kLog2e : -INFINITY;
          } else {
            s[4 * n + e] = x * kLog2e;
          }
          mx[r] = fmaxf(mx[r], s[4 * n + e]);
        }
      }
    };
    const bool full = __all_sync(
        0xffffffffu, kc + kBK <= k_hi && kc + kBK - 1 <= min(p_row[0], p_row[1]) && kc >= max(lo_row[0], lo_row[1]));
    if (full) {
      scale_mask(std::false_type{});
    } else {
      scale_mask(std::true_type{});
    }
    float mbase[2], corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      mbase[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: every p is 0
      corr[r] = exp2f(m[r] - mbase[r]);              // 0 while m is -inf
      l[r] *= corr[r];
      m[r] = m_new;
    }
    if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        o[4 * n] *= corr[0];
        o[4 * n + 1] *= corr[0];
        o[4 * n + 2] *= corr[1];
        o[4 * n + 3] *= corr[1];
      }
    }
    // O += P V: P's A fragments straight from the scores; V's 16-key steps
    // are two core matrices of 128 bytes along the keys.
    uint32_t pa[kBK / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      pa[kk][0] = pack_half2(exp2f(s[8 * kk] - mbase[0]), exp2f(s[8 * kk + 1] - mbase[0]), l[0]);
      pa[kk][1] = pack_half2(exp2f(s[8 * kk + 2] - mbase[1]), exp2f(s[8 * kk + 3] - mbase[1]), l[1]);
      pa[kk][2] = pack_half2(exp2f(s[8 * kk + 4] - mbase[0]), exp2f(s[8 * kk + 5] - mbase[0]), l[0]);
      pa[kk][3] = pack_half2(exp2f(s[8 * kk + 6] - mbase[1]), exp2f(s[8 * kk + 7] - mbase[1]), l[1]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      if constexpr (HD == 128) {
        wgmma_m64n128k16_rs<1>(o, pa[kk], smem_desc(vs + kk * 256, 128, L::kVGroup), true);
      } else {
        wgmma_m64n64k16_rs<1>(o, pa[kk], smem_desc(vs + kk * 256, 128, L::kVGroup), true);
      }
    }
    wgmma_commit();
    wgmma_wait_all();
    __syncthreads();  // this stage is free for the load two tiles on
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int rr = warp * 16 + (lane >> 2) + 8 * r;
    if (rr >= tile.n_q) continue;
    float scale = 1.0f;
    if (a.sinks) scale = detail::add_sink(a.sinks[h], m[r] / kLog2e, l[r]);  // the sink joins the denominator
    scale = l[r] > 0.0f ? scale / l[r] : 0.0f;
    Out* out =
        static_cast<Out*>(a.out) + static_cast<int64_t>(tile.t0 + rr) * a.n_head * HD + static_cast<int64_t>(h) * HD;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const int d = n * 8 + (lane & 3) * 2;
      out[d] = detail::from_f32<Out>(o[4 * n + 2 * r] * scale);
      out[d + 1] = detail::from_f32<Out>(o[4 * n + 2 * r + 1] * scale);
    }
  }
#else
  __trap();  // built for sm_90a only; the host side launches it on compute capability 9.0 alone
#endif
}

template <int HD, typename Out>
void launch(const AttentionArgs& a, cudaStream_t stream) {
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(flash_wgmma_kernel<HD, Out>), WgLayout<HD>::kBytes,
                /*max_shared=*/true);
  constexpr int32_t kMaxY = 65535;  // tiles along y, at most 65,535 a launch
  for (int32_t first = 0; first < a.n_tiles; first += kMaxY) {
    AttentionArgs part = a;
    part.tiles = a.tiles + first;
    part.n_tiles = std::min(kMaxY, a.n_tiles - first);
    const dim3 grid(static_cast<unsigned>(a.n_head), static_cast<unsigned>(part.n_tiles));
    flash_wgmma_kernel<HD, Out><<<grid, kThreads, WgLayout<HD>::kBytes, stream>>>(part);
    RILL_CUDA_CHECK_LAUNCH();
  }
}

// Whether the current device runs sm_90a code (compute capability 9.0).
bool device_is_sm90() {
  static int cached[64];  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  if (cached[dev] == 0) {
    int major = 0, minor = 0;
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess;
    cached[dev] = ok && major == 9 && minor == 0 ? 1 : 2;
  }
  return cached[dev] == 1;
}

}  // namespace

bool prefill_flash_wgmma_supported(const AttentionArgs& a) {
  static const bool off = [] {
    const char* env = std::getenv("RILL_CUDA_FLASH_WGMMA");
    return env && std::string(env) == "0";
  }();
  return !off && a.kv_dtype == DType::kF16 && (a.head_dim == 64 || a.head_dim == 128) &&
         reinterpret_cast<uintptr_t>(a.k_cache) % 16 == 0 && reinterpret_cast<uintptr_t>(a.v_cache) % 16 == 0 &&
         device_is_sm90();
}

void prefill_attention_flash_wgmma(const AttentionArgs& a, cudaStream_t stream) {
  if (a.n_tiles <= 0) return;
  if (a.head_dim == 64) {
    RILL_CUDA_DISPATCH_FLOAT(a.out_dtype, launch<64, T>(a, stream));
  } else {
    RILL_CUDA_DISPATCH_FLOAT(a.out_dtype, launch<128, T>(a, stream));
  }
}

}  // namespace rill::cuda
