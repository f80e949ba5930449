#pragma once
// The mixture-of-experts FFN (model/moe.h's MoeFfn, the CPU reference) on a
// CUDA device, for any CUDA model family: softmax top-k routing with
// norm_topk_prob, routed experts computed per token group (never a dense
// pass over all experts), and an optional shared expert with its sigmoid
// gate.
//
// Two ways through a layer:
//  - device routing (decode steps, CUDA-graph safe): the router GEMM, then
//    backend/cuda/moe.h's route-and-group kernel, the expert-indexed
//    products for gate/up and down (each expert's weights read once per 8
//    of its tokens by a GEMV, or per 32 on tensor cores: bf16/f16 steps of
//    kMmaMinTokens tokens or more), and the weighted sum per token. No host
//    synchronization; with f32 weights (always the GEMV) a token's output
//    does not depend on the other tokens of the step. bf16/f16 follow the
//    Llama layers' rule (cuda/gemm.h: a GEMV for one token, else tensor
//    cores), so there one token alone and in a batch may differ in rounding.
//  - grouped GEMMs (prefill): the same routing, then the expert row counts
//    come to the host (one stream synchronization per layer), the tokens'
//    rows are gathered per expert (each expert's rows padded to a multiple
//    of kPad) and each active expert runs two GEMMs (cuBLASLt for bf16).
// Batch-invariant mode (the model's Gemm in its invariant mode) takes the
// first at every token count with tensor cores whenever the shape allows
// (a choice by shape, not by token count), so bf16/f16 tokens are then
// batch invariant too; the router and shared expert go through gemm.matmul
// (gemm_invariant).
// F32 weights always take the first: every f32 matmul is the fixed-order
// GEMV anyway (cuda/gemm.h), so a token's result is then the same in a
// decode step, a prefill chunk or a mixed step.
// Both add the result into the f32 residual stream x, so the FFN's residual
// add costs nothing. Tokens go in chunks of at most kMaxChunk (scratch is
// sized for one chunk at load; nothing allocates per step).
#if RILL_HAVE_CUDA
#include <string>

#include "backend/cuda/gemm.h"
#include "backend/cuda/moe.h"
#include "model/cuda_model_base.h"
#include "model/moe.h"

namespace rill {

// One MoE layer's weights in device memory (matrices in the activation dtype).
struct CudaMoeWeights {
  MoeParams p;
  cuda::DeviceWeight router;          // [X, E]
  cuda::MoeExperts gate_up;           // X x [2F, E]: gate rows, then up rows
  cuda::MoeExperts down;              // X x [E, F]
  cuda::DeviceWeight shared_gate_up;  // [2 Fs, E]; data null without a shared expert
  cuda::DeviceWeight shared_down;     // [E, Fs]
  cuda::DeviceWeight shared_gate;     // [1, E]
};

// Where one layer's weights go in a WeightUpload: place() during the
// layout pass, resolve() after WeightUpload::upload().
struct CudaMoePlacement {
  MoeParams p;
  size_t router = 0, gate_up = 0, down = 0, gate_up_stride = 0, down_stride = 0;
  size_t shared_gate_up = 0, shared_down = 0, shared_gate = 0;

  // Errors (naming `what`) for quantized MoE weights, which the kernels do
  // not read, and for shapes they do not take.
  static Result<CudaMoePlacement> place(const MoeFfn& host, WeightUpload& up, const std::string& what);
  CudaMoeWeights resolve(const WeightUpload& up) const;
};

// Scratch and forward, shared by a model's MoE layers (they run one at a time).
class CudaMoe {
 public:
  static constexpr int32_t kPad = 16;         // rows per expert in a prefill GEMM: a multiple of this
  static constexpr int64_t kMaxChunk = 2048;  // tokens per pass
  static constexpr int64_t kMmaMinTokens = 2;

  // p: the model's MoE parameters (every MoE layer has the same); act: the
  // activation dtype. Allocates the pinned row counts.
  Status init(const MoeParams& p, DType act, const std::string& path);
  // Activation scratch for steps of up to max_tokens tokens (arena sizing
  // pass, then the real one).
  void carve(cuda::Arena& a, int64_t max_tokens);

  // x[t] += MoE(h[t]) for n tokens. h: [n, E] in the activation dtype,
  // x: [n, E] f32. decode_only: the step may be captured in a CUDA graph
  // (no prefill tiles): device routing. Otherwise the grouped GEMMs (which
  // synchronize the stream) unless the weights are f32. grouped: tests
  // only, forces the grouped GEMMs.
  Status forward(const CudaMoeWeights& w, const void* h, int64_t n, bool decode_only, float* x, cuda::Gemm& gemm,
                 cudaStream_t stream, bool grouped = false);

 private:
  Status experts_grouped(const CudaMoeWeights& w, const void* h, int64_t n, cuda::Gemm& gemm, cudaStream_t stream);

  MoeParams p_;
  DType act_ = DType::kBF16;
  // The decode path's bf16/f16 experts run on tensor cores from
  // kMmaMinTokens tokens on, the CUDA-core GEMV below (on the H200 with
  // moe-7b-a1b the GEMV was 2.4% faster at one token, tensor cores 6%
  // faster at 8 and 2.4x at 64: docs/perf.md, the run that set
  // kMmaMinTokens), and on tensor cores at every count in batch-invariant
  // mode. The switch that forced either (RILL_CUDA_MOE_MMA) is gone: that
  // comparison is done, and batch_invariant gives the one order per token.
  int64_t chunk_ = 0, rows_ = 0;  // tokens per pass; expert rows of one pass (padded)
  cuda::MoeRouting routing_;
  float* logits_ = nullptr;         // [chunk, X]
  void* xg_ = nullptr;              // [rows, E] act: gathered inputs (grouped path)
  float* gu_ = nullptr;             // [rows, 2F]
  void* mid_ = nullptr;             // [rows, F] act: silu(gate) * up
  float* y_ = nullptr;              // [rows, E]: expert outputs
  float* shared_gu_ = nullptr;      // [chunk, 2 Fs]
  void* shared_mid_ = nullptr;      // [chunk, Fs] act
  float* shared_y_ = nullptr;       // [chunk, E]
  float* shared_logit_ = nullptr;   // [chunk]
  cuda::PinnedBuffer padded_host_;  // [X + 1]
};

}  // namespace rill
#endif  // RILL_HAVE_CUDA
