#pragma once
// The CUDA device as rill uses it: one stream, one cuBLASLt handle with its
// workspace, RAII device and pinned host buffers, and a bump arena for
// activations. Everything here is created while planning (model load);
// nothing in the per-step path allocates device memory.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/result.h"

typedef struct cublasLtContext* cublasLtHandle_t;

namespace rill::cuda {

// "file.cpp:123: cudaMalloc: out of memory" style text for a failed call.
std::string cuda_error_text(cudaError_t e, const char* what);

// Whether a CUDA device can be used here (driver present, >= 1 device).
bool device_available();

// Aborts with a message when a CUDA call fails where no Result can carry it
// (kernel launches inside a step; those only fail on programming errors or a
// lost device).
void check_or_die(cudaError_t e, const char* what, const char* file, int line);
#define RILL_CUDA_CHECK(expr) ::rill::cuda::check_or_die((expr), #expr, __FILE__, __LINE__)
#define RILL_CUDA_CHECK_LAUNCH() ::rill::cuda::check_or_die(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// Programmatic dependent launch (Hopper): kernels that allow it are launched
// while their predecessor drains, do the work that reads nothing the
// predecessor writes (weight prefetch), then wait for it (pdl_wait in
// device_math.cuh). Always on: it saved 0.16 ms a step at batch 1 and cost
// nothing at 64 (H200, 26cac1b, docs/perf.md), so the switch that turned it
// off for that comparison (RILL_CUDA_PDL) is gone.

// Owns one cudaMalloc'd region.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Errors name `what` and the size, and say how much memory was free.
  static Result<DeviceBuffer> allocate(size_t bytes, const std::string& what);
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Owns one cudaMallocHost'd (pinned) region: staging for uploads/readbacks.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static Result<PinnedBuffer> allocate(size_t bytes, const std::string& what);
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Carves aligned sub-buffers out of one DeviceBuffer. Two passes: a sizing
// pass (base == nullptr) that only counts, then the real one over a buffer
// of the counted size, so the layout is computed in one place.
class Arena {
 public:
  explicit Arena(void* base = nullptr) : base_(static_cast<uint8_t*>(base)) {}
  static constexpr size_t kAlign = 256;
  template <typename T>
  T* take(size_t count) {
    const size_t at = (used_ + kAlign - 1) / kAlign * kAlign;
    used_ = at + count * sizeof(T);
    return base_ ? reinterpret_cast<T*>(base_ + at) : nullptr;
  }
  size_t used() const { return used_; }

 private:
  uint8_t* base_ = nullptr;
  size_t used_ = 0;
};

// One device, one stream, one cuBLASLt handle (+ workspace).
class Context {
 public:
  static Result<std::unique_ptr<Context>> create(int device = 0);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasLtHandle_t blas() const { return blas_; }
  void* workspace() const { return workspace_.data(); }
  size_t workspace_bytes() const { return workspace_.size(); }
  const cudaDeviceProp& props() const { return props_; }
  std::string describe() const;  // "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"

  // Bytes free and total on the device now.
  void mem_info(size_t* free_bytes, size_t* total_bytes) const;
  // Waits for the stream; a failure here is a lost device or a kernel fault.
  Status synchronize() const;

 private:
  Context() = default;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t blas_ = nullptr;
  DeviceBuffer workspace_;
  cudaDeviceProp props_{};
};

}  // namespace rill::cuda
