#pragma once
// CudaShard: the rank of a tensor-parallel group of GPUs (parallel/
// nccl_group.h) that one CUDA model (a CudaModelBase) is. The model then
// holds rank `rank`'s share of the weights and KV heads on the group's
// device `rank` (the cut is model/tensor_split.h's) and runs the
// collectives of that rank on its stream. A default CudaShard (no group) is
// the whole model on GPU 0.
//
// llama.cuda's factory (arch/llama.cpp) ties one shard per GPU into a
// TensorParallelModel (model/tensor_parallel.h's create_tensor_parallel_model);
// shards are not meant to be used alone.
namespace rill {

class NcclGroup;

struct CudaShard {
  NcclGroup* group = nullptr;  // outlives the model (TensorParallelModel owns both)
  int rank = 0;
};

}  // namespace rill
