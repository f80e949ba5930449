// The k4c / k4a attention reference kernel (attention_chan.h): one thread per
// (query, head), the CPU baseline build's loops (backend/cpu/
// attention_chan_impl.h attend) with explicitly rounded operations.
#include "backend/cuda/attention_chan.h"

#include <cuda_fp16.h>

#include <cmath>

#include "backend/cpu/kv_quant.h"
#include "backend/cuda/attention_chan_math.cuh"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/kv_chan.h"
#include "backend/cuda/kv_rotated.cuh"
#include "backend/cuda/kv_types.cuh"

namespace rill::cuda {
namespace {

using detail::add_rn;
using detail::chan_capped;
using detail::chan_exp;
using detail::chan_q8_value;
using detail::dadd_rn;
using detail::ddiv_rn;
using detail::double_to_float_rn;
using detail::e4m3_to_float;
using detail::f16_value;
using detail::mul_rn;
using detail::sub_rn;

constexpr int kT = cpu::kKvChanTokens;
static_assert(cpu::kKvChanTailType == DType::kQ8_0, "the tail rows are q8_0");

// Token r's sum over a block's channels of q_c d_c code_rc (KV head kvh's
// group at blk): q4c every channel, in order; q4a (a.k_widths) the
// channels of width > 0, in order, each code rebuilt from its planes (the
// CPU's group_sums_planes; a width-0 channel adds nothing there either).
__host__ __device__ inline float group_key_sum(const ChanAttentionArgs& a, const uint8_t* blk, const float* q, int kvh,
                                               int hd, int64_t W, int r) {
  const uint8_t* d = blk + 2 * W + static_cast<int64_t>(kvh) * hd;
  float acc = 0.0f;
  if (a.k_widths) {
    const uint8_t* widths = a.k_widths + static_cast<int64_t>(kvh) * hd;
    const uint8_t* p = blk + alloc_plane_offsets(a.k_widths, W)[static_cast<int64_t>(kvh) * hd];
    for (int c = 0; c < hd; ++c) {
      const int b = widths[c];
      if (b == 0) continue;
      const float w = mul_rn(q[c], mul_rn(e4m3_to_float(d[c]), 0.0625f));
      int code = 0;
      for (int k = 0; k < b; ++k, p += 4) {
        const uint32_t plane = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
        code |= static_cast<int>((plane >> r) & 1u) << k;
      }
      acc = add_rn(acc, mul_rn(w, static_cast<float>(code)));
    }
    return acc;
  }
  const uint8_t* qs = blk + 3 * W + static_cast<int64_t>(kvh) * hd * (kT / 2);
  for (int c = 0; c < hd; ++c) {
    const float w = mul_rn(q[c], mul_rn(e4m3_to_float(d[c]), 0.0625f));
    const uint8_t byte = qs[c * (kT / 2) + r % (kT / 2)];
    const int code = r < kT / 2 ? (byte & 0xF) : (byte >> 4);
    acc = add_rn(acc, mul_rn(w, static_cast<float>(code)));
  }
  return acc;
}

// Query t, head h: the CPU's attend for one head.
__host__ __device__ void attend_one(const ChanAttentionArgs& a, int t, int h) {
  const int group = a.n_head / a.n_head_kv, kvh = h / group, hd = a.head_dim;
  const int64_t W = static_cast<int64_t>(a.n_head_kv) * hd;
  const float* q = a.q + t * a.q_stride + static_cast<int64_t>(h) * hd;
  float* out = a.out + (static_cast<int64_t>(t) * a.n_head + h) * hd;
  float* s = a.scores + (static_cast<int64_t>(t) * a.n_head + h) * a.max_keys;
  for (int c = 0; c < hd; ++c) out[c] = 0.0f;
  const int seq = a.seq_of[t];
  const int64_t p = a.pos[t], j_end = p + 1;
  const int64_t j_begin = a.window > 0 ? (p - a.window + 1 > 0 ? p - a.window + 1 : 0) : 0;
  if (j_end <= j_begin) return;
  const int64_t n = j_end - j_begin, own = p - p % kT, c0 = a.c0[seq], tail_start = c0 - c0 % kT;
  const int32_t* table = a.block_tables + a.table_start[seq];
  const size_t tail_row = static_cast<size_t>(W / 32 * 34);
  // Quantized groups: keys [j_begin, min(own, j_end)).
  const int64_t q_end = own < j_end ? own : j_end;
  for (int64_t b0 = j_begin - j_begin % kT; b0 < q_end; b0 += kT) {
    const uint8_t* blk = a.k_blocks + static_cast<size_t>(table[b0 / kT]) * a.block_stride;
    const auto* z = reinterpret_cast<const uint16_t*>(blk) + static_cast<int64_t>(kvh) * hd;
    float qz = 0.0f;
    for (int c = 0; c < hd; ++c) qz = add_rn(qz, mul_rn(q[c], f16_value(z[c])));
    const int64_t lo = j_begin > b0 ? j_begin : b0, hi = q_end < b0 + kT ? q_end : b0 + kT;
    for (int64_t j = lo; j < hi; ++j) {
      const float acc = group_key_sum(a, blk, q, kvh, hd, W, static_cast<int>(j - b0));
      s[j - j_begin] = chan_capped(mul_rn(add_rn(qz, acc), a.scale), a.softcap);
    }
  }
  // The own block's keys from their q8_0 rows (8 partial sums, as dot8).
  auto own_row = [&](const uint8_t* tail, const uint8_t* step, int64_t j) {
    return j < c0 ? tail + static_cast<size_t>(j - tail_start) * tail_row
                  : step + static_cast<size_t>(a.q_start[seq] + (j - c0)) * tail_row;
  };
  const int64_t own_begin = own > j_begin ? own : j_begin;
  for (int64_t j = own_begin; j < j_end; ++j) {
    const uint8_t* row = own_row(a.tail_k[seq], a.step_k, j);
    float acc8[8] = {};
    for (int c = 0; c < hd; ++c) {
      acc8[c & 7] = add_rn(acc8[c & 7], mul_rn(q[c], chan_q8_value(row, static_cast<int64_t>(kvh) * hd + c)));
    }
    const float dot = add_rn(add_rn(add_rn(acc8[0], acc8[4]), add_rn(acc8[1], acc8[5])),
                             add_rn(add_rn(acc8[2], acc8[6]), add_rn(acc8[3], acc8[7])));
    s[j - j_begin] = chan_capped(mul_rn(dot, a.scale), a.softcap);
  }
  // Softmax: max subtracted, exp in f32, the sum in double, one reciprocal.
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = chan_exp(sub_rn(s[j], mx));
    sum = dadd_rn(sum, static_cast<double>(s[j]));
  }
  const float inv = double_to_float_rn(ddiv_rn(1.0, sum));
  for (int64_t j = 0; j < n; ++j) s[j] = mul_rn(s[j], inv);
  // out = sum_j p_j v_j: the pool's iq4_nlh64 rows, then the own block's q8_0 rows.
  const int64_t v_head = static_cast<int64_t>(kvh) * hd;
  for (int64_t j = j_begin; j < j_end; ++j) {
    const float pj = s[j - j_begin];
    if (j < own_begin) {
      const size_t v_stride = a.v_block_stride ? a.v_block_stride : a.block_stride;
      const uint8_t* row =
          a.v_blocks + static_cast<size_t>(table[j / kT]) * v_stride + static_cast<size_t>(j % kT) * a.v_row_bytes;
      for (int c = 0; c < hd; ++c) out[c] = add_rn(out[c], mul_rn(pj, detail::KvIq4Nl64::load1(row, v_head + c)));
    } else {
      const uint8_t* row = own_row(a.tail_v[seq], a.step_v, j);
      for (int c = 0; c < hd; ++c) out[c] = add_rn(out[c], mul_rn(pj, chan_q8_value(row, v_head + c)));
    }
  }
}

// The same arithmetic as attend_one, split so that a thread block can share
// one (query, head): what the key loops of attend_one do for key j (its
// score, scale and softcap applied), and for channel c (its output after
// the probabilities are in s), each in attend_one's own order, so the
// parallel kernel gives its bits.
struct OneQuery {
  const float* q;
  float* out;
  float* s;
  int kvh, hd, seq;
  int64_t W, j_begin, j_end, own_begin, q_end, c0, tail_start;
  const int32_t* table;
  size_t tail_row;
};

__host__ __device__ inline OneQuery one_query(const ChanAttentionArgs& a, int t, int h) {
  OneQuery o;
  const int group = a.n_head / a.n_head_kv;
  o.kvh = h / group;
  o.hd = a.head_dim;
  o.W = static_cast<int64_t>(a.n_head_kv) * o.hd;
  o.q = a.q + t * a.q_stride + static_cast<int64_t>(h) * o.hd;
  o.out = a.out + (static_cast<int64_t>(t) * a.n_head + h) * o.hd;
  o.s = a.scores + (static_cast<int64_t>(t) * a.n_head + h) * a.max_keys;
  o.seq = a.seq_of[t];
  const int64_t p = a.pos[t];
  o.j_end = p + 1;
  o.j_begin = a.window > 0 ? (p - a.window + 1 > 0 ? p - a.window + 1 : 0) : 0;
  const int64_t own = p - p % kT;
  o.q_end = own < o.j_end ? own : o.j_end;
  o.own_begin = own > o.j_begin ? own : o.j_begin;
  o.c0 = a.c0[o.seq];
  o.tail_start = o.c0 - o.c0 % kT;
  o.table = a.block_tables + a.table_start[o.seq];
  o.tail_row = static_cast<size_t>(o.W / 32 * 34);
  return o;
}

__host__ __device__ inline const uint8_t* own_row_of(const ChanAttentionArgs& a, const OneQuery& o, const uint8_t* tail,
                                                     const uint8_t* step, int64_t j) {
  return j < o.c0 ? tail + static_cast<size_t>(j - o.tail_start) * o.tail_row
                  : step + static_cast<size_t>(a.q_start[o.seq] + (j - o.c0)) * o.tail_row;
}

// Key j's capped, scaled score (attend_one's, q.z of its group recomputed).
__host__ __device__ inline float key_score(const ChanAttentionArgs& a, const OneQuery& o, int64_t j) {
  const int hd = o.hd;
  if (j < o.own_begin) {
    const int64_t b0 = j - j % kT;
    const uint8_t* blk = a.k_blocks + static_cast<size_t>(o.table[b0 / kT]) * a.block_stride;
    const auto* z = reinterpret_cast<const uint16_t*>(blk) + static_cast<int64_t>(o.kvh) * hd;
    float qz = 0.0f;
    for (int c = 0; c < hd; ++c) qz = add_rn(qz, mul_rn(o.q[c], f16_value(z[c])));
    const float acc = group_key_sum(a, blk, o.q, o.kvh, hd, o.W, static_cast<int>(j - b0));
    return chan_capped(mul_rn(add_rn(qz, acc), a.scale), a.softcap);
  }
  const uint8_t* row = own_row_of(a, o, a.tail_k[o.seq], a.step_k, j);
  float acc8[8] = {};
  for (int c = 0; c < hd; ++c) {
    acc8[c & 7] = add_rn(acc8[c & 7], mul_rn(o.q[c], chan_q8_value(row, static_cast<int64_t>(o.kvh) * hd + c)));
  }
  const float dot = add_rn(add_rn(add_rn(acc8[0], acc8[4]), add_rn(acc8[1], acc8[5])),
                           add_rn(add_rn(acc8[2], acc8[6]), add_rn(acc8[3], acc8[7])));
  return chan_capped(mul_rn(dot, a.scale), a.softcap);
}

// Channel c's output over the probabilities in o.s (key order).
__host__ __device__ inline float channel_out(const ChanAttentionArgs& a, const OneQuery& o, int c) {
  const int64_t v_head = static_cast<int64_t>(o.kvh) * o.hd;
  const size_t v_stride = a.v_block_stride ? a.v_block_stride : a.block_stride;
  float out = 0.0f;
  for (int64_t j = o.j_begin; j < o.j_end; ++j) {
    const float pj = o.s[j - o.j_begin];
    if (j < o.own_begin) {
      const uint8_t* row =
          a.v_blocks + static_cast<size_t>(o.table[j / kT]) * v_stride + static_cast<size_t>(j % kT) * a.v_row_bytes;
      out = add_rn(out, mul_rn(pj, detail::KvIq4Nl64::load1(row, v_head + c)));
    } else {
      out = add_rn(out, mul_rn(pj, chan_q8_value(own_row_of(a, o, a.tail_v[o.seq], a.step_v, j), v_head + c)));
    }
  }
  return out;
}

// One (query, head) a thread block (kParallelThreads): scores a key a
// thread, the max by a reduction (exact), exp a key a thread, the sum in
// double by one thread in key order, the probabilities a key a thread, the
// output a channel a thread in key order: attend_one's bits.
constexpr int kParallelThreads = 128;
__global__ void __launch_bounds__(kParallelThreads) chan_attention_parallel_kernel(ChanAttentionArgs a) {
  const int t = blockIdx.x, h = blockIdx.y;
  const OneQuery o = one_query(a, t, h);
  const int64_t n = o.j_end - o.j_begin;
  __shared__ float red[kParallelThreads];
  __shared__ float inv_s;
  if (n <= 0) {
    for (int c = threadIdx.x; c < o.hd; c += blockDim.x) o.out[c] = 0.0f;
    return;
  }
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float sc = key_score(a, o, o.j_begin + i);
    o.s[i] = sc;
    mx = sc > mx ? sc : mx;
  }
  red[threadIdx.x] = mx;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) {
      const float other = red[threadIdx.x + w];
      red[threadIdx.x] = other > red[threadIdx.x] ? other : red[threadIdx.x];
    }
    __syncthreads();
  }
  mx = red[0];
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) o.s[i] = chan_exp(sub_rn(o.s[i], mx));
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum = dadd_rn(sum, static_cast<double>(o.s[i]));
    inv_s = double_to_float_rn(ddiv_rn(1.0, sum));
  }
  __syncthreads();
  const float inv = inv_s;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) o.s[i] = mul_rn(o.s[i], inv);
  __syncthreads();
  for (int c = threadIdx.x; c < o.hd; c += blockDim.x) o.out[c] = channel_out(a, o, c);
}

__global__ void chan_attention_kernel(ChanAttentionArgs a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.n_tokens * a.n_head) return;
  attend_one(a, i / a.n_head, i % a.n_head);
}

}  // namespace

void chan_attention(const ChanAttentionArgs& a, cudaStream_t stream) {
  const int n = a.n_tokens * a.n_head;
  if (n <= 0) return;
  chan_attention_kernel<<<(n + 63) / 64, 64, 0, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

void chan_attention_host(const ChanAttentionArgs& a) {
  for (int t = 0; t < a.n_tokens; ++t)
    for (int h = 0; h < a.n_head; ++h) attend_one(a, t, h);
}

void chan_attention_parallel(const ChanAttentionArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0 || a.n_head <= 0) return;
  const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.n_head));
  chan_attention_parallel_kernel<<<grid, kParallelThreads, 0, stream>>>(a);
  RILL_CUDA_CHECK_LAUNCH();
}

void chan_attention_parallel_host(const ChanAttentionArgs& a) {
  for (int t = 0; t < a.n_tokens; ++t) {
    for (int h = 0; h < a.n_head; ++h) {  // the kernel's phases, one after the other
      const OneQuery o = one_query(a, t, h);
      const int64_t n = o.j_end - o.j_begin;
      if (n <= 0) {
        for (int c = 0; c < o.hd; ++c) o.out[c] = 0.0f;
        continue;
      }
      float mx = -INFINITY;
      for (int64_t i = 0; i < n; ++i) {
        o.s[i] = key_score(a, o, o.j_begin + i);
        mx = o.s[i] > mx ? o.s[i] : mx;
      }
      for (int64_t i = 0; i < n; ++i) o.s[i] = chan_exp(sub_rn(o.s[i], mx));
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum = dadd_rn(sum, static_cast<double>(o.s[i]));
      const float inv = double_to_float_rn(ddiv_rn(1.0, sum));
      for (int64_t i = 0; i < n; ++i) o.s[i] = mul_rn(o.s[i], inv);
      for (int c = 0; c < o.hd; ++c) o.out[c] = channel_out(a, o, c);
    }
  }
}

}  // namespace rill::cuda
