#include "backend/cuda/moe_ffn.h"

#include <algorithm>

#include "backend/cuda/ops.h"

namespace rill {
namespace {

// Bytes of one element of a float dtype on the device (F32: 4, F16/BF16: 2).
size_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : 2;
}

}  // namespace

Status CudaMoe::init(const MoeParams& p, DType act, bool quantized_experts) {
  p_ = p;
  act_ = act;
  quantized_ = quantized_experts;
  RILL_ASSIGN_OR_RETURN(padded_host_,
                        cuda::PinnedBuffer::allocate(static_cast<size_t>(p.n_expert + 1) * 4, "the MoE row counts"));
  return Status::Ok();
}

void CudaMoe::carve(cuda::Arena& a, int64_t max_tokens) {
  const int64_t X = p_.n_expert, K = p_.n_expert_used, E = p_.n_embd, F = p_.n_ff, Fs = p_.n_ff_shared;
  // silu_mul launches one grid row per expert row: at most 65,535.
  chunk_ = std::clamp<int64_t>(max_tokens, 1, std::min<int64_t>(kMaxChunk, (60000 - X * kPad) / K));
  rows_ = chunk_ * K + X * kPad;
  const size_t as = dtype_size(act_);
  const auto C = static_cast<size_t>(chunk_), R = static_cast<size_t>(rows_);
  const auto pairs = C * static_cast<size_t>(K), ne = static_cast<size_t>(X);
  logits_ = a.take<float>(C * ne);
  routing_.ids = a.take<int32_t>(pairs);
  routing_.weights = a.take<float>(pairs);
  routing_.sorted_pairs = a.take<int32_t>(pairs);
  routing_.row_of_pair = a.take<int32_t>(pairs);
  routing_.offsets = a.take<int32_t>(ne + 1);
  routing_.padded = a.take<int32_t>(ne + 1);
  routing_.active = a.take<int32_t>(ne);
  routing_.n_active = a.take<int32_t>(1);
  xg_ = a.take<uint8_t>(R * static_cast<size_t>(E) * as);
  gu_ = a.take<float>(R * static_cast<size_t>(2 * F));
  mid_ = a.take<uint8_t>(R * static_cast<size_t>(F) * as);
  y_ = a.take<float>(R * static_cast<size_t>(E));
  if (quantized_) wq_ = a.take<uint8_t>(static_cast<size_t>(2 * F * E) * as);
  if (Fs > 0) {
    shared_gu_ = a.take<float>(C * static_cast<size_t>(2 * Fs));
    shared_mid_ = a.take<uint8_t>(C * static_cast<size_t>(Fs) * as);
    shared_y_ = a.take<float>(C * static_cast<size_t>(E));
    shared_logit_ = a.take<float>(C);
  }
}

void CudaMoe::activate(const CudaMoeWeights& w, const float* gu, int64_t n_rows, int64_t n_ff, bool routed,
                       bool grouped, void* mid, cudaStream_t stream) const {
  const MoeParams& p = w.p;
  const float* bias = routed ? w.gate_up_bias : nullptr;
  if (!bias && p.swiglu_limit <= 0) {  // the plain GLUs of the dense layers
    if (p.gelu_tanh) {
      cuda::gelu_tanh_mul(gu, n_rows, n_ff, act_, mid, stream);
    } else {
      cuda::silu_mul(gu, n_rows, n_ff, act_, mid, stream);
    }
    return;
  }
  cuda::MoeGlu g;
  g.act = p.swiglu_limit > 0 ? cuda::MoeAct::kClampedSwiglu
          : p.gelu_tanh      ? cuda::MoeAct::kGeluTanh
                             : cuda::MoeAct::kSilu;
  g.limit = p.swiglu_limit;
  g.alpha = p.swiglu_alpha;
  g.bias = bias;
  g.row_expert = grouped ? nullptr : routing_.ids;
  g.padded = routing_.padded;
  g.n_expert = static_cast<int32_t>(p.n_expert);
  cuda::moe_glu(gu, n_rows, n_ff, g, act_, mid, stream);
}

Status CudaMoe::forward(const CudaMoeWeights& w, const void* router_h, const void* h, int64_t n, bool decode_only,
                        float* x, bool accumulate, cuda::Gemm& gemm, cudaStream_t stream) {
  const MoeParams& p = w.p;
  // Batch-invariant mode (gemm.batch_invariant()): device routing and the
  // fixed-order expert kernels (tensor cores where moe_mma_supported) at
  // every token count, never the grouped cuBLASLt GEMMs.
  const bool invariant = gemm.batch_invariant();
  const bool device_routing = invariant || decode_only || act_ == DType::kF32;
  const int64_t X = p.n_expert, K = p.n_expert_used, E = p.n_embd, F = p.n_ff, Fs = p.n_ff_shared;
  const size_t as = dtype_size(act_);
  cuda::MoeRouter router;
  router.n_expert = static_cast<int32_t>(X);
  router.n_expert_used = static_cast<int32_t>(K);
  router.norm_topk_prob = p.norm_topk_prob;
  router.sigmoid_scores = p.sigmoid_scores;
  router.softmax_after_topk = p.softmax_after_topk;
  router.n_group = static_cast<int32_t>(p.n_group);
  router.topk_group = static_cast<int32_t>(p.topk_group);
  router.routed_scaling_factor = p.routed_scaling_factor;
  router.router_bias = w.router_bias;
  router.score_bias = w.score_bias;
  router.expert_scale = w.expert_scale;
  const bool gated_shared = w.shared_gate.data != nullptr;
  for (int64_t t0 = 0; t0 < n; t0 += chunk_) {
    const int64_t m = std::min(chunk_, n - t0);
    const void* hc = static_cast<const uint8_t*>(h) + static_cast<size_t>(t0 * E) * as;
    const void* rc = static_cast<const uint8_t*>(router_h) + static_cast<size_t>(t0 * E) * as;
    float* xc = x + t0 * E;
    RILL_TRY(gemm.matmul(act_, w.router.data, rc, m, X, E, logits_, false));
    cuda::moe_route(logits_, m, router, kPad, routing_, stream);
    if (Fs > 0) {
      RILL_TRY(gemm.matmul(act_, w.shared_gate_up.data, hc, m, 2 * Fs, E, shared_gu_, false));
      activate(w, shared_gu_, m, Fs, false, false, shared_mid_, stream);
      RILL_TRY(gemm.matmul(act_, w.shared_down.data, shared_mid_, m, E, Fs, shared_y_, false));
      if (gated_shared) RILL_TRY(gemm.matmul(act_, w.shared_gate.data, hc, m, 1, E, shared_logit_, false));
    }
    if (device_routing) {
      const auto max_active = static_cast<int32_t>(std::min(m * K, X));
      const bool tensor_cores = invariant || m >= kMmaMinTokens;
      cuda::moe_gemv(w.gate_up, hc, act_, static_cast<int32_t>(K), routing_, max_active, gu_, tensor_cores, stream);
      activate(w, gu_, m * K, F, true, false, mid_, stream);
      cuda::moe_gemv(w.down, mid_, act_, 1, routing_, max_active, y_, tensor_cores, stream);
    } else {
      RILL_TRY(experts_grouped(w, hc, m, gemm, stream));
    }
    cuda::MoeCombine c;
    c.row_of_pair = device_routing ? nullptr : routing_.row_of_pair;
    c.ids = routing_.ids;
    c.down_bias = w.down_bias;
    c.shared_y = Fs > 0 ? shared_y_ : nullptr;
    c.shared_logit = gated_shared ? shared_logit_ : nullptr;
    c.accumulate = accumulate;
    cuda::moe_combine(y_, routing_.weights, m, static_cast<int32_t>(K), E, c, xc, stream);
  }
  return Status::Ok();
}

// y_ rows (padded layout) of the m tokens' pairs: one GEMM per active expert
// and projection over its gathered rows.
Status CudaMoe::experts_grouped(const CudaMoeWeights& w, const void* h, int64_t m, cuda::Gemm& gemm,
                                cudaStream_t stream) {
  const int64_t X = w.p.n_expert, K = w.p.n_expert_used, E = w.p.n_embd, F = w.p.n_ff;
  const size_t as = dtype_size(act_);
  auto* padded = static_cast<int32_t*>(padded_host_.data());
  RILL_CUDA_CHECK(
      cudaMemcpyAsync(padded, routing_.padded, static_cast<size_t>(X + 1) * 4, cudaMemcpyDeviceToHost, stream));
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
    return Error{cuda::cuda_error_text(e, "MoE routing")};
  }
  cuda::moe_gather(act_, h, m, static_cast<int32_t>(K), E, routing_.row_of_pair, xg_, stream);
  auto* xg = static_cast<uint8_t*>(xg_);
  auto* mid = static_cast<uint8_t*>(mid_);
  // An expert in quantized blocks is dequantized to act into wq_ first
  // (the stream orders each use of wq_ after the GEMM before it).
  auto matrix = [&](const cuda::MoeExperts& x, int64_t e) -> const void* {
    const uint8_t* at = static_cast<const uint8_t*>(x.data) + static_cast<size_t>(e) * x.stride;
    if (!dtype_info(x.dtype).quantized) return at;
    cuda::dequantize_rows(x.dtype, at, x.n_cols, 0, x.n_rows, act_, wq_, stream);
    return wq_;
  };
  for (int64_t e = 0; e < X; ++e) {
    const int64_t r0 = padded[e], rows = padded[e + 1] - r0;
    if (rows == 0) continue;
    RILL_TRY(gemm.matmul(act_, matrix(w.gate_up, e), xg + static_cast<size_t>(r0 * E) * as, rows, 2 * F, E,
                         gu_ + r0 * 2 * F, false));
  }
  activate(w, gu_, padded[X], F, true, true, mid_, stream);
  for (int64_t e = 0; e < X; ++e) {
    const int64_t r0 = padded[e], rows = padded[e + 1] - r0;
    if (rows == 0) continue;
    RILL_TRY(
        gemm.matmul(act_, matrix(w.down, e), mid + static_cast<size_t>(r0 * F) * as, rows, E, F, y_ + r0 * E, false));
  }
  return Status::Ok();
}

}  // namespace rill
