#include "backend/cpu/gated_delta.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

namespace rill::cpu {
namespace {

// Channels per conv work unit: enough to keep the inner loop vectorized,
// few enough that a decode step of one sequence still spreads over threads.
constexpr int64_t kConvBlock = 64;

inline float silu(float x) {
  return x / (1.0f + std::exp(-x));
}

void conv_unit(const ConvSeq& s, const float* weight, int64_t c0, int64_t c1, int64_t kernel, int64_t x_stride) {
  const int64_t km1 = kernel - 1;
  const int64_t nc = c1 - c0;
  float win[kMaxConvKernel - 1][kConvBlock];  // win[j][c - c0]: input j steps back from K-1, oldest first
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t j = 0; j < km1; ++j) win[j][c - c0] = s.state[c * km1 + j];
  }
  int next_snap = 0;
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    float* row = s.x + t * x_stride + c0;
    for (int64_t cc = 0; cc < nc; ++cc) {
      const float* w = weight + (c0 + cc) * kernel;
      const float raw = row[cc];
      float acc = 0.0f;
      for (int64_t j = 0; j < km1; ++j) acc += w[j] * win[j][cc];
      acc += w[km1] * raw;
      for (int64_t j = 0; j + 1 < km1; ++j) win[j][cc] = win[j + 1][cc];
      win[km1 - 1][cc] = raw;
      row[cc] = silu(acc);
    }
    while (next_snap < s.n_snapshots && s.snapshots[next_snap].after_token == t) {
      float* dst = s.snapshots[next_snap].dst;
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t j = 0; j < km1; ++j) dst[c * km1 + j] = win[j][c - c0];
      }
      ++next_snap;
    }
  }
  for (int64_t c = c0; c < c1; ++c) {
    for (int64_t j = 0; j < km1; ++j) s.state[c * km1 + j] = win[j][c - c0];
  }
}

// q' = l2norm(x) * scale over n floats.
void l2norm_scaled(const float* x, int64_t n, float scale, float* out) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum + 1e-6f);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * inv) * scale;
}

void delta_unit(const GatedDeltaSeq& s, const GatedDeltaParams& p, int64_t h) {
  const int64_t dk = p.head_k_dim, dv = p.head_v_dim;
  const int64_t kh = h / (p.n_v_heads / p.n_k_heads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  float* S = s.state + h * dk * dv;  // [dk, dv]
  float qn[kMaxHeadKDim], kn[kMaxHeadKDim];
  float acc[kMaxHeadVDim], delta[kMaxHeadVDim];
  int next_snap = 0;
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    l2norm_scaled(s.q + t * p.in_stride + kh * dk, dk, scale, qn);
    l2norm_scaled(s.k + t * p.in_stride + kh * dk, dk, 1.0f, kn);
    const float* v = s.v + t * p.in_stride + h * dv;
    const float decay = std::exp(s.g[t * p.gate_stride + h]);
    const float beta = s.beta[t * p.gate_stride + h];
    // What the (decayed) state predicts for k': decay * k'^T S.
    std::fill(acc, acc + dv, 0.0f);
    for (int64_t i = 0; i < dk; ++i) {
      const float ki = kn[i];
      const float* Si = S + i * dv;
      for (int64_t j = 0; j < dv; ++j) acc[j] += ki * Si[j];
    }
    for (int64_t j = 0; j < dv; ++j) delta[j] = (v[j] - decay * acc[j]) * beta;
    // S = decay * S + k' (x) delta, and out = q'^T S in the same pass.
    float* out = s.out + t * p.out_stride + h * dv;
    std::fill(out, out + dv, 0.0f);
    for (int64_t i = 0; i < dk; ++i) {
      const float ki = kn[i], qi = qn[i];
      float* Si = S + i * dv;
      for (int64_t j = 0; j < dv; ++j) {
        Si[j] = decay * Si[j] + ki * delta[j];
        out[j] += qi * Si[j];
      }
    }
    while (next_snap < s.n_snapshots && s.snapshots[next_snap].after_token == t) {
      std::memcpy(s.snapshots[next_snap].dst + h * dk * dv, S, static_cast<size_t>(dk * dv) * sizeof(float));
      ++next_snap;
    }
  }
}

}  // namespace

void causal_conv1d_silu_batch(const ConvSeq* seqs, int n_seqs, const float* weight, int64_t n_channels, int64_t kernel,
                              int64_t x_stride, ThreadPool& pool) {
  assert(kernel >= 2 && kernel <= kMaxConvKernel);
  const int64_t n_blocks = (n_channels + kConvBlock - 1) / kConvBlock;
  pool.parallel_for(static_cast<int64_t>(n_seqs) * n_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const ConvSeq& s = seqs[u / n_blocks];
      const int64_t c0 = (u % n_blocks) * kConvBlock;
      conv_unit(s, weight, c0, std::min(n_channels, c0 + kConvBlock), kernel, x_stride);
    }
  });
}

void gated_delta_batch(const GatedDeltaSeq* seqs, int n_seqs, const GatedDeltaParams& p, ThreadPool& pool) {
  assert(p.n_k_heads > 0 && p.n_v_heads % p.n_k_heads == 0);
  assert(p.head_k_dim <= kMaxHeadKDim && p.head_v_dim <= kMaxHeadVDim);
  const int64_t nv = p.n_v_heads;
  pool.parallel_for(static_cast<int64_t>(n_seqs) * nv, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) delta_unit(seqs[u / nv], p, u % nv);
  });
}

}  // namespace rill::cpu
