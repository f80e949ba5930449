#pragma once
// The mixture-of-experts FFN on a CUDA device: the CUDA Backend's moe_ffn
// (backend/backend.h; the CPU reference is backend/cpu/moe.h). It runs
// every router of MoeParams on the device (softmax top-k with
// norm_topk_prob; DeepSeek / GLM's sigmoid scores with the correction bias,
// group-limited choice and routed_scaling_factor; gpt-oss's top-k then
// softmax with the router's bias; Gemma 4's per-expert scales), SwiGLU,
// GeGLU or gpt-oss's clamped SwiGLU experts with optional biases, routed
// experts computed per token group (never a dense pass over all experts)
// and an optional shared expert, gated by a sigmoid or not. Routed experts
// stay in their GGUF blocks where the kernels decode them (MXFP4, Q8_0, ...;
// quant.h), else in the activation dtype.
//
// Two ways through a layer:
//  - device routing (decode steps, CUDA-graph safe): the router GEMM, then
//    moe.h's routing kernels (picks, then grouping), the expert-indexed products for
//    gate/up and down (each expert's weights read once per 8 of its tokens
//    by a GEMV, or per 32 on tensor cores: bf16/f16 steps of kMmaMinTokens
//    tokens or more), and the weighted sum per token. No host
//    synchronization; with f32 weights (always the GEMV) a token's output
//    does not depend on the other tokens of the step. bf16/f16 follow the
//    Llama layers' rule (cuda/gemm.h: a GEMV for one token, else tensor
//    cores), so there one token alone and in a batch may differ in rounding.
//  - grouped GEMMs (prefill): the same routing, then the expert row counts
//    come to the host (one stream synchronization per layer), the tokens'
//    rows are gathered per expert (each expert's rows padded to a multiple
//    of kPad) and each active expert runs two GEMMs (cuBLASLt for bf16).
// Batch-invariant mode (the Gemm in its invariant mode) takes the first at
// every token count with tensor cores whenever the shape allows (a choice
// by shape, not by token count), so bf16/f16 tokens are then batch
// invariant too; the router and shared expert go through gemm.matmul
// (gemm_invariant).
// F32 weights always take the first: every f32 matmul is the fixed-order
// GEMV anyway (cuda/gemm.h), so a token's result is then the same in a
// decode step, a prefill chunk or a mixed step. Quantized experts (GGUF
// blocks: MXFP4, ...) go through the same two ways: the expert-indexed GEMV
// decodes their blocks; the grouped path dequantizes each active expert to
// the activation dtype into one expert's scratch before its GEMM.
// Both add the result into the f32 residual stream x, so the FFN's residual
// add costs nothing. Tokens go in chunks of at most kMaxChunk (scratch is
// sized for one chunk when the backend's scratch is carved; nothing
// allocates per step).
#include <cuda_runtime.h>

#include <string>

#include "backend/backend.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/quant.h"

namespace rill {

// One MoE layer's weights in device memory (the router and shared expert
// in the activation dtype; the routed experts in it or in their quantized
// blocks). Vectors f32, null when absent.
struct CudaMoeWeights {
  MoeParams p;
  cuda::DeviceWeight router;            // [X, E]
  const float* router_bias = nullptr;   // [X]: added to the logits
  const float* score_bias = nullptr;    // [X]: the choice's correction bias
  const float* expert_scale = nullptr;  // [X]: times each chosen expert's weight
  cuda::MoeExperts gate_up;             // X x [2F, E]: gate rows, then up rows
  cuda::MoeExperts down;                // X x [E, F]
  const float* gate_up_bias = nullptr;  // [X, 2F]: gate biases, then up biases
  const float* down_bias = nullptr;     // [X, E]
  cuda::DeviceWeight shared_gate_up;    // [2 Fs, E]; data null without a shared expert
  cuda::DeviceWeight shared_down;       // [E, Fs]
  cuda::DeviceWeight shared_gate;       // [1, E]; data null: ungated (weight 1)
};

// Scratch and forward, shared by a model's MoE layers (they run one at a
// time): init() takes the largest of each width over the layers, and the
// scratch is carved after the last init().
class CudaMoe {
 public:
  static constexpr int32_t kPad = 16;         // rows per expert in a prefill GEMM: a multiple of this
  static constexpr int64_t kMaxChunk = 2048;  // tokens per pass
  static constexpr int64_t kMmaMinTokens = 2;

  // p: the layers' largest widths (n_embd, n_expert, n_expert_used, n_ff,
  // n_ff_shared); act: the activation dtype; quantized_experts: some
  // layer keeps its experts in quantized blocks (carve() then adds one
  // expert's dequantization scratch). Allocates the pinned row counts
  // (again when called again).
  Status init(const MoeParams& p, DType act, bool quantized_experts);
  bool quantized_experts() const { return quantized_; }
  bool initialized() const { return padded_host_.data() != nullptr; }
  const MoeParams& params() const { return p_; }
  // Activation scratch for steps of up to max_tokens tokens (arena sizing
  // pass, then the real one).
  void carve(cuda::Arena& a, int64_t max_tokens);

  // x[t] (+)= MoE(h[t]) for n tokens, the router reading router_h[t]
  // (h itself but for Gemma 4). router_h, h: [n, E] in the activation
  // dtype, x: [n, E] f32 (accumulate: added to, else overwritten).
  // decode_only: the step may be captured in a CUDA graph (no prefill
  // tiles): device routing. Otherwise the grouped GEMMs (which synchronize
  // the stream) unless the weights are f32.
  Status forward(const CudaMoeWeights& w, const void* router_h, const void* h, int64_t n, bool decode_only, float* x,
                 bool accumulate, cuda::Gemm& gemm, cudaStream_t stream);

 private:
  Status experts_grouped(const CudaMoeWeights& w, const void* h, int64_t n, cuda::Gemm& gemm, cudaStream_t stream);
  // mid = act(gate) * up over n_rows rows of gu (the layer's activation; a
  // row's expert for the biases from the routing: pair rows, or the
  // grouped path's padded rows).
  void activate(const CudaMoeWeights& w, const float* gu, int64_t n_rows, int64_t n_ff, bool routed, bool grouped,
                void* mid, cudaStream_t stream) const;

  MoeParams p_;
  DType act_ = DType::kBF16;
  bool quantized_ = false;
  // The decode path's bf16/f16 experts run on tensor cores from
  // kMmaMinTokens tokens on, the CUDA-core GEMV below (on the H200 with
  // moe-7b-a1b the GEMV was 2.4% faster at one token, tensor cores 6%
  // faster at 8 and 2.4x at 64: docs/perf.md, the run that set
  // kMmaMinTokens), and on tensor cores at every count in batch-invariant
  // mode.
  int64_t chunk_ = 0, rows_ = 0;  // tokens per pass; expert rows of one pass (padded)
  cuda::MoeRouting routing_;
  float* logits_ = nullptr;         // [chunk, X]
  void* xg_ = nullptr;              // [rows, E] act: gathered inputs (grouped path)
  float* gu_ = nullptr;             // [rows, 2F]
  void* mid_ = nullptr;             // [rows, F] act: silu(gate) * up
  float* y_ = nullptr;              // [rows, E]: expert outputs
  void* wq_ = nullptr;              // [2F, E] act: one quantized expert's matrix, dequantized (grouped path)
  float* shared_gu_ = nullptr;      // [chunk, 2 Fs]
  void* shared_mid_ = nullptr;      // [chunk, Fs] act
  float* shared_y_ = nullptr;       // [chunk, E]
  float* shared_logit_ = nullptr;   // [chunk]
  cuda::PinnedBuffer padded_host_;  // [X + 1]
};

}  // namespace rill
