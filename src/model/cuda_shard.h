#pragma once
// CudaShard: the rank of a tensor-parallel group of GPUs (parallel/
// nccl_group.h) that one CUDA model is, for create_llama_cuda_shard. The
// model then holds rank `rank`'s share of the weights and KV heads on the
// group's device `rank` (the cut is model/tensor_split.h's) and runs the
// collectives of that rank on its stream. A default CudaShard (no group) is
// the whole model on GPU 0.
//
// create_llama_cuda_tp_model (families.h) ties one shard per GPU into a
// TensorParallelModel; shards are not meant to be used alone.
#include <memory>

#include "core/result.h"
#include "loader/model_files.h"
#include "model/model.h"

namespace rill {

class NcclGroup;

struct CudaShard {
  NcclGroup* group = nullptr;  // outlives the model (TensorParallelModel owns both)
  int rank = 0;
};

// The CUDA Llama (llama_cuda.cpp) as `shard`. Errors as create_llama_cuda_model's,
// and when the heads, KV heads or intermediate size do not divide over the group.
Result<std::unique_ptr<Model>> create_llama_cuda_shard(std::shared_ptr<const ModelFiles> files,
                                                       const ModelOptions& options, const CudaShard& shard);

}  // namespace rill
