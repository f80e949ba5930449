#include "parallel/nccl_group.h"

#include <cassert>
#include <cstdlib>
#include <string>

#if RILL_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace rill {

#if RILL_HAVE_NCCL
namespace {

Status nccl_status(ncclResult_t r, const char* what, int rank) {
  if (r == ncclSuccess) return Status::Ok();
  return Error{std::string("NCCL ") + what + " on rank " + std::to_string(rank) + ": " + ncclGetErrorString(r)};
}

}  // namespace

class NcclGroup::Rank final : public Communicator {
 public:
  Rank(ncclComm* comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status all_reduce_sum(float* data, int64_t n) override {
    return nccl_status(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat32, ncclSum, comm_, stream_),
                       "all_reduce_sum", rank_);
  }
  Status all_gather(const float* send, int64_t n, float* recv) override {
    return nccl_status(ncclAllGather(send, recv, static_cast<size_t>(n), ncclFloat32, comm_, stream_), "all_gather",
                       rank_);
  }
  Status broadcast(float* data, int64_t n, int root) override {
    return nccl_status(ncclBroadcast(data, data, static_cast<size_t>(n), ncclFloat32, root, comm_, stream_),
                       "broadcast", rank_);
  }
  void set_stream(cudaStream_t s) { stream_ = s; }

 private:
  ncclComm* comm_;
  int rank_, size_;
  cudaStream_t stream_ = nullptr;
};

Result<std::unique_ptr<NcclGroup>> NcclGroup::create(std::span<const int> devices) {
  if (devices.empty()) return Error{"NCCL group: no devices"};
  int n_devices = 0;
  if (cudaGetDeviceCount(&n_devices) != cudaSuccess) n_devices = 0;
  for (int d : devices) {
    if (d < 0 || d >= n_devices) {
      return Error{"NCCL group: device " + std::to_string(d) + " does not exist (this host has " +
                   std::to_string(n_devices) + " CUDA devices)"};
    }
  }
  // Before NCCL reads its environment (at its first initialisation).
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
  std::unique_ptr<NcclGroup> g(new NcclGroup());
  g->devices_.assign(devices.begin(), devices.end());
  g->comms_.assign(devices.size(), nullptr);
  RILL_TRY(nccl_status(ncclCommInitAll(g->comms_.data(), static_cast<int>(devices.size()), g->devices_.data()),
                       "ncclCommInitAll", 0));
  for (size_t r = 0; r < devices.size(); ++r) {
    g->ranks_.push_back(std::make_unique<Rank>(g->comms_[r], static_cast<int>(r), static_cast<int>(devices.size())));
  }
  return g;
}

NcclGroup::~NcclGroup() {
  for (ncclComm* c : comms_) {
    if (c) ncclCommDestroy(c);
  }
}

void NcclGroup::set_stream(int r, CUstream_st* stream) {
  ranks_[static_cast<size_t>(r)]->set_stream(stream);
}

#else  // no NCCL in this build

class NcclGroup::Rank final : public Communicator {};  // never instantiated

Result<std::unique_ptr<NcclGroup>> NcclGroup::create(std::span<const int>) {
  return Error{"tensor parallelism on GPUs needs a build with CUDA and NCCL (RILL_CUDA=ON, nccl.h and libnccl found)"};
}

NcclGroup::~NcclGroup() = default;

void NcclGroup::set_stream(int, CUstream_st*) {}

#endif

Communicator& NcclGroup::rank(int r) {
  assert(r >= 0 && r < size());
  return *ranks_[static_cast<size_t>(r)];
}

}  // namespace rill
