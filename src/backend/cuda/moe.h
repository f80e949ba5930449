#pragma once
// Mixture-of-experts kernels (moe.cu): routing and grouping on the device,
// the expert-indexed GEMV of decode steps, the gather of prefill rows for
// per-expert GEMMs, and the fixed-order weighted sum per token. Together
// they compute model/moe.h's MoeFfn (the CPU reference) without the host
// seeing the routing, so decode steps can be captured in CUDA graphs.
//
// Pairs: token t's k-th routed expert is pair p = t * K + k (K =
// n_expert_used). moe_route() orders each token's K experts by increasing
// id, so summing the pairs of a token in k order adds its experts in the
// CPU's order.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace rill::cuda {

inline constexpr int kMoeMaxExperts = 1024;    // n_expert
inline constexpr int kMoeMaxExpertsUsed = 32;  // n_expert_used

// How a layer routes (backend.h's MoeParams on the device). Vectors are
// device pointers [X], null when absent.
//   softmax (default): probs = softmax(logits); the choice is by probs.
//   sigmoid_scores: probs = sigmoid(logits); the choice scores are probs +
//     score_bias, and with n_group > 1 only the topk_group groups (of X /
//     n_group experts) whose two best choice scores sum highest keep theirs,
//     the others scored 0 (transformers' masking). Weights: the chosen probs.
//   softmax_after_topk (gpt-oss): the K largest logits, then a softmax over
//     those K (norm_topk_prob, routed_scaling_factor and expert_scale do not
//     apply, as on the CPU).
// Then, in this order: divided by the K's sum when norm_topk_prob (+1e-20
// for sigmoid scores), times routed_scaling_factor (when not 1), times
// expert_scale[e]. router_bias is added to every logit first.
struct MoeRouter {
  int32_t n_expert = 0, n_expert_used = 0;
  bool norm_topk_prob = true;
  bool sigmoid_scores = false;
  bool softmax_after_topk = false;
  int32_t n_group = 1, topk_group = 1;
  float routed_scaling_factor = 1.0f;
  const float* router_bias = nullptr;
  const float* score_bias = nullptr;
  const float* expert_scale = nullptr;
};
inline constexpr int kMoeMaxGroups = 32;  // n_group: one lane per group

// Routing and grouping of n tokens. One block; deterministic.
//   logits: [n, X] f32 router outputs.
//   ids, weights: [n, K]: per token the K experts of largest choice score
//     (ties: the lower id), ordered by increasing id, with their weights
//     (MoeRouter).
//   offsets: [X + 1]: expert e's pairs are sorted_pairs[offsets[e],
//     offsets[e + 1]), in increasing pair index.
//   active: [X]: the experts with at least one pair, increasing; n_active: [1].
//   padded: [X + 1] and row_of_pair: [n * K]: the same grouping with each
//     expert's rows rounded up to a multiple of pad (a prefill GEMM's rows):
//     pair p's row is row_of_pair[p] in [padded[e], padded[e + 1]).
// Requires X <= kMoeMaxExperts, K <= min(X, kMoeMaxExpertsUsed), pad >= 1,
// n_group <= kMoeMaxGroups dividing X.
struct MoeRouting {
  int32_t* ids = nullptr;
  float* weights = nullptr;
  int32_t* offsets = nullptr;
  int32_t* active = nullptr;
  int32_t* n_active = nullptr;
  int32_t* sorted_pairs = nullptr;
  int32_t* padded = nullptr;
  int32_t* row_of_pair = nullptr;
};
void moe_route(const float* logits, int64_t n, const MoeRouter& router, int32_t pad, const MoeRouting& r,
               cudaStream_t stream);

// The experts' matrices of one projection in one buffer: expert e's
// [n_rows, n_cols] matrix (dtype F32/F16/BF16 or a quant_supported GGUF
// block type such as MXFP4, rows contiguous) at data + e * stride bytes.
struct MoeExperts {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  size_t stride = 0;
  int64_t n_rows = 0, n_cols = 0;
};

// Expert-indexed product over the pairs grouped by moe_route():
//   y[p, r] = sum_c W_{e(p)}[r, c] * x[p / x_div, c]   for every pair p,
// x: [*, n_cols] in x_dtype (w.dtype for float weights), y: [n_pairs,
// n_rows] f32. Each expert's
// weights are read once per pass over its pairs: bf16/f16 weights with
// n_cols a multiple of 64 (moe_mma_supported) on tensor cores, 32 pairs a
// pass, when tensor_cores; otherwise a GEMV on the CUDA cores, 8 pairs a
// pass. Either way each output is computed in an order fixed by the shape
// alone (see moe.cu), whatever the other pairs are: a token's result does
// not depend on the batch. Quantized weights (quant.h's block types,
// MXFP4 for gpt-oss) are decoded in the kernel as quant_gemv decodes them
// (one warp per row, 8 pairs a pass, x in F32/F16/BF16). max_active: an
// upper bound of *n_active known on the host (min(n_pairs, X)), the
// launch's grid.
bool moe_gemv_supported(DType w, int64_t n_cols);
bool moe_mma_supported(DType w, int64_t n_cols);
void moe_gemv(const MoeExperts& w, const void* x, DType x_dtype, int32_t x_div, const MoeRouting& r, int32_t max_active,
              float* y, bool tensor_cores, cudaStream_t stream);

// Prefill: xg[row_of_pair[p], :] = x[p / K, :] for the n * K pairs
// (rows of n_cols elements of a float dtype; padding rows are left as they are).
void moe_gather(DType dtype, const void* x, int64_t n, int32_t n_expert_used, int64_t n_cols,
                const int32_t* row_of_pair, void* xg, cudaStream_t stream);

// The experts' activation over rows of gate_up [n_rows, 2F] f32 (gate
// columns [0, F), up [F, 2F)) into out [n_rows, F] in out_dtype:
//   g = gate + bias_g, u = up + bias_u (bias [X, 2F] per expert, or null)
//   kSilu: silu(g) * u; kGeluTanh: gelu_tanh(g) * u; kClampedSwiglu
//   (gpt-oss): g' = min(g, limit), u' = clamp(u, -limit, limit),
//   g' sigmoid(alpha g') (u' + 1).
// A row's expert (for the bias) is row_expert[row] (device routing: pair
// rows, the routing's ids), else the e with padded[e] <= row < padded[e + 1]
// (the grouped rows). Without a bias neither is read.
enum class MoeAct { kSilu, kGeluTanh, kClampedSwiglu };
struct MoeGlu {
  MoeAct act = MoeAct::kSilu;
  float limit = 0.0f, alpha = 1.702f;
  const float* bias = nullptr;
  const int32_t* row_expert = nullptr;
  const int32_t* padded = nullptr;
  int32_t n_expert = 0;
};
void moe_glu(const float* gate_up, int64_t n_rows, int64_t n_ff, const MoeGlu& g, DType out_dtype, void* out,
             cudaStream_t stream);

// acc[t, j] = sum_k weights[t, k] * (y[row(t, k), j] + down_bias[e(t, k), j])   (k ascending)
//           + gate(t) * shared_y[t, j]                                        (when shared_y)
// with row(t, k) = row_of_pair[t K + k], or t K + k when row_of_pair is
// null; e(t, k) = ids[t K + k] (read only with down_bias [X, dim]);
// gate(t) = sigmoid(shared_logit[t]), or 1 when shared_logit is null (an
// ungated shared expert). out[t, j] += acc[t, j] when accumulate, else
// out[t, j] = acc[t, j]. The sum starts from 0 and goes into out last (cpu
// MoeFfn's order). y: [*, dim] f32, shared_y: [n, dim] f32 or null, out:
// [n, dim] f32.
struct MoeCombine {
  const int32_t* row_of_pair = nullptr;
  const int32_t* ids = nullptr;
  const float* down_bias = nullptr;
  const float* shared_y = nullptr;
  const float* shared_logit = nullptr;
  bool accumulate = true;
};
void moe_combine(const float* y, const float* weights, int64_t n, int32_t n_expert_used, int64_t dim,
                 const MoeCombine& c, float* out, cudaStream_t stream);

}  // namespace rill::cuda
