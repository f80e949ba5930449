// `llama.cuda`: the CUDA runtime's glue for the Llama graph. The graph
// itself (placement, forward) is model/arch/llama.h's, shared with the CPU;
// this file has model/cuda_model_base.h build a CUDA Backend over its
// context, stream and GEMM, places the weights through it (one device buffer:
// fused q/k/v and gate/up, GGUF blocks kept quantized, bf16 activations
// for quantized models), carves the activations and the Backend's scratch
// from the base's arena, and runs llama_forward() in run_layers() over the
// uploaded step metadata (captured in decode graphs by the base).
//
// Runtime hooks (LlamaHooks): the KV planes; as a tensor-parallel rank (a
// CudaShard, model/cuda_shard.h) the model holds its heads' q/k/v rows and
// o columns, its slice of gate/up rows and down columns and its LM head
// rows (tensor_split.h), and the hooks add the all-reduce after o and down;
// the logits gather follows the graph (cuda_model_base.h). The embedding
// stays whole on every rank: a step reads only its n rows, so a
// vocabulary-parallel gather would save memory (1 GB for the 8B) at the cost
// of one more all-reduce of [n, E] per step. mixtral / qwen3_moe layers run
// model/cuda_moe.h's MoE FFN (its experts in a second device buffer), which
// adds into the residual stream like down_proj (unsharded only: tensor
// parallelism on CUDA refuses MoE models).
//
// Tensor parallelism (options.tensor_parallel > 1): one rank per GPU of
// this host over an NcclGroup, built by model/tensor_parallel.h's factory
// (shared with the CPU's simulated ranks). Each rank is driven by its own
// host thread (TensorParallelModel's workers) rather than one thread
// issuing every rank's work inside ncclGroupStart/End: each rank then runs
// the single-GPU step unchanged (same kernels, same decode-graph capture and
// replay; CUDA stream capture is per thread), with its all-reduces enqueued
// on its own stream; NCCL requires group calls only when one thread drives
// several ranks. A decode step is one graph launch per rank, so the
// per-step host cost is one wake-up per worker.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/arch/families.h"
#include "model/cuda_shard.h"
#include "model/moe.h"
#include "model/tensor_parallel.h"
#include "model/tensor_split.h"
#include "parallel/nccl_group.h"

#if RILL_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#include "model/arch/llama.h"
#include "model/arch/llama_weights.h"
#include "model/cuda_model_base.h"
#include "model/cuda_moe.h"
#endif

namespace rill {

#if RILL_HAVE_CUDA
namespace {

class LlamaCudaModel final : public CudaModelBase {
 public:
  explicit LlamaCudaModel(std::shared_ptr<const ModelFiles> files, CudaShard shard = {})
      : CudaModelBase(std::move(files), shard), hooks_(*this) {}
  Status init(const ModelOptions& options);

 private:
  // The graph's runtime hooks: the KV planes, the shard's all-reduce, the
  // MoE FFN (model/cuda_moe.h; never on a shard, see the top).
  class Hooks final : public LlamaHooks {
   public:
    explicit Hooks(LlamaCudaModel& m) : m_(m) {}
    KvCacheView kv_cache(int64_t il) const override { return m_.kv_view(static_cast<size_t>(il)); }
    bool sharded() const override { return m_.sharded(); }
    bool owns_residual() const override { return m_.owns_residual(); }
    Status reduce_residual(Tensor x) override { return m_.reduce_residual(x.f32(), x.rows); }
    Status moe_ffn(int64_t il, Tensor h, Tensor x, const StepMetadata& step) override {
      return m_.moe_.forward(*m_.moe_weights_[static_cast<size_t>(il)], h.data, x.rows, step.n_tiles == 0, x.f32(),
                             *m_.gemm_, m_.stream());
    }

   private:
    LlamaCudaModel& m_;
  };

  void carve_activations(cuda::Arena& a) override;
  Status run_layers(const Step& s) override;
  Status place_moe(const LlamaWeights& w);

  LlamaGraph graph_;
  Hooks hooks_;
  LlamaActivations act_views_;  // over the arena
  // MoE layers (mixtral, qwen3_moe): their experts, in a buffer of their own
  // until MoE is a Backend op, and the MoE scratch.
  cuda::DeviceBuffer moe_buf_;
  std::vector<std::optional<CudaMoeWeights>> moe_weights_;
  CudaMoe moe_;
};

Status LlamaCudaModel::init(const ModelOptions& options) {
  const ModelFiles& f = *files_;
  RILL_TRY(read_dims());
  RILL_TRY(create_context());
  RILL_ASSIGN_OR_RETURN(LlamaWeights w, bind_llama_weights(f, LlamaDims{E_, V_, F_, hd_, Q_, KV_}));
  if (sharded()) {  // this rank's slices (views of the mapped tensors); o's bias is added after the all-reduce
    RILL_TRY(shard_llama_layers(w, split_, ff_split_, hd_, f.path));
    w.lm_head = slice_rows(w.lm_head, split_.vocab);
    narrow_dims();
  }
  std::vector<const WeightView*> mats;
  for (const LlamaLayerWeights& h : w.layers) {
    for (const Linear* l : {&h.q, &h.k, &h.v, &h.o}) mats.push_back(&l->w);
    if (h.moe) {
      h.moe->collect_weights(&mats);
    } else {
      for (const Linear* l : {&h.gate, &h.up, &h.down}) mats.push_back(&l->w);
    }
  }
  RILL_ASSIGN_OR_RETURN(const CudaDtypes dt, pick_cuda_dtypes(f.path, mats, w.embed));
  act_ = dt.act;
  kv_dtype_ = dt.kv;  // as the CPU Llama: f32 checkpoints keep f32 KV

  RILL_TRY(create_backend(options));
  RILL_ASSIGN_OR_RETURN(const RopeTable rope, build_llama_rope(f, hd_));
  RILL_ASSIGN_OR_RETURN(graph_, place_llama(*backend_, cfg_, w, LlamaDims{E_, V_, F_, hd_, Q_, KV_}, rope));
  RILL_TRY(place_moe(w));
  kv_spec_ = {cfg_.sliding_window > 0 ? sliding(static_cast<int32_t>(cfg_.sliding_window)) : full()};
  return init_runtime(options);
}

// The MoE layers' experts into one device buffer (cuda_moe.h's placement).
Status LlamaCudaModel::place_moe(const LlamaWeights& w) {
  moe_weights_.resize(w.layers.size());
  if (cfg_.n_expert <= 0) return Status::Ok();
  WeightUpload up(act_);
  std::vector<std::optional<CudaMoePlacement>> at(w.layers.size());
  for (size_t il = 0; il < w.layers.size(); ++il) {
    if (!w.layers[il].moe) continue;
    RILL_ASSIGN_OR_RETURN(
        at[il], CudaMoePlacement::place(*w.layers[il].moe, up, files_->path + ": layer " + std::to_string(il)));
  }
  RILL_TRY(up.upload("the MoE experts (" + files_->path + ")"));
  for (size_t il = 0; il < at.size(); ++il) {
    if (at[il]) moe_weights_[il] = at[il]->resolve(up);
  }
  moe_buf_ = up.take_buffer();
  return moe_.init(moe_params(cfg_), act_, files_->path);
}

void LlamaCudaModel::carve_activations(cuda::Arena& a) {
  const int64_t T = max_batch_tokens(), S = max_batch_seqs();
  const int64_t F = graph_.has_dense_ffn() ? graph_.F : 0;
  act_views_.x = carve_tensor(a, DType::kF32, T, E_);
  act_views_.h = carve_tensor(a, act_, T, E_);
  act_views_.qkv = carve_tensor(a, DType::kF32, T, graph_.qkv_width());
  act_views_.attn = carve_tensor(a, act_, T, graph_.Q);
  act_views_.gu = carve_tensor(a, DType::kF32, T, 2 * F);
  act_views_.mlp = carve_tensor(a, act_, T, F);
  act_views_.final_rows = carve_tensor(a, act_, S, E_);
  if (cfg_.n_expert > 0) moe_.carve(a, T);
  carve_cuda_scratch(*backend_, a, graph_.step_limits(T, S));
}

// The shared graph over the uploaded step metadata, then (shards) the
// logits gather.
Status LlamaCudaModel::run_layers(const Step& s) {
  const StepMetadata md = step_metadata(s);
  const Tensor logits = Tensor::dense(head_out(), DType::kF32, s.n_sample, graph_.head_rows);
  RILL_TRY(llama_forward(*backend_, graph_, md, act_views_, logits, hooks_));
  return s.n_sample > 0 ? gather_logits(s.n_sample) : Status::Ok();
}

}  // namespace
#endif  // RILL_HAVE_CUDA

namespace {

// One rank per GPU (devices 0..N-1). The refusals that hold whatever the
// host has come first: MoE, then the split's (heads, KV heads, intermediate
// size), then the GPU count.
Result<std::unique_ptr<Model>> create_llama_cuda_tp_model(std::shared_ptr<const ModelFiles> files,
                                                          const ModelOptions& options) {
  const int n_ranks = options.tensor_parallel;
  const ModelConfig& cfg = files->config;
  const std::string path = files->path;
  if (n_ranks < 1) return Error{"--tensor-parallel " + std::to_string(n_ranks) + ": expected 1 or more GPUs"};
  if (cfg.n_expert > 0) {
    return Error{path + ": " + cfg.architecture +
                 " is a mixture of experts; tensor parallelism on CUDA is built for "
                 "the dense Llama family only (run it with --tensor-parallel 1, or split on the CPU)"};
  }
  RILL_TRY(plan_tensor_split(cfg, 0, n_ranks, path));
  RILL_TRY(split_evenly(cfg.n_ff, 0, n_ranks, "intermediate_size", path));
#if RILL_HAVE_CUDA
  int n_devices = 0;
  if (cudaGetDeviceCount(&n_devices) != cudaSuccess) {
    cudaGetLastError();
    n_devices = 0;
  }
  if (n_ranks > n_devices) {
    return Error{"--tensor-parallel " + std::to_string(n_ranks) + " needs " + std::to_string(n_ranks) +
                 " GPUs; this host has " + std::to_string(n_devices) + " visible (see CUDA_VISIBLE_DEVICES)"};
  }
  std::vector<int> devices(static_cast<size_t>(n_ranks));
  for (int r = 0; r < n_ranks; ++r) devices[static_cast<size_t>(r)] = r;
  RILL_ASSIGN_OR_RETURN(std::unique_ptr<NcclGroup> group, NcclGroup::create(devices));
  NcclGroup* g = group.get();
  return create_tensor_parallel_model(
      std::move(group), options, path,
      [&](int rank, const ModelOptions& rank_options) -> Result<std::unique_ptr<Model>> {
        auto m = init_model(std::make_unique<LlamaCudaModel>(files, CudaShard{g, rank}), rank_options);
        if (!m.ok()) return Error{"GPU " + std::to_string(rank) + ": " + m.error().message};
        return m;
      });
#else
  return Error{"tensor parallelism on GPUs needs a build with CUDA and NCCL (RILL_CUDA=ON where nvcc is installed)"};
#endif
}

}  // namespace

Result<std::unique_ptr<Model>> create_llama_cuda_model(std::shared_ptr<const ModelFiles> files,
                                                       const ModelOptions& options) {
  if (moe_params(files->config).sigmoid_scores) {
    return Error{files->path + ": " + files->config.architecture +
                 "'s sigmoid, group-limited MoE router is not on CUDA yet (model/cuda_moe.h routes by softmax); "
                 "run it on the CPU"};
  }
  if (options.tensor_parallel != 1) return create_llama_cuda_tp_model(std::move(files), options);
#if RILL_HAVE_CUDA
  return init_model(std::make_unique<LlamaCudaModel>(std::move(files)), options);
#else
  return cuda_not_built();
#endif
}

}  // namespace rill
