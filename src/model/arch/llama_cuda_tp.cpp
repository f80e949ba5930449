// The CUDA Llama split over the GPUs of this host: one shard per GPU
// (llama_cuda.cpp as a CudaShard: its heads, KV heads, FFN slice and LM head
// rows, model/tensor_split.h's cut), tied together by an NcclGroup into one
// TensorParallelModel, which the engine drives like any other model.
//
// Why one host thread per rank (TensorParallelModel's workers) and not one
// thread issuing every rank's work inside ncclGroupStart/End: each rank then
// runs the single-GPU step unchanged (same kernels, same decode-graph
// capture and replay; CUDA stream capture is per thread), with its
// all-reduces simply enqueued on its own stream; NCCL requires group calls
// only when one thread drives several ranks. A decode step is one graph
// launch per rank, so the per-step host cost is one wake-up per worker.
//
// KV: block b of every rank holds that rank's KV heads of the same tokens,
// so the engine sees one block space; every rank gets the same number of
// blocks (rank 0 sizes its pool, the others are given its block count).
// ModelOptions::kv_cache_bytes is the whole model's budget (split evenly).
#include <string>
#include <vector>

#include "model/arch/families.h"
#include "model/cuda_shard.h"
#include "model/tensor_parallel.h"
#include "model/tensor_split.h"
#include "parallel/nccl_group.h"

#if RILL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace rill {

Result<std::unique_ptr<Model>> create_llama_cuda_tp_model(std::shared_ptr<const ModelFiles> files,
                                                          const ModelOptions& options) {
  const int n_ranks = options.tensor_parallel;
  const ModelConfig& cfg = files->config;
  const std::string& path = files->path;
  if (n_ranks < 1) return Error{"--tensor-parallel " + std::to_string(n_ranks) + ": expected 1 or more GPUs"};
  if (cfg.n_expert > 0) {
    return Error{path + ": " + cfg.architecture +
                 " is a mixture of experts; tensor parallelism on CUDA is built for "
                 "the dense Llama family only (run it with --tensor-parallel 1, or split on the CPU)"};
  }
  // The split's errors (heads, KV heads, intermediate size) first: they
  // hold whatever the host has.
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
  ModelOptions o = options;
  o.tensor_parallel = 1;
  if (o.kv_cache_bytes > 0) o.kv_cache_bytes /= n_ranks;
  std::vector<std::unique_ptr<Model>> shards;
  for (int r = 0; r < n_ranks; ++r) {
    auto shard = create_llama_cuda_shard(files, o, CudaShard{group.get(), r});
    if (!shard.ok()) return Error{"GPU " + std::to_string(r) + ": " + shard.error().message};
    if (r == 0) {  // the others take rank 0's block count (their KV rows are as long)
      const Model& m = **shard;
      o.kv_cache_bytes =
          static_cast<int64_t>(m.n_kv_blocks()) * m.kv_block_size() * static_cast<int64_t>(m.kv_bytes_per_token());
      o.gpu_memory_fraction = 0;
    } else if ((*shard)->n_kv_blocks() != shards[0]->n_kv_blocks()) {
      return Error{path + ": GPU " + std::to_string(r) + " holds " + std::to_string((*shard)->n_kv_blocks()) +
                   " KV blocks, GPU 0 " + std::to_string(shards[0]->n_kv_blocks())};
    }
    shards.push_back(std::move(shard).value());
  }
  return std::unique_ptr<Model>(std::make_unique<TensorParallelModel>(std::move(group), std::move(shards)));
#else
  return Error{"tensor parallelism on GPUs needs a build with CUDA and NCCL (RILL_CUDA=ON where nvcc is installed)"};
#endif
}

}  // namespace rill
