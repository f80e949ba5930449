#include "backend/cuda/cuda_context.h"

#include <cublasLt.h>

#include <cstdio>
#include <cstdlib>

namespace rill::cuda {
namespace {

constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;  // cuBLASLt split-K / stream-K scratch

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / double(1 << 30));
  return buf;
}

}  // namespace

std::string cuda_error_text(cudaError_t e, const char* what) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

bool device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return false;
  }
  return n > 0;
}

void check_or_die(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "rill: CUDA error at %s:%d: %s\n", file, line, cuda_error_text(e, what).c_str());
  std::abort();
}

Result<DeviceBuffer> DeviceBuffer::allocate(size_t bytes, const std::string& what) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  if (cudaError_t e = cudaMalloc(&b.ptr_, bytes); e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return Error{"CUDA: not enough device memory for " + what + ": " + gib(bytes) + " requested, " + gib(free_b) +
                 " free of " + gib(total_b) + " (" + cudaGetErrorString(e) + ")"};
  }
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

Result<PinnedBuffer> PinnedBuffer::allocate(size_t bytes, const std::string& what) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  if (cudaError_t e = cudaMallocHost(&b.ptr_, bytes); e != cudaSuccess) {
    cudaGetLastError();
    return Error{"CUDA: cannot pin " + gib(bytes) + " of host memory for " + what + " (" + cudaGetErrorString(e) + ")"};
  }
  b.bytes_ = bytes;
  return b;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFreeHost(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_) cudaFreeHost(ptr_);
}

Result<std::unique_ptr<Context>> Context::create(int device) {
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess || n == 0) {
    cudaGetLastError();
    return Error{"CUDA: no usable device (" + std::string(e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") +
                 ")"};
  }
  if (device < 0 || device >= n) {
    return Error{"CUDA: device " + std::to_string(device) + " does not exist (" + std::to_string(n) + " present)"};
  }
  std::unique_ptr<Context> c(new Context());
  c->device_ = device;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return Error{cuda_error_text(e, "cudaSetDevice")};
  if (cudaError_t e = cudaGetDeviceProperties(&c->props_, device); e != cudaSuccess) {
    return Error{cuda_error_text(e, "cudaGetDeviceProperties")};
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking); e != cudaSuccess) {
    return Error{cuda_error_text(e, "cudaStreamCreate")};
  }
  if (cublasStatus_t s = cublasLtCreate(&c->blas_); s != CUBLAS_STATUS_SUCCESS) {
    return Error{std::string("CUDA: cublasLtCreate failed: ") + cublasLtGetStatusString(s)};
  }
  RILL_ASSIGN_OR_RETURN(c->workspace_, DeviceBuffer::allocate(kBlasWorkspaceBytes, "the cuBLASLt workspace"));
  return c;
}

Context::~Context() {
  if (blas_) cublasLtDestroy(blas_);
  if (stream_) cudaStreamDestroy(stream_);
}

std::string Context::describe() const {
  return std::string(props_.name) + " (sm_" + std::to_string(props_.major) + std::to_string(props_.minor) + ", " +
         std::to_string(props_.multiProcessorCount) + " SMs, " + gib(props_.totalGlobalMem) + ")";
}

void Context::mem_info(size_t* free_bytes, size_t* total_bytes) const {
  if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) {
    cudaGetLastError();
    *free_bytes = *total_bytes = 0;
  }
}

Status Context::synchronize() const {
  if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
    return Error{cuda_error_text(e, "CUDA stream")};
  }
  return Status::Ok();
}

}  // namespace rill::cuda
