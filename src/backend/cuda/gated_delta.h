#pragma once
// Gated DeltaNet on the device (the linear-attention layers of Qwen3.5 and
// Qwen3-Next; the CPU reference is backend/cpu/gated_delta.h; the CUDA
// Backend's gated_delta, gated_rms_norm and sigmoid_mul launch these).
// Every pointer is a device pointer.
//
// States live in one pool of state ids (model/state_pool.h: live slots, then
// checkpoints, then a scratch state for padding rows), laid out as on the
// CPU: state s of layer l starts at
// states + s * state_stride + l * (conv_floats + delta_floats), its conv
// window [conv_dim, K-1] first, then the delta state [n_v_heads, dk, dv].
//
// A step names, per sequence, the state it starts from (src: its slot, a
// checkpoint on a prefix hit, or -1 for zeros at position 0) and the slot it
// ends in (dst); reading src and writing dst in the same kernels needs no
// separate reset or restore copy. Snapshots (prefix-cache checkpoints) copy
// the state right after given tokens of the step into other state ids; a
// step never saves into a state another of its sequences starts from (the
// KvManager keeps a step's restored checkpoints from being recycled).
//
// Within a sequence the tokens are processed strictly in order with the
// same arithmetic whatever the call (chunked prefill, decode, batching):
// a sequence's results do not depend on how its tokens are split into steps
// nor on the other sequences of the call, bit for bit.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace rill::cuda {

struct GdnSeq {
  int32_t q_start = 0, q_len = 0;       // tokens [q_start, q_start + q_len) of the step
  int32_t src = -1;                     // state id the step starts from; -1: zeros
  int32_t dst = 0;                      // state id it ends in
  int32_t save_begin = 0, n_saves = 0;  // its snapshots: saves[save_begin, + n_saves), ascending after_token
};

struct GdnSave {
  int32_t after_token = 0;  // index within the sequence's step
  int32_t state = 0;        // state id to fill
};

inline constexpr int32_t kGdnMaxConvKernel = 8;
inline constexpr int32_t kGdnMaxHeadDim = 512;  // dk and dv
inline constexpr int32_t kGdnColumns = 8;       // value columns per warp of the recurrence; dv a multiple

// One linear-attention layer's step.
struct GdnArgs {
  int32_t n_k_heads = 0, n_v_heads = 0, head_k_dim = 0, head_v_dim = 0, conv_kernel = 4;
  // The step: n_seqs sequences of n_tokens tokens; tok_seq[t]: t's sequence.
  const GdnSeq* seqs = nullptr;
  int32_t n_seqs = 0;
  const GdnSave* saves = nullptr;
  const int32_t* tok_seq = nullptr;
  int64_t n_tokens = 0;
  // This layer's part of state 0 (see above); state_stride: floats per state id.
  float* states = nullptr;
  int64_t state_stride = 0;
  // Weights: conv [conv_dim, K]; neg_a = -exp(A_log), dt_bias [n_v_heads].
  const float* conv_w = nullptr;
  const float* neg_a = nullptr;
  const float* dt_bias = nullptr;
  // Projections [n_tokens, proj_stride] f32: q|k|v (conv_dim) at 0, b and a
  // (n_v_heads each) at b_off / a_off.
  const float* proj = nullptr;
  int64_t proj_stride = 0, b_off = 0, a_off = 0;
  // Outputs of gdn_conv, inputs of gdn_recurrence:
  float* mixed = nullptr;  // [n_tokens, conv_dim]: q' = l2norm(q)/sqrt(dk) | k' = l2norm(k) | v (after conv + silu)
  float* g = nullptr;      // [n_tokens, n_v_heads] log decay: neg_a * softplus(a + dt_bias)
  float* beta = nullptr;   // [n_tokens, n_v_heads] sigmoid(b)
  float* core = nullptr;   // [n_tokens, n_v_heads * dv] the recurrence's output
  // Value columns per warp of the recurrence, 8 or 4 (gdn_columns()). The
  // sums' order depends on it: keep one value per model (batch invariance).
  int32_t columns = 8;

  __host__ __device__ int64_t key_dim() const { return int64_t{n_k_heads} * head_k_dim; }
  __host__ __device__ int64_t value_dim() const { return int64_t{n_v_heads} * head_v_dim; }
  __host__ __device__ int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  __host__ __device__ int64_t conv_floats() const { return conv_dim() * (conv_kernel - 1); }
};

// Columns per warp for a model: 8. Four (twice the warps) was measured once
// against it on the H200 (the hybrid benchmark of docs/perf.md: prefill
// 85.2 vs 80.5 ms, decode batch 64 9,222 vs 9,064 tok/s) and not taken, so
// the switch that chose it (RILL_GDN_COLUMNS) is gone; the kernels keep 4,
// held to the reference by tests/cuda/gated_delta_cuda_test.
int32_t gdn_columns();

// Whether the kernels take these dims: dk, dv <= 512, dv a multiple of 8,
// key_dim even and conv_dim a multiple of 4 (16-byte state and value rows),
// 2 <= K <= 8, n_v_heads a multiple of n_k_heads.
bool gdn_supported(int32_t n_k_heads, int32_t n_v_heads, int32_t head_k_dim, int32_t head_v_dim, int32_t conv_kernel);

// The causal conv1d + silu over q|k|v with each sequence's window from src,
// the q/k l2 norms, g and beta (mixed, g, beta); then every sequence's
// window after its last token into dst and after each save's token into
// that save's state.
void gdn_conv(const GdnArgs& a, cudaStream_t stream);

// The gated delta rule over mixed/g/beta, per value head h (key head
// h / (n_v_heads / n_k_heads)): S = exp(g) S; S += k' (x) ((v - k'^T S) beta);
// out = q'^T S. Starts from src's delta state, ends in dst's, snapshots into
// the saves' states. One warp per (sequence, value head, `columns` value
// columns), the state slice in registers through the step, tokens streamed
// through shared memory with cp.async a few tokens ahead.
void gdn_recurrence(const GdnArgs& a, cudaStream_t stream);

// The gated RMSNorm: out[t, h, :] = rms_norm(core[t, h, :]) * w * silu(z[t, h, :])
// per value head h, in out_dtype. core: [n_tokens, n_heads * dim] f32; z rows
// z_stride floats apart; w [dim] (plain weight, not 1 + w).
void gdn_gated_norm(const float* core, const float* z, int64_t z_stride, const float* w, int64_t n_tokens,
                    int32_t n_heads, int32_t dim, float eps, DType out_dtype, void* out, cudaStream_t stream);

// The gated attention's output gate: out[t, i] = x[t, i] * sigmoid(gate[t * gate_stride + i])
// over [n_tokens, width], x f32 (rows width apart), out in out_dtype.
void sigmoid_gate_mul(const float* x, const float* gate, int64_t gate_stride, int64_t n_tokens, int64_t width,
                      DType out_dtype, void* out, cudaStream_t stream);

}  // namespace rill::cuda
