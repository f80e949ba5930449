// Gated DeltaNet kernels (see gated_delta.h): the causal conv1d with its
// window state, the q/k l2 norms and gates, the delta-rule recurrence, the
// gated RMSNorm, and the gated attention's sigmoid output gate.
#include <cassert>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gated_delta.h"

namespace rill::cuda {
namespace {

using detail::block_sum;
using detail::from_f32;
using detail::warp_sum;

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20), as the CPU.
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

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
  const int64_t ch0 = is_q ? int64_t{hb} * dk
                           : is_k ? a.key_dim() + int64_t{hb - nk} * dk : 2 * a.key_dim() + int64_t{hb - 2 * nk} * dv;
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

// The recurrence: one warp per (sequence, value head, 8 value columns).
// Lane l holds rows i = l + 32 r (r < RPL) of those columns of S [dk, dv]
// in registers for the whole step; the column sums over i (k'^T S, q'^T S)
// are warp butterflies, which leave the same value in every lane. Loads of
// token t + 1 are issued before token t's arithmetic.
constexpr int kWarpsPerBlock = 4;

template <int RPL>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) delta_kernel(GdnArgs a) {
  detail::pdl_wait();
  detail::pdl_trigger();
  constexpr int C = kGdnColumns;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t w = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5);
  const int dk = a.head_k_dim, dv = a.head_v_dim, nv = a.n_v_heads;
  const int ncg = dv / C;
  if (w >= int64_t{a.n_seqs} * nv * ncg) return;
  const int cg = static_cast<int>(w % ncg);
  const int h = static_cast<int>((w / ncg) % nv);
  const GdnSeq s = a.seqs[w / (int64_t{ncg} * nv)];
  const int kh = h / (nv / a.n_k_heads);
  const int64_t kd = a.key_dim(), vd = a.value_dim(), cd = a.conv_dim();
  // This warp's columns of head h's state, relative to a state's layer base.
  const int64_t head_off = a.conv_floats() + int64_t{h} * dk * dv + cg * C;

  float S[RPL][C];
  {
    const float* src = s.src >= 0 ? state_of(a, s.src) + head_off : nullptr;
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
      const int i = lane + 32 * r;
      float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
      if (src && i < dk) {
        const float4* p = reinterpret_cast<const float4*>(src + int64_t{i} * dv);
        x0 = p[0];
        x1 = p[1];
      }
      S[r][0] = x0.x, S[r][1] = x0.y, S[r][2] = x0.z, S[r][3] = x0.w;
      S[r][4] = x1.x, S[r][5] = x1.y, S[r][6] = x1.z, S[r][7] = x1.w;
    }
  }
  auto store = [&](int32_t id) {
    float* dst = state_of(a, id) + head_off;
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
      const int i = lane + 32 * r;
      if (i < dk) {
        float4* p = reinterpret_cast<float4*>(dst + int64_t{i} * dv);
        p[0] = make_float4(S[r][0], S[r][1], S[r][2], S[r][3]);
        p[1] = make_float4(S[r][4], S[r][5], S[r][6], S[r][7]);
      }
    }
  };

  struct Tok {
    float q[RPL], k[RPL], v[C], g, beta;
  };
  auto load = [&](int64_t T) {
    Tok x;
    const float* row = a.mixed + T * cd;
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
      const int i = lane + 32 * r;
      x.q[r] = i < dk ? row[int64_t{kh} * dk + i] : 0.0f;
      x.k[r] = i < dk ? row[kd + int64_t{kh} * dk + i] : 0.0f;
    }
    const float4* vp = reinterpret_cast<const float4*>(row + 2 * kd + int64_t{h} * dv + cg * C);
    const float4 v0 = vp[0], v1 = vp[1];
    x.v[0] = v0.x, x.v[1] = v0.y, x.v[2] = v0.z, x.v[3] = v0.w;
    x.v[4] = v1.x, x.v[5] = v1.y, x.v[6] = v1.z, x.v[7] = v1.w;
    x.g = a.g[T * nv + h];
    x.beta = a.beta[T * nv + h];
    return x;
  };

  int next_save = 0;
  int32_t save_at = s.n_saves > 0 ? a.saves[s.save_begin].after_token : -1;
  Tok cur{};
  if (s.q_len > 0) cur = load(s.q_start);
  for (int t = 0; t < s.q_len; ++t) {
    const int64_t T = s.q_start + t;
    Tok nxt = cur;
    if (t + 1 < s.q_len) nxt = load(T + 1);
    const float decay = expf(cur.g);
    float acc[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float p = 0.0f;
#pragma unroll
      for (int r = 0; r < RPL; ++r) p += cur.k[r] * S[r][c];
      acc[c] = warp_sum(p);
    }
    float o[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const float delta = (cur.v[c] - decay * acc[c]) * cur.beta;
      float p = 0.0f;
#pragma unroll
      for (int r = 0; r < RPL; ++r) {
        S[r][c] = decay * S[r][c] + cur.k[r] * delta;
        p += cur.q[r] * S[r][c];
      }
      o[c] = warp_sum(p);
    }
    if (lane == 0) {
      float4* op = reinterpret_cast<float4*>(a.core + T * vd + int64_t{h} * dv + cg * C);
      op[0] = make_float4(o[0], o[1], o[2], o[3]);
      op[1] = make_float4(o[4], o[5], o[6], o[7]);
    }
    while (save_at == t) {
      store(a.saves[s.save_begin + next_save].state);
      ++next_save;
      save_at = next_save < s.n_saves ? a.saves[s.save_begin + next_save].after_token : -1;
    }
    cur = nxt;
  }
  store(s.dst);
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

int round_up_warp(int n) { return (n + 31) / 32 * 32; }

}  // namespace

bool gdn_supported(int32_t n_k_heads, int32_t n_v_heads, int32_t head_k_dim, int32_t head_v_dim,
                   int32_t conv_kernel) {
  const int64_t key_dim = int64_t{n_k_heads} * head_k_dim;
  const int64_t conv_dim = 2 * key_dim + int64_t{n_v_heads} * head_v_dim;
  return n_k_heads > 0 && n_v_heads % n_k_heads == 0 && head_k_dim > 0 && head_k_dim <= kGdnMaxHeadDim &&
         head_v_dim > 0 && head_v_dim <= kGdnMaxHeadDim && head_v_dim % kGdnColumns == 0 && key_dim % 2 == 0 &&
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
  const int64_t warps = int64_t{a.n_seqs} * a.n_v_heads * (a.head_v_dim / kGdnColumns);
  const auto blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const int rpl = (a.head_k_dim + 31) / 32;
  if (rpl <= 1) {
    launch_pdl(delta_kernel<1>, blocks, kWarpsPerBlock * 32, 0, stream, a);
  } else if (rpl <= 2) {
    launch_pdl(delta_kernel<2>, blocks, kWarpsPerBlock * 32, 0, stream, a);
  } else if (rpl <= 4) {
    launch_pdl(delta_kernel<4>, blocks, kWarpsPerBlock * 32, 0, stream, a);
  } else if (rpl <= 8) {
    launch_pdl(delta_kernel<8>, blocks, kWarpsPerBlock * 32, 0, stream, a);
  } else {
    assert(rpl <= 16);
    launch_pdl(delta_kernel<16>, blocks, kWarpsPerBlock * 32, 0, stream, a);
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
