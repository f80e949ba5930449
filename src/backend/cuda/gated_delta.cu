// Gated DeltaNet kernels (see gated_delta.h): the causal conv1d with its
// window state, the q/k l2 norms and gates, the delta-rule recurrence, the
// gated RMSNorm, and the gated attention's sigmoid output gate.
#include <cuda_pipeline.h>

#include <cassert>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gated_delta.h"

namespace rill::cuda {
namespace {

using detail::block_sum;
using detail::from_f32;
using detail::warp_sum;

__device__ __forceinline__ float silu(float x) {
  return x / (1.0f + expf(-x));
}
// torch.nn.functional.softplus (beta 1, threshold 20), as the CPU.
__device__ __forceinline__ float softplus(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}

__device__ __forceinline__ float* state_of(const GdnArgs& a, int32_t id) {
  return a.states + static_cast<int64_t>(id) * a.state_stride;
}

// One block per (token, head): heads [0, nk) are q, [nk, 2nk) k, then the
// nv value heads; one thread per channel. Token i of its sequence reads the
// window inputs i .. i+K-1 of (src window | the step's inputs); each output
// is computed from the inputs alone, so every token runs in parallel.
__global__ void conv_out_kernel(GdnArgs a) {
  __shared__ float red[32];
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t t = blockIdx.x;
  const int hb = static_cast<int>(blockIdx.y);
  const int nk = a.n_k_heads, dk = a.head_k_dim, dv = a.head_v_dim;
  const bool is_q = hb < nk, is_k = !is_q && hb < 2 * nk;
  const int width = is_q || is_k ? dk : dv;
  const int64_t ch0 = is_q   ? int64_t{hb} * dk
                      : is_k ? a.key_dim() + int64_t{hb - nk} * dk
                             : 2 * a.key_dim() + int64_t{hb - 2 * nk} * dv;
  const GdnSeq s = a.seqs[a.tok_seq[t]];
  const int i = static_cast<int>(t - s.q_start);
  const int K = a.conv_kernel, km1 = K - 1;
  const int c = static_cast<int>(threadIdx.x);
  float y = 0.0f;
  if (c < width) {
    const int64_t ch = ch0 + c;
    const float* w = a.conv_w + ch * K;
    const float* win = s.src >= 0 ? state_of(a, s.src) + ch * km1 : nullptr;
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) {
      const int m = i + j;  // index into (window | step inputs)
      const float x = m < km1 ? (win ? win[m] : 0.0f) : a.proj[(s.q_start + m - km1) * a.proj_stride + ch];
      acc += w[j] * x;
    }
    y = silu(acc);
  }
  float* out = a.mixed + t * a.conv_dim() + ch0;
  if (is_q || is_k) {  // l2norm over the head (x * rsqrt(sum x^2 + 1e-6)), q also scaled by dk^-1/2
    const float ss = block_sum(y * y, red);
    const float inv = 1.0f / sqrtf(ss + 1e-6f);
    const float scale = is_q ? 1.0f / sqrtf(static_cast<float>(dk)) : 1.0f;
    if (c < width) out[c] = is_q ? (y * inv) * scale : y * inv;
    return;
  }
  if (c < width) out[c] = y;
  if (c == 0) {
    const int h = hb - 2 * nk;
    const float* row = a.proj + t * a.proj_stride;
    a.beta[t * a.n_v_heads + h] = 1.0f / (1.0f + expf(-row[a.b_off + h]));
    a.g[t * a.n_v_heads + h] = a.neg_a[h] * softplus(row[a.a_off + h] + a.dt_bias[h]);
  }
}

// One thread per (sequence, channel): the window after the step's last
// token into dst, and after each save's token into its state. The src
// window is read whole before anything is written (src may be dst).
__global__ void conv_state_kernel(GdnArgs a) {
  detail::pdl_wait();
  detail::pdl_trigger();
  const GdnSeq s = a.seqs[blockIdx.x];
  const int64_t ch = int64_t{blockIdx.y} * blockDim.x + threadIdx.x;
  if (ch >= a.conv_dim()) return;
  const int km1 = a.conv_kernel - 1;
  float old[kGdnMaxConvKernel - 1];
  const float* win = s.src >= 0 ? state_of(a, s.src) + ch * km1 : nullptr;
#pragma unroll
  for (int m = 0; m < kGdnMaxConvKernel - 1; ++m) old[m] = win && m < km1 ? win[m] : 0.0f;
  auto input = [&](int m) {  // element m of (window | step inputs)
    return m < km1 ? old[m] : a.proj[(s.q_start + m - km1) * a.proj_stride + ch];
  };
  for (int k = 0; k < s.n_saves; ++k) {
    const GdnSave v = a.saves[s.save_begin + k];
    float* dst = state_of(a, v.state) + ch * km1;
    for (int m = 0; m < km1; ++m) dst[m] = input(v.after_token + 1 + m);
  }
  float* dst = state_of(a, s.dst) + ch * km1;
  for (int m = 0; m < km1; ++m) dst[m] = input(s.q_len + m);
}

// The recurrence: one warp per (sequence, value head, C value columns).
// Lane (rg, c) = (lane / C, lane % C) holds column c of the warp's C and
// rows [rg * RPL, (rg + 1) * RPL) of S [dk, dv] in registers for the whole
// step, so k'^T S and q'^T S are RPL in-lane FMAs and log2(32 / C) shuffles
// over the row groups; with C = 8 each state load or store moves whole
// 32-byte sectors (8 lanes read one row's 8 columns). C = 4 doubles the
// warps (more latency hidden when few sequences run) with half the rows per lane. Each warp streams its tokens' q', k',
// v, g and beta through a ring of kStages shared-memory slots filled by
// cp.async kStages - 1 tokens ahead. Rows past dk read zeros.
constexpr int kWarpsPerBlock = 4;
constexpr int kStages = 4;

// Floats of one ring slot: q' [DK4] | k' [DK4] | v [C] | g | beta | pad 2,
// DK4 = (32 / C) * RPL rows (>= dk).
__host__ __device__ constexpr int slot_floats(int rpl, int c) {
  return 2 * (32 / c) * rpl + c + 4;
}

template <int RPL, int C>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) delta_kernel(GdnArgs a) {
  extern __shared__ float4 smem4[];
  detail::pdl_wait();
  detail::pdl_trigger();
  constexpr int DK4 = (32 / C) * RPL, SLOT = slot_floats(RPL, C);
  const int lane = static_cast<int>(threadIdx.x & 31), rg = lane / C, col = lane % C;
  float* ring = reinterpret_cast<float*>(smem4) + (threadIdx.x >> 5) * kStages * SLOT;
  const int64_t w = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5);
  const int dk = a.head_k_dim, dv = a.head_v_dim, nv = a.n_v_heads;
  const int ncg = dv / C;
  if (w >= int64_t{a.n_seqs} * nv * ncg) return;
  const int cg = static_cast<int>(w % ncg);
  const int h = static_cast<int>((w / ncg) % nv);
  const GdnSeq s = a.seqs[w / (int64_t{ncg} * nv)];
  const int kh = h / (nv / a.n_k_heads);
  const int64_t kd = a.key_dim(), vd = a.value_dim(), cd = a.conv_dim();
  // This lane's column of head h's state, relative to a state's layer base; its rows are i = rg * RPL + r.
  const int64_t lane_off = a.conv_floats() + int64_t{h} * dk * dv + cg * C + col;

  // Rows past dk stay zero in every slot (the copies never write them).
  for (int i = dk + lane; i < DK4; i += 32) {
    for (int st = 0; st < kStages; ++st) ring[st * SLOT + i] = ring[st * SLOT + DK4 + i] = 0.0f;
  }
  auto issue = [&](int t) {  // token t's inputs into slot t % kStages, one commit group per token
    float* dst = ring + (t % kStages) * SLOT;
    const int64_t T = s.q_start + t;
    const float* row = a.mixed + T * cd;
    const int n4 = dk / 4;
    for (int i = lane; i < 2 * n4 + C / 4; i += 32) {
      const float* src = i < n4       ? row + int64_t{kh} * dk + 4 * i
                         : i < 2 * n4 ? row + kd + int64_t{kh} * dk + 4 * (i - n4)
                                      : row + 2 * kd + int64_t{h} * dv + cg * C + 4 * (i - 2 * n4);
      float* d = i < n4 ? dst + 4 * i : i < 2 * n4 ? dst + DK4 + 4 * (i - n4) : dst + 2 * DK4 + 4 * (i - 2 * n4);
      __pipeline_memcpy_async(d, src, 16);
    }
    if (lane == 0) {
      __pipeline_memcpy_async(dst + 2 * DK4 + C, a.g + T * nv + h, 4);
      __pipeline_memcpy_async(dst + 2 * DK4 + C + 1, a.beta + T * nv + h, 4);
    }
    __pipeline_commit();
  };
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < s.q_len) {
      issue(t);
    } else {
      __pipeline_commit();
    }
  }

  float S[RPL];
  {
    const float* src = s.src >= 0 ? state_of(a, s.src) + lane_off : nullptr;
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
      const int i = rg * RPL + r;
      S[r] = src && i < dk ? src[int64_t{i} * dv] : 0.0f;
    }
  }
  auto store = [&](int32_t id) {
    float* dst = state_of(a, id) + lane_off;
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
      const int i = rg * RPL + r;
      if (i < dk) dst[int64_t{i} * dv] = S[r];
    }
  };

  int next_save = 0;
  int32_t save_at = s.n_saves > 0 ? a.saves[s.save_begin].after_token : -1;
  for (int t = 0; t < s.q_len; ++t) {
    if (t + kStages - 1 < s.q_len) {
      issue(t + kStages - 1);
    } else {
      __pipeline_commit();
    }
    __pipeline_wait_prior(kStages - 1);
    __syncwarp();
    const float* slot = ring + (t % kStages) * SLOT;
    const float* qs = slot + rg * RPL;  // this lane's rows of q' and k'
    const float* ks = slot + DK4 + rg * RPL;
    float k[RPL];
    if constexpr (RPL % 4 == 0) {
#pragma unroll
      for (int r = 0; r < RPL; r += 4) {
        const float4 kv = *reinterpret_cast<const float4*>(ks + r);
        k[r] = kv.x, k[r + 1] = kv.y, k[r + 2] = kv.z, k[r + 3] = kv.w;
      }
    } else {
#pragma unroll
      for (int r = 0; r < RPL; ++r) k[r] = ks[r];
    }
    const float v = slot[2 * DK4 + col], decay = expf(slot[2 * DK4 + C]), beta = slot[2 * DK4 + C + 1];
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < RPL; ++r) p[r % 4] += k[r] * S[r];
    float acc = (p[0] + p[1]) + (p[2] + p[3]);
#pragma unroll
    for (int x = C; x < 32; x *= 2) acc += __shfl_xor_sync(0xffffffffu, acc, x);
    const float delta = (v - decay * acc) * beta;
    float o4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int r0 = 0; r0 < RPL; r0 += 4) {  // q' read 4 rows at a time (fewer live registers)
      float q[4];
      if constexpr (RPL % 4 == 0) {
        const float4 qv = *reinterpret_cast<const float4*>(qs + r0);
        q[0] = qv.x, q[1] = qv.y, q[2] = qv.z, q[3] = qv.w;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) q[j] = r0 + j < RPL ? qs[r0 + j] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 4 && r0 + j < RPL; ++j) {
        const int r = r0 + j;
        S[r] = decay * S[r] + k[r] * delta;
        o4[j] += q[j] * S[r];
      }
    }
    float o = (o4[0] + o4[1]) + (o4[2] + o4[3]);
#pragma unroll
    for (int x = C; x < 32; x *= 2) o += __shfl_xor_sync(0xffffffffu, o, x);
    const int64_t T = s.q_start + t;
    if (rg == 0) a.core[T * vd + int64_t{h} * dv + cg * C + col] = o;
    while (save_at == t) {
      store(a.saves[s.save_begin + next_save].state);
      ++next_save;
      save_at = next_save < s.n_saves ? a.saves[s.save_begin + next_save].after_token : -1;
    }
    __syncwarp();  // this slot is refilled by the next iteration's copy
  }
  store(s.dst);
}

template <int RPL, int C>
void launch_delta(const GdnArgs& a, cudaStream_t stream) {
  constexpr size_t kSmem = sizeof(float) * kWarpsPerBlock * kStages * slot_floats(RPL, C);
  if constexpr (kSmem > 48 * 1024) {
    static bool configured = false;
    if (!configured) {
      RILL_CUDA_CHECK(cudaFuncSetAttribute(delta_kernel<RPL, C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kSmem)));
      configured = true;
    }
  }
  const int64_t warps = int64_t{a.n_seqs} * a.n_v_heads * (a.head_v_dim / C);
  const auto blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  launch_pdl(delta_kernel<RPL, C>, blocks, kWarpsPerBlock * 32, kSmem, stream, a);
}

// Rows per lane: dk / (32 / C), rounded up to a power of two.
template <int C>
void launch_delta_for(const GdnArgs& a, cudaStream_t stream) {
  const int rows = (a.head_k_dim + 32 / C - 1) / (32 / C);
  if (rows <= 1) {
    launch_delta<1, C>(a, stream);
  } else if (rows <= 2) {
    launch_delta<2, C>(a, stream);
  } else if (rows <= 4) {
    launch_delta<4, C>(a, stream);
  } else if (rows <= 8) {
    launch_delta<8, C>(a, stream);
  } else if (rows <= 16) {
    launch_delta<16, C>(a, stream);
  } else if (rows <= 32) {
    launch_delta<32, C>(a, stream);
  } else if (rows <= 64) {
    launch_delta<64, C>(a, stream);
  } else {
    assert(rows <= 128);
    launch_delta<128, C>(a, stream);
  }
}

// One block per (token, head).
template <typename Out>
__global__ void gated_norm_kernel(const float* core, const float* z, int64_t z_stride, const float* w, int dim,
                                  float eps, Out* out) {
  __shared__ float red[32];
  detail::pdl_wait();
  detail::pdl_trigger();
  const int64_t t = blockIdx.x;
  const int64_t row = t * gridDim.y + blockIdx.y;
  const float* x = core + row * dim;
  const float* zr = z + t * z_stride + int64_t{blockIdx.y} * dim;
  float ss = 0.0f;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) ss += x[d] * x[d];
  ss = block_sum(ss, red);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    out[row * dim + d] = from_f32<Out>(silu(zr[d]) * ((x[d] * scale) * w[d]));
  }
}

template <typename Out>
__global__ void sigmoid_gate_kernel(const float* x, const float* gate, int64_t gate_stride, int64_t width, int64_t n,
                                    Out* out) {
  detail::pdl_wait();
  detail::pdl_trigger();
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = e / width, i = e % width;
    out[e] = from_f32<Out>(x[e] * (1.0f / (1.0f + expf(-gate[t * gate_stride + i]))));
  }
}

int round_up_warp(int n) {
  return (n + 31) / 32 * 32;
}

}  // namespace

int32_t gdn_columns() {
  return 8;
}

bool gdn_supported(int32_t n_k_heads, int32_t n_v_heads, int32_t head_k_dim, int32_t head_v_dim, int32_t conv_kernel) {
  const int64_t key_dim = int64_t{n_k_heads} * head_k_dim;
  const int64_t conv_dim = 2 * key_dim + int64_t{n_v_heads} * head_v_dim;
  return n_k_heads > 0 && n_v_heads % n_k_heads == 0 && head_k_dim > 0 && head_k_dim <= kGdnMaxHeadDim &&
         head_k_dim % 4 == 0 && head_v_dim > 0 && head_v_dim <= kGdnMaxHeadDim && head_v_dim % kGdnColumns == 0 &&
         conv_dim % 4 == 0 && conv_kernel >= 2 && conv_kernel <= kGdnMaxConvKernel;
}

void gdn_conv(const GdnArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return;
  const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(2 * a.n_k_heads + a.n_v_heads));
  const int threads = round_up_warp(a.head_k_dim > a.head_v_dim ? a.head_k_dim : a.head_v_dim);
  launch_pdl(conv_out_kernel, grid, threads, 0, stream, a);
  constexpr int kThreads = 128;
  const dim3 sgrid(static_cast<unsigned>(a.n_seqs), static_cast<unsigned>((a.conv_dim() + kThreads - 1) / kThreads));
  launch_pdl(conv_state_kernel, sgrid, kThreads, 0, stream, a);
}

void gdn_recurrence(const GdnArgs& a, cudaStream_t stream) {
  if (a.n_seqs <= 0) return;
  if (a.columns == 4) {
    launch_delta_for<4>(a, stream);
  } else {
    assert(a.columns == 8);
    launch_delta_for<8>(a, stream);
  }
}

void gdn_gated_norm(const float* core, const float* z, int64_t z_stride, const float* w, int64_t n_tokens,
                    int32_t n_heads, int32_t dim, float eps, DType out_dtype, void* out, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>(n_heads));
  const int threads = dim >= 128 ? 128 : round_up_warp(dim);
  RILL_CUDA_DISPATCH_FLOAT(out_dtype, launch_pdl(gated_norm_kernel<T>, grid, threads, 0, stream, core, z, z_stride, w,
                                                 dim, eps, static_cast<T*>(out)));
}

void sigmoid_gate_mul(const float* x, const float* gate, int64_t gate_stride, int64_t n_tokens, int64_t width,
                      DType out_dtype, void* out, cudaStream_t stream) {
  const int64_t n = n_tokens * width;
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const auto grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  RILL_CUDA_DISPATCH_FLOAT(out_dtype, launch_pdl(sigmoid_gate_kernel<T>, grid, kThreads, 0, stream, x, gate,
                                                 gate_stride, width, n, static_cast<T*>(out)));
}

}  // namespace rill::cuda
