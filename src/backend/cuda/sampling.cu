#include "backend/cuda/sampling.h"

#include "backend/cuda/device_math.cuh"

namespace rill::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBins = 2048;  // radix digits of 11, 11 and 10 bits over a probability's 32 bits

using u128 = unsigned __int128;

struct Shared {
  union {
    struct {
      unsigned long long lo[kMaxBins];  // bin weights, 128-bit fixed point hi:lo
      unsigned long long hi[kMaxBins];
    } bins;
    double incl[kThreads];  // the draw's per-thread inclusive masses
  };
  u128 warp_u128[kWarps];
  double warp_f64[kWarps];
  uint64_t warp_u64[kWarps];
  u128 above;  // broadcasts of one thread's result
  int32_t pick;
  int32_t result;
};

__device__ __forceinline__ uint32_t fbits(float p) {
  return __float_as_uint(p);
}

// A probability's weight for top-p: floor(p * 2^64). Sums of these are exact
// and order-free (fixed point), so masses do not depend on thread timing.
__device__ __forceinline__ u128 mass_of(float p) {
  if (p >= 1.0f) return u128{1} << 64;
  return __float2ull_rz(__fmul_rn(p, 18446744073709551616.0f));
}
__device__ __forceinline__ double to_double(u128 v) {
  return static_cast<double>(static_cast<uint64_t>(v >> 64)) + static_cast<double>(static_cast<uint64_t>(v)) * 0x1p-64;
}
// ceil(x * 2^64) for 0 <= x < 2^63.
__device__ __forceinline__ u128 fixed_ceil(double x) {
  const double whole = floor(x);
  const double frac = (x - whole) * 18446744073709551616.0;  // exact, < 2^64
  const auto lo = static_cast<uint64_t>(frac);
  u128 r = (u128{static_cast<uint64_t>(whole)} << 64) + lo;
  if (static_cast<double>(lo) < frac) r += 1;
  return r;
}

__device__ __forceinline__ double shfl_up(double v, int o) {
  return __shfl_up_sync(0xffffffffu, v, o);
}
__device__ __forceinline__ u128 shfl_up(u128 v, int o) {
  const auto lo = __shfl_up_sync(0xffffffffu, static_cast<unsigned long long>(v), o);
  const auto hi = __shfl_up_sync(0xffffffffu, static_cast<unsigned long long>(v >> 64), o);
  return (u128{hi} << 64) | lo;
}

// Inclusive scan over the block in thread order with a fixed association
// (warp shuffles, then the warp totals), so the result is deterministic.
// *total receives the block's sum. Ends with a barrier.
template <typename T>
__device__ T block_scan(T v, T* warp_tot, T* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T n = shfl_up(v, o);
    if (lane >= o) v += n;
  }
  if (lane == 31) warp_tot[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = warp_tot[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const T n = shfl_up(w, o);
      if (lane >= o) w += n;
    }
    warp_tot[lane] = w;
  }
  __syncthreads();
  const T r = warp > 0 ? warp_tot[warp - 1] + v : v;
  *total = warp_tot[kWarps - 1];
  __syncthreads();
  return r;
}

__device__ uint64_t block_max_u64(uint64_t v, uint64_t* warp_tot) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, static_cast<uint64_t>(__shfl_xor_sync(0xffffffffu, v, o)));
  if ((threadIdx.x & 31) == 0) warp_tot[threadIdx.x >> 5] = v;
  __syncthreads();
  uint64_t r = warp_tot[0];
  for (int w = 1; w < kWarps; ++w) r = max(r, warp_tot[w]);
  __syncthreads();
  return r;
}

// Logit i as the draw sees it: -inf where the row's mask (null: none)
// disallows the token, as the host Sampler's apply_mask writes it.
__device__ __forceinline__ float masked_logit(const float* x, const uint32_t* allow, int64_t i) {
  return !allow || token_mask_allows(allow, i) ? x[i] : -INFINITY;
}

// Lowest index of the (masked) row maximum (the CPU sampler's argmax).
__device__ int32_t block_argmax(const float* x, const uint32_t* allow, int64_t n, Shared& sh) {
  float v = -INFINITY;
  int64_t idx = n;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float e = masked_logit(x, allow, i);
    if (e > v || idx == n) {
      v = e;
      idx = i;
    }
  }
  // Key: value order (-0 as +0), then the lower index.
  const uint32_t vb = fbits(v == 0.0f ? 0.0f : v);
  uint64_t key = (static_cast<uint64_t>(vb ^ ((vb >> 31) ? 0xffffffffu : 0x80000000u)) << 32) |
                 (0xffffffffu - static_cast<uint32_t>(idx));
  if (idx == n) key = 0;
  key = block_max_u64(key, sh.warp_u64);
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key));
}

// Among the candidates (key >= lo), walking down the ranking, the key of the
// first one whose running weight reaches the target. kMass: weight
// mass_of(p) and target ceil(top_p * candidates' mass); otherwise weight 1
// and target count (a top-k of `count`). Requires the candidates' weight to
// reach the target. Three radix passes find the boundary's probability, one
// more its id among equal probabilities (ids ascending).
template <bool kMass>
__device__ uint64_t select_bound(const float* p, int64_t n, uint64_t lo, u128 count, float top_p, Shared& sh) {
  const int tid = threadIdx.x;
  uint32_t prefix = 0, mask = 0;
  u128 above = 0, target = count;
  for (int d = 0; d < 3; ++d) {
    const int shift = d == 0 ? 21 : d == 1 ? 10 : 0;
    const int n_bins = d == 2 ? 1024 : 2048;
    for (int b = tid; b < n_bins; b += kThreads) sh.bins.lo[b] = sh.bins.hi[b] = 0;
    __syncthreads();
    for (int64_t i = tid; i < n; i += kThreads) {
      const float pi = p[i];
      const uint32_t b = fbits(pi);
      const bool skip = (b & mask) != prefix || sampling_key(pi, static_cast<int32_t>(i)) < lo;
      const int bin = skip ? -1 : static_cast<int>((b >> shift) & static_cast<uint32_t>(n_bins - 1));
      if (!kMass) {
        // Counts: one atomic per distinct bin of the warp (rows of equal
        // probabilities, e.g. underflowed zeros, would serialise otherwise).
        const unsigned peers = __match_any_sync(__activemask(), bin);
        if (bin >= 0 && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&sh.bins.lo[bin], 1ull * __popc(peers));
        continue;
      }
      if (skip) continue;
      const u128 w = mass_of(pi);
      if (w == 0) continue;
      const auto wlo = static_cast<unsigned long long>(w);
      const auto whi = static_cast<unsigned long long>(w >> 64);
      if (wlo) {
        const unsigned long long old = atomicAdd(&sh.bins.lo[bin], wlo);
        if (old + wlo < old) atomicAdd(&sh.bins.hi[bin], 1ull);  // carry: counted once per wrap, any order
      }
      if (whi) atomicAdd(&sh.bins.hi[bin], whi);
    }
    __syncthreads();
    // Bins from the top: thread t owns ranks [t * per, (t + 1) * per).
    const int per = n_bins / kThreads;
    auto bin_weight = [&](int rank) {
      const int bin = n_bins - 1 - rank;
      return (u128{sh.bins.hi[bin]} << 64) + sh.bins.lo[bin];
    };
    u128 s = 0;
    for (int j = 0; j < per; ++j) s += bin_weight(tid * per + j);
    u128 total;
    const u128 incl = block_scan(s, sh.warp_u128, &total);
    if (kMass && d == 0) target = fixed_ceil(static_cast<double>(top_p) * to_double(total));
    const u128 excl = incl - s;
    if (above + excl < target && above + incl >= target) {
      u128 cum = above + excl;
      for (int j = 0; j < per; ++j) {
        const u128 w = bin_weight(tid * per + j);
        if (cum + w >= target) {
          sh.pick = n_bins - 1 - (tid * per + j);
          sh.above = cum;
          break;
        }
        cum += w;
      }
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(sh.pick) << shift;
    mask |= static_cast<uint32_t>(n_bins - 1) << shift;
    above = sh.above;
    __syncthreads();  // before the bins are cleared again
  }
  // The boundary probability is pb; keep the first `need` candidates equal
  // to it in id order.
  const float pb = __uint_as_float(prefix);
  const u128 wb = kMass ? mass_of(pb) : u128{1};
  const u128 gap = target - above;
  u128 need = kMass ? u128{static_cast<uint64_t>(to_double(gap) / to_double(wb))} : gap;
  while (need * wb < gap) ++need;
  while (need > 1 && (need - 1) * wb >= gap) --need;
  const int64_t chunk = (n + kThreads - 1) / kThreads;
  const int64_t begin = tid * chunk, end = min(n, begin + chunk);
  u128 c = 0;
  for (int64_t i = begin; i < end; ++i) {
    if (fbits(p[i]) == prefix && sampling_key(p[i], static_cast<int32_t>(i)) >= lo) ++c;
  }
  u128 total;
  const u128 incl = block_scan(c, sh.warp_u128, &total);
  u128 seen = incl - c;
  if (seen < need && need <= incl) {
    for (int64_t i = begin; i < end; ++i) {
      if (fbits(p[i]) == prefix && sampling_key(p[i], static_cast<int32_t>(i)) >= lo && ++seen == need) {
        sh.pick = static_cast<int32_t>(i);
        break;
      }
    }
  }
  __syncthreads();
  const uint64_t bound = sampling_key(pb, sh.pick);
  __syncthreads();
  return bound;
}

// Inverse CDF over the kept set (key >= bound) in id order: the first id
// whose running mass exceeds u * (kept mass); the last kept id if rounding
// leaves none. Each thread sums a contiguous chunk; the first thread whose
// inclusive mass exceeds the number walks on from its chunk.
__device__ int32_t draw(const float* p, int64_t n, uint64_t bound, double u, Shared& sh) {
  const int tid = threadIdx.x;
  const int64_t chunk = (n + kThreads - 1) / kThreads;
  const int64_t begin = tid * chunk, end = min(n, begin + chunk);
  double s = 0.0;
  int64_t last = -1;
  for (int64_t i = begin; i < end; ++i) {
    const float pi = p[i];
    if (sampling_key(pi, static_cast<int32_t>(i)) >= bound) {
      s += pi;
      last = i;
    }
  }
  double total;
  const double incl = block_scan(s, sh.warp_f64, &total);
  sh.incl[tid] = incl;
  if (tid == 0) sh.pick = kThreads;
  const uint64_t last_all = block_max_u64(static_cast<uint64_t>(last + 1), sh.warp_u64);  // 0: none
  const double r = u * total;
  if (incl > r) atomicMin(&sh.pick, tid);
  __syncthreads();
  const int claim = sh.pick;
  if (claim == kThreads && tid == 0) sh.result = static_cast<int32_t>(last_all) - 1;
  if (tid == claim) {
    double cum = tid > 0 ? sh.incl[tid - 1] : 0.0;
    int32_t id = static_cast<int32_t>(last_all) - 1;
    for (int64_t i = begin; i < n; ++i) {
      const float pi = p[i];
      if (sampling_key(pi, static_cast<int32_t>(i)) < bound) continue;
      cum += pi;
      if (cum > r) {
        id = static_cast<int32_t>(i);
        break;
      }
    }
    sh.result = id;
  }
  __syncthreads();
  return sh.result;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(float* logits, int64_t n, const DeviceSamplingParams* params,
                                                          TokenMasks masks, int32_t* ids, uint64_t* kept_bounds) {
  __shared__ Shared sh;
  const int tid = threadIdx.x;
  float* x = logits + static_cast<int64_t>(blockIdx.x) * n;
  const int32_t mask = masks.n_masked > 0 ? masks.row_mask[blockIdx.x] : -1;
  const uint32_t* allow = mask >= 0 ? masks.words + mask * masks.n_words : nullptr;
  if (!params || sampling_is_argmax(params[blockIdx.x].temperature, params[blockIdx.x].top_k)) {
    // Masked: the host's argmax of the masked logits, which is also its
    // answer when that argmax is not allowed (a row of -inf).
    const int32_t id = block_argmax(x, allow, n, sh);
    if (tid == 0) {
      ids[blockIdx.x] = id;
      if (kept_bounds) kept_bounds[blockIdx.x] = ~uint64_t{0};
    }
    return;
  }
  const DeviceSamplingParams P = params[blockIdx.x];
  // Probabilities in place (0 where the mask disallows), and the
  // first-ranked key (p = 1, lowest id).
  float m = -INFINITY;
  for (int64_t i = tid; i < n; i += kThreads) m = fmaxf(m, masked_logit(x, allow, i));
  m = detail::warp_max(m);
  if ((tid & 31) == 0) sh.warp_f64[tid >> 5] = m;
  __syncthreads();
  m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, static_cast<float>(sh.warp_f64[w]));
  const float inv_t = __fdiv_rn(1.0f, P.temperature);
  uint64_t top = 0, first_max = 0;  // first_max: masked rows, 0xffffffff - the lowest id holding m
  for (int64_t i = tid; i < n; i += kThreads) {
    const float l = masked_logit(x, allow, i);
    if (allow && l == m) first_max = max(first_max, static_cast<uint64_t>(0xffffffffu - static_cast<uint32_t>(i)));
    const float p = sampling_prob(l, m, inv_t);
    x[i] = p;
    top = max(top, sampling_key(p, static_cast<int32_t>(i)));
  }
  top = block_max_u64(top, sh.warp_u64);  // its barrier also publishes x
  // A masked row's draw that lands outside the mask (the last kept id, when
  // rounding leaves none) takes the argmax of the masked logits instead, as
  // the host Sampler does.
  int32_t fallback = 0;
  if (allow) {
    first_max = block_max_u64(first_max, sh.warp_u64);
    fallback = first_max ? static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(first_max)) : 0;
  }

  uint64_t bound = 0;
  if (P.top_k > 0 && P.top_k < n) bound = select_bound<false>(x, n, 0, static_cast<u128>(P.top_k), 0.0f, sh);
  if (P.top_p < 1.0f) bound = P.top_p > 0.0f ? select_bound<true>(x, n, bound, 0, P.top_p, sh) : top;
  if (P.min_p > 0.0f) bound = max(bound, sampling_min_p_bound(P.min_p));
  bound = min(bound, top);
  int32_t id = draw(x, n, bound, sampling_uniform(P.seed, P.counter), sh);
  if (allow && (id < 0 || !token_mask_allows(allow, id))) id = fallback;
  if (tid == 0) {
    ids[blockIdx.x] = id;
    if (kept_bounds) kept_bounds[blockIdx.x] = bound;
  }
}

}  // namespace

void sample_rows(float* logits, int64_t n_rows, int64_t n_vocab, const DeviceSamplingParams* params,
                 const TokenMasks& masks, int32_t* ids, uint64_t* kept_bounds, cudaStream_t stream) {
  if (n_rows <= 0) return;
  sample_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(logits, n_vocab, params, masks, ids,
                                                                        kept_bounds);
  RILL_CUDA_CHECK_LAUNCH();
}

}  // namespace rill::cuda
