#pragma once
// SmemOptIn: a kernel's opt-in to more than 48 KB of dynamic shared memory
// (cudaFuncSetAttribute), made once per device. The attribute is per
// device, and a tensor-parallel process launches the same kernels on
// several GPUs (llama.cuda's tensor parallelism): a process-wide "done" flag
// left the second GPU's launches failing with cudaErrorInvalidValue.
// One static SmemOptIn per kernel; ensure() costs a cudaGetDevice and an
// atomic load after the first call on a device, and may run on several
// threads at once (setting the attribute twice is harmless).
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_context.h"

namespace rill::cuda {

class SmemOptIn {
 public:
  // max_shared: also ask for the largest shared-memory carveout (a kernel
  // that fits two blocks per SM only there).
  void ensure(const void* kernel, size_t bytes, bool max_shared = false) {
    int device = 0;
    RILL_CUDA_CHECK(cudaGetDevice(&device));
    const uint64_t bit = uint64_t{1} << (device & 63);
    if (done_.load(std::memory_order_acquire) & bit) return;
    RILL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    if (max_shared) {
      RILL_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    }
    done_.fetch_or(bit, std::memory_order_release);
  }

 private:
  std::atomic<uint64_t> done_{0};
};

}  // namespace rill::cuda
