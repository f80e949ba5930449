#pragma once
// Gated DeltaNet ops (the linear-attention layers of Qwen3.5 / Qwen3-Next):
// the short depthwise causal conv1d with its rolling input state, and the
// gated delta rule recurrence with its f32 state per value head.
//
// Both take a batch of sequences and run them in one parallel pass. Within
// a sequence the tokens are processed strictly in order, one at a time, with
// the same arithmetic whatever the call: results do not depend on how a
// sequence's tokens are split into steps (chunked prefill, decode) nor on
// which other sequences share the call (batch invariance). A sequential scan
// is O(n * dk * dv) per head like the chunked form, and on a CPU reads the
// state from L1/L2, so the chunked (WY) form would buy little here.
//
// Snapshots: a sequence may ask for copies of its state right after some of
// its tokens (prefix-cache checkpoints at block boundaries); each parallel
// unit copies its own slice of the state when it passes that token.
#include <cstdint>

#include "core/thread_pool.h"

namespace rill::cpu {

// A copy of a sequence's state right after token `after_token` (an index
// into the call's tokens of that sequence) into `dst`, laid out as the state.
struct StateSnapshot {
  int64_t after_token = 0;
  float* dst = nullptr;
};

// Depthwise causal conv1d of kernel K (no bias) followed by SiLU, in place:
//   y[t, c] = silu(sum_j weight[c, j] * in[t - (K-1) + j, c])
// where inputs before the first token come from the state.
// x:      [n_tokens, n_channels], rows x_stride floats apart (in: inputs, out: y)
// state:  [n_channels, K-1], the K-1 inputs before x's first token (oldest
//         first); on return the last K-1 inputs.
struct ConvSeq {
  float* x = nullptr;
  int64_t n_tokens = 0;
  float* state = nullptr;
  const StateSnapshot* snapshots = nullptr;  // ascending after_token
  int n_snapshots = 0;
};
inline constexpr int64_t kMaxConvKernel = 8;
// weight: [n_channels, kernel], 2 <= kernel <= kMaxConvKernel.
void causal_conv1d_silu_batch(const ConvSeq* seqs, int n_seqs, const float* weight, int64_t n_channels, int64_t kernel,
                              int64_t x_stride, ThreadPool& pool);

// The gated delta rule, per value head h with its key head kh = h / (n_v_heads / n_k_heads):
//   q' = l2norm(q[kh]) / sqrt(dk), k' = l2norm(k[kh])   (l2norm: x * rsqrt(sum x^2 + 1e-6))
//   S  = exp(g) * S                                      S: [dk, dv]
//   S += k' (x) ((v - k'^T S) * beta)
//   out = q'^T S                                         [dv]
// (transformers' torch_recurrent_gated_delta_rule with use_qk_l2norm_in_kernel).
struct GatedDeltaParams {
  int64_t n_k_heads = 0;
  int64_t n_v_heads = 0;    // a multiple of n_k_heads
  int64_t head_k_dim = 0;   // <= kMaxHeadKDim
  int64_t head_v_dim = 0;   // <= kMaxHeadVDim
  int64_t in_stride = 0;    // floats between consecutive tokens of q, k and v
  int64_t gate_stride = 0;  // floats between consecutive tokens of g and beta
  int64_t out_stride = 0;   // floats between consecutive tokens of out
};
inline constexpr int64_t kMaxHeadKDim = 512;
inline constexpr int64_t kMaxHeadVDim = 512;

struct GatedDeltaSeq {
  const float* q = nullptr;     // [n_tokens, n_k_heads, dk]
  const float* k = nullptr;     // [n_tokens, n_k_heads, dk]
  const float* v = nullptr;     // [n_tokens, n_v_heads, dv]
  const float* g = nullptr;     // [n_tokens, n_v_heads] log decay (<= 0)
  const float* beta = nullptr;  // [n_tokens, n_v_heads]
  float* out = nullptr;         // [n_tokens, n_v_heads, dv]
  int64_t n_tokens = 0;
  float* state = nullptr;                    // [n_v_heads, dk, dv]
  const StateSnapshot* snapshots = nullptr;  // ascending after_token
  int n_snapshots = 0;
};
void gated_delta_batch(const GatedDeltaSeq* seqs, int n_seqs, const GatedDeltaParams& p, ThreadPool& pool);

}  // namespace rill::cpu
