#pragma once
// What the CUDA backend stores as KV, in words, for the refusals that name
// it (the registry's and CudaModelBase::choose_kv_type's). Host-only (no
// CUDA headers): the registry builds it without CUDA too.
#include <string>

namespace rill::cuda {

inline std::string kv_types_cuda_stores() {
  return "CUDA stores f16 KV, f32 for f32 checkpoints, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q8_0h, q4_0h, iq4_nlh, "
         "q8_0h64, iq4_nlh64 or fp8";
}

}  // namespace rill::cuda
