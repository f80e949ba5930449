// Prefill attention on the tensor cores (WMMA, f16 in, f32 accumulate) for
// f16, fp8 (e4m3), q8_0 and q4_0 KV caches (and every other type load8h
// reads, mma_tile.cuh) and head_dim 64, 128, 256 or 512:
// K/V tiles are converted to f16 as they are loaded into shared memory
// (load8h: f16 as it is, e4m3 exactly, a q8_0/q4_0 element's scale x level
// rounded to f16 once: a relative 2^-11 on top of the block's own error),
// so the context is never copied out dequantized. FlashAttention-2's loop:
// a block takes kRows queries of one head (warps of 16 query rows each) and
// walks K/V tiles of kKeys keys in shared memory; head_dim up to 256 takes
// a whole tile of kPrefillTileQMma (64) queries per block and 64-key tiles,
// head_dim 512 (Gemma 4's full layers) half a tile per block (grid z picks
// the half) and 32-key tiles, so its Q, K, V and output rows fit the 227 KB
// of shared memory (169 KB; 64 queries would need 358 KB; 2 warps a block,
// one block per SM: 9-14x slower (by KV type) than attention_wide.cu's kernel, which runs
// 256 and 512 unless RILL_CUDA_FLASH_PREFILL=0 or RILL_CUDA_WIDE_PREFILL
// says otherwise; docs/perf.md). Scores and the online softmax stay f32; q is
// rounded to f16 before Q K^T and the probabilities to f16 before P V (as
// llama.cpp's f16 attention does), so outputs differ from the f32 reference
// by ~1e-3 relative (tests/cuda/cuda_attention_test.cpp).
//
// The output accumulator lives in shared memory (each warp owns its rows):
// WMMA fragments have no documented element layout, so rows are rescaled
// there between tiles.
#include <mma.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_mma.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kv_types.cuh"
#include "backend/cuda/mma_tile.cuh"
#include "backend/cuda/smem_opt_in.h"

namespace rill::cuda {
namespace {

using namespace nvcuda;
using detail::from_f32;
using detail::load8h;

// A block's shape at head_dim HD: kRows queries (kWarps warps of 16 rows),
// K/V tiles of kKeys keys; kParts blocks share a tile of kPrefillTileQMma
// queries (grid z), each taking rows [z kRows, (z + 1) kRows) of it.
template <int HD>
struct Smem {
  static constexpr int kRows = HD <= 256 ? 64 : 32;
  static constexpr int kKeys = HD <= 256 ? 64 : 32;
  static constexpr int kWarps = kRows / 16;
  static constexpr int kParts = kPrefillTileQMma / kRows;
  static constexpr int kHalf = kKeys / 2;  // score columns per lane (2 lanes per row)
  static constexpr int kBQ = kRows, kBK = kKeys;
  static constexpr int kLdH = HD + 8;   // halves per Q/K/V row (pad: fewer bank conflicts; ldm % 8 == 0)
  static constexpr int kLdS = kBK + 4;  // floats per score row
  static constexpr int kLdP = kBK + 8;  // halves per probability row
  static constexpr int kLdO = HD + 4;   // floats per output row
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + sizeof(half) * kBQ * kLdH;
  static constexpr size_t kV = kK + sizeof(half) * kBK * kLdH;
  static constexpr size_t kS = kV + sizeof(half) * kBK * kLdH;
  static constexpr size_t kP = kS + sizeof(float) * kBQ * kLdS;
  static constexpr size_t kO = kP + sizeof(half) * kBQ * kLdP;
  static constexpr size_t kStats = kO + sizeof(float) * kBQ * kLdO;  // m, l, corr [kBQ] each
  static constexpr size_t kBytes = kStats + sizeof(float) * 3 * kBQ;
  static_assert(kPrefillTileQMma % kRows == 0 && kBytes <= 227 * 1024, "a block must fit an SM's shared memory");
};

__device__ __forceinline__ int64_t cache_row(const AttentionArgs& a, const int32_t* table, int32_t j) {
  const int32_t mask = (1 << a.block_shift) - 1;
  return (static_cast<int64_t>(table[j >> a.block_shift]) << a.block_shift) + (j & mask);
}

template <typename KvT, int HD, typename Out>
__global__ void __launch_bounds__(Smem<HD>::kWarps * 32) prefill_mma_kernel(AttentionArgs a) {
  using L = Smem<HD>;
  constexpr int kBQ = L::kBQ, kBK = L::kBK, kWarps = L::kWarps, kHalf = L::kHalf;
  extern __shared__ __align__(128) uint8_t smem[];
  half* qs = reinterpret_cast<half*>(smem + L::kQ);
  half* ks = reinterpret_cast<half*>(smem + L::kK);
  half* vs = reinterpret_cast<half*>(smem + L::kV);
  float* ss = reinterpret_cast<float*>(smem + L::kS);
  half* ps = reinterpret_cast<half*>(smem + L::kP);
  float* os = reinterpret_cast<float*>(smem + L::kO);
  float* m_s = reinterpret_cast<float*>(smem + L::kStats);
  float* l_s = m_s + kBQ;
  float* c_s = l_s + kBQ;

  // This block's rows of the tile: [t0, t0 + n_q) (flat token indices).
  const PrefillTile whole = a.tiles[blockIdx.x];
  PrefillTile tile = whole;
  tile.t0 = whole.t0 + static_cast<int32_t>(blockIdx.z) * kBQ;
  tile.n_q = min(kBQ, whole.n_q - static_cast<int32_t>(blockIdx.z) * kBQ);
  if (tile.n_q <= 0) return;  // a short tile's unused part (the whole block)
  const int h = blockIdx.y, kvh = h / (a.n_head / a.n_head_kv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int32_t* table = a.block_tables + a.table_start[tile.seq];
  const int64_t row_bytes = KvT::row_bytes(static_cast<int64_t>(a.n_head_kv) * HD);
  const auto* kbase = static_cast<const uint8_t*>(a.k_cache);
  const auto* vbase = static_cast<const uint8_t*>(a.v_cache);
  const int64_t head_e = static_cast<int64_t>(kvh) * HD;  // the head's first element in a row

  for (int i = threadIdx.x; i < kBQ * HD; i += kWarps * 32) {
    const int r = i / HD, d = i % HD;
    const float q =
        r < tile.n_q ? a.q[static_cast<int64_t>(tile.t0 + r) * a.q_stride + static_cast<int64_t>(h) * HD + d] : 0.0f;
    qs[r * L::kLdH + d] = __float2half_rn(q);
  }
  for (int i = threadIdx.x; i < kBQ * L::kLdO; i += kWarps * 32) os[i] = 0.0f;
  if (threadIdx.x < kBQ) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.0f;
  }
  const int32_t p_first = a.pos[tile.t0], p_last = a.pos[tile.t0 + tile.n_q - 1];
  const int32_t k_lo = a.window > 0 ? max(0, p_first - a.window + 1) : 0, k_hi = p_last + 1;
  // This lane's softmax row (2 lanes per row, kHalf columns each).
  const int sr = warp * 16 + (lane >> 1), sc0 = (lane & 1) * kHalf;
  const bool row_ok = sr < tile.n_q;
  const int32_t p_row = row_ok ? a.pos[tile.t0 + sr] : -1;
  const int32_t lo_row = a.window > 0 ? max(0, p_row - a.window + 1) : 0;
  const bool warp_active = warp * 16 < tile.n_q;
  float* s_w = ss + warp * 16 * L::kLdS;
  half* p_w = ps + warp * 16 * L::kLdP;
  float* o_w = os + warp * 16 * L::kLdO;
  const half* q_w = qs + warp * 16 * L::kLdH;

  for (int32_t kc = k_lo; kc < k_hi; kc += kBK) {
    __syncthreads();               // the previous tile's K/V are no longer read
    constexpr int kVecs = HD / 8;  // 16-byte vectors per row
    for (int i = threadIdx.x; i < kBK * kVecs; i += kWarps * 32) {
      const int jj = i / kVecs, v = i % kVecs;
      const int32_t j = kc + jj;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (j < k_hi) {
        const int64_t row = cache_row(a, table, j) * row_bytes;
        kv = load8h<KvT>(kbase + row, head_e + v * 8);
        vv = load8h<KvT>(vbase + row, head_e + v * 8);
      }
      *reinterpret_cast<uint4*>(ks + jj * L::kLdH + v * 8) = kv;
      *reinterpret_cast<uint4*>(vs + jj * L::kLdH + v * 8) = vv;
    }
    __syncthreads();
    if (!warp_active) continue;

    // S = Q K^T for this warp's 16 rows x 64 keys.
    {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> s[kBK / 16];
#pragma unroll
      for (int n = 0; n < kBK / 16; ++n) wmma::fill_fragment(s[n], 0.0f);
#pragma unroll
      for (int k = 0; k < HD / 16; ++k) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> qa;
        wmma::load_matrix_sync(qa, q_w + k * 16, L::kLdH);
#pragma unroll
        for (int n = 0; n < kBK / 16; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> kb;
          wmma::load_matrix_sync(kb, ks + n * 16 * L::kLdH + k * 16, L::kLdH);
          wmma::mma_sync(s[n], qa, kb, s[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < kBK / 16; ++n) wmma::store_matrix_sync(s_w + n * 16, s[n], L::kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax over the tile, f32; probabilities rounded to f16.
    {
      const int r = lane >> 1;
      float sv[kHalf];
      float tmax = -INFINITY;
#pragma unroll
      for (int c = 0; c < kHalf; ++c) {
        const int32_t j = kc + sc0 + c;
        const bool ok = row_ok && j < k_hi && j <= p_row && j >= lo_row;
        float x = s_w[r * L::kLdS + sc0 + c] * a.scale;
        if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
        sv[c] = ok ? x : -INFINITY;
        tmax = fmaxf(tmax, sv[c]);
      }
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
      const float m_old = m_s[warp * 16 + r];
      const float m_new = fmaxf(m_old, tmax);
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < kHalf; ++c) {
        const half pv = __float2half_rn(sv[c] == -INFINITY ? 0.0f : __expf(sv[c] - m_new));
        p_w[r * L::kLdP + sc0 + c] = pv;
        sum += __half2float(pv);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      if ((lane & 1) == 0) {
        const float corr = m_new == -INFINITY ? 1.0f : (m_old == -INFINITY ? 0.0f : __expf(m_old - m_new));
        c_s[warp * 16 + r] = corr;
        l_s[warp * 16 + r] = l_s[warp * 16 + r] * corr + sum;
        m_s[warp * 16 + r] = m_new;
      }
    }
    __syncwarp();
    for (int i = lane; i < 16 * HD; i += 32) {
      const int r = i / HD, d = i % HD;
      o_w[r * L::kLdO + d] *= c_s[warp * 16 + r];
    }
    __syncwarp();

    // O += P V.
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
      wmma::load_matrix_sync(o, o_w + n * 16, L::kLdO, wmma::mem_row_major);
#pragma unroll
      for (int k = 0; k < kBK / 16; ++k) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> pa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> vb;
        wmma::load_matrix_sync(pa, p_w + k * 16, L::kLdP);
        wmma::load_matrix_sync(vb, vs + k * 16 * L::kLdH + n * 16, L::kLdH);
        wmma::mma_sync(o, pa, vb, o);
      }
      wmma::store_matrix_sync(o_w + n * 16, o, L::kLdO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (!warp_active) return;
  for (int i = lane; i < 16 * HD; i += 32) {
    const int r = i / HD, d = i % HD;
    const int row = warp * 16 + r;
    if (row >= tile.n_q) continue;
    float l = l_s[row], o = o_w[r * L::kLdO + d];
    if (a.sinks) o *= detail::add_sink(a.sinks[h], m_s[row], l);  // the sink joins the denominator
    Out* out =
        static_cast<Out*>(a.out) + static_cast<int64_t>(tile.t0 + row) * a.n_head * HD + static_cast<int64_t>(h) * HD;
    out[d] = from_f32<Out>(l > 0.0f ? o / l : 0.0f);
  }
}

template <typename KvT, int HD, typename Out>
void launch(const AttentionArgs& a, cudaStream_t stream) {
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(prefill_mma_kernel<KvT, HD, Out>), Smem<HD>::kBytes);
  const dim3 grid(static_cast<unsigned>(a.n_tiles), static_cast<unsigned>(a.n_head), Smem<HD>::kParts);
  prefill_mma_kernel<KvT, HD, Out><<<grid, Smem<HD>::kWarps * 32, Smem<HD>::kBytes, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool prefill_tile_kv(DType kv_dtype) {
  return kv_dtype == DType::kF16 || kv_dtype == DType::kBF16 || kv_dtype == kF8E4M3 || kv_dtype == DType::kQ8_0 ||
         kv_dtype == DType::kQ4_0 || kv_dtype == DType::kQ4_1 || kv_dtype == DType::kQ5_0 || kv_dtype == DType::kQ5_1 ||
         kv_dtype == DType::kIQ4_NL || kv_dtype == kKvQ8_0x64 || kv_dtype == kKvIq4Nl64;
}

void require_prefill_tile_kv(DType kv_dtype, const char* kernel) {
  if (prefill_tile_kv(kv_dtype)) return;
  std::fprintf(stderr, "%s: KV type %s is not one it reads\n", kernel, std::string(dtype_name(kv_dtype)).c_str());
  std::abort();
}

bool prefill_mma_supported(DType kv_dtype, int32_t head_dim) {
  return prefill_tile_kv(kv_dtype) && (head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512);
}

template <typename KvT>
void launch_hd(const AttentionArgs& a, cudaStream_t stream) {
  if (a.head_dim == 64) {
    RILL_CUDA_DISPATCH_FLOAT(a.out_dtype, launch<KvT, 64, T>(a, stream));
  } else if (a.head_dim == 128) {
    RILL_CUDA_DISPATCH_FLOAT(a.out_dtype, launch<KvT, 128, T>(a, stream));
  } else if (a.head_dim == 256) {  // Qwen3.5, Gemma 3: 195 KB of shared memory, one block per SM
    RILL_CUDA_DISPATCH_FLOAT(a.out_dtype, launch<KvT, 256, T>(a, stream));
  } else {  // 512 (Gemma 4's full layers): 169 KB, half a tile per block
    RILL_CUDA_DISPATCH_FLOAT(a.out_dtype, launch<KvT, 512, T>(a, stream));
  }
}

void prefill_attention_mma(const AttentionArgs& a, cudaStream_t stream) {
  if (a.n_tiles <= 0) return;
  static const bool flash = [] {
    const char* env = std::getenv("RILL_CUDA_FLASH_PREFILL");
    return !(env && std::string(env) == "0");
  }();
  if (flash && prefill_flash_supported(a)) {
    prefill_attention_flash(a, stream);
    return;
  }
  // RILL_CUDA_WIDE_PREFILL=512: the wide kernel at 512 only, =0: at
  // neither (the WMMA kernel at 256 and 512), for comparisons; unset or
  // any other value: the default, the wide kernel at 256 and 512.
  static const int32_t wide_from = [] {
    const char* env = std::getenv("RILL_CUDA_WIDE_PREFILL");
    const std::string v = env ? env : "";
    return v == "0" ? kMaxHeadDim + 1 : v == "512" ? 512 : 0;
  }();
  if (flash && a.head_dim >= wide_from && prefill_wide_supported(a.kv_dtype, a.head_dim)) {
    prefill_attention_wide(a, stream);
    return;
  }
  require_prefill_tile_kv(a.kv_dtype, "prefill_attention_mma");
  RILL_CUDA_DISPATCH_KV(a.kv_dtype, if constexpr (!std::is_same_v<KvT, detail::KvF32>) launch_hd<KvT>(a, stream));
}

}  // namespace rill::cuda
