#pragma once
// Factories of the model families, one per file in model/arch/. The
// registry (model/registry.cpp) binds them to implementation ids.
#include <memory>
#include <utility>

#include "core/result.h"
#include "loader/model_files.h"
#include "model/model.h"

namespace rill {

// The factories' common tail: init a freshly made model and hand it out.
template <typename M>
Result<std::unique_ptr<Model>> init_model(std::unique_ptr<M> model, const ModelOptions& options) {
  RILL_TRY(model->init(options));
  return std::unique_ptr<Model>(std::move(model));
}

// What a CUDA factory returns in a build without CUDA.
inline Error cuda_not_built() {
  return Error{"this rill was built without CUDA (configure with -DRILL_CUDA=ON where nvcc is installed)"};
}

// One factory per (family, device): the registry binds each to its id
// (model/registry.cpp: "llama.cpu" -> create_llama_cpu_model, ...) and only
// calls it with options.device equal to the implementation's device; the
// factories never look at options.device. Tensor parallelism is a mode of
// an implementation: the Llama factories split over options.tensor_parallel
// ranks when it is above 1, the others are registered without it.

// Llama family: llama (incl. llama3 rope scaling, tied embeddings), mistral
// (sliding window), qwen2 (qkv bias), qwen3 (q/k RMSNorm), smollm, and with
// the MoE FFN (model/moe.h) mixtral and qwen3_moe.
// llama.cpu (llama.cpp); options.tensor_parallel != 1: that many simulated
// ranks in one process, each a llama.cpu rank, tied by
// model/tensor_parallel.h's create_tensor_parallel_model.
Result<std::unique_ptr<Model>> create_llama_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                      const ModelOptions& options);
// llama.cuda (llama.cpp under RILL_HAVE_CUDA; MoE layers through the CUDA
// Backend's moe_ffn; quantized GGUF experts are refused there); options.tensor_parallel > 1: one rank
// per GPU over NCCL, tied by the same factory, dense models only.
Result<std::unique_ptr<Model>> create_llama_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                       const ModelOptions& options);

// Gemma family: gemma2, gemma3_text and gemma3's text model, gemma4_text
// and gemma4's text model; sliding and full layers in two KV groups. gemma.cpu and gemma.cuda: one graph, both
// runtimes in gemma.cpp.
Result<std::unique_ptr<Model>> create_gemma_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                      const ModelOptions& options);
Result<std::unique_ptr<Model>> create_gemma_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                       const ModelOptions& options);

// Hybrid gated DeltaNet: qwen3_5_text (Qwen3.5, dense FFN) and qwen3_next
// (Qwen3-Next, MoE FFN with a shared expert), from Hugging Face checkpoints
// or llama.cpp's qwen35 / qwen3next GGUF files. qwen3_next.cpu and
// qwen3_next.cuda: one graph (qwen3_next.cpp).
Result<std::unique_ptr<Model>> create_qwen3_next_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                           const ModelOptions& options);
Result<std::unique_ptr<Model>> create_qwen3_next_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                            const ModelOptions& options);

// gpt-oss (gpt_oss): alternating sliding / full attention with sink
// logits, YaRN, an MoE FFN with biases and the clamped SwiGLU on every
// layer. gpt_oss.cpu and gpt_oss.cuda: one graph (gpt_oss.cpp); the CUDA
// one loads once the CUDA Backend's place_moe takes gpt-oss's experts.
Result<std::unique_ptr<Model>> create_gpt_oss_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                        const ModelOptions& options);
Result<std::unique_ptr<Model>> create_gpt_oss_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                         const ModelOptions& options);

// BERT family (encoders, embeddings only): bert.cpu (bert.cpp, on the CPU
// Backend); bert.cuda refuses until the CUDA Backend has the encoder ops.
Result<std::unique_ptr<Model>> create_bert_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                     const ModelOptions& options);
Result<std::unique_ptr<Model>> create_bert_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                      const ModelOptions& options);

// Multi-head latent attention: deepseek_v3 (MoE with the sigmoid,
// group-limited router), minicpm3 (dense, muP scales) and glm_moe_dsa
// (GLM-5: DeepSeek-V3 plus DeepSeek sparse attention), from Hugging Face
// checkpoints. deepseek_v3.cpu / minicpm3.cpu / glm_moe_dsa.cpu
// (deepseek.cpp); the .cuda ids refuse until the CUDA Backend has the MLA ops.
Result<std::unique_ptr<Model>> create_mla_cpu_model(std::shared_ptr<const ModelFiles> files,
                                                    const ModelOptions& options);
Result<std::unique_ptr<Model>> create_mla_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                     const ModelOptions& options);

}  // namespace rill
