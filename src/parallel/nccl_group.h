#pragma once
// NcclGroup: a tensor-parallel group of one rank per GPU of this host,
// driven from one process (one thread per rank), over NCCL. Built with
// RILL_CUDA when NCCL is found (RILL_HAVE_NCCL); otherwise create() says so.
//
// Device semantics of the Communicator contract: buffers are device
// pointers on the rank's GPU, and a collective is enqueued on the rank's
// stream (set_stream), so it is complete for whatever that stream runs
// next, not when the call returns. Collectives enqueued while the stream is
// being captured become nodes of the CUDA graph (NCCL supports capture).
// Sums follow NCCL's own order (ring or tree, chosen by size and topology),
// fixed for a given group and count: every rank gets the same bits, and
// repeated runs agree, but the order is not SimulatedGroup's rank order.
//
// NVLink multicast (NVLS) stays off: create() sets NCCL_NVLS_ENABLE=0 in the
// environment before NCCL starts, because a program using it can take a
// shared host's GPUs out of service.
#include <memory>
#include <span>
#include <vector>

#include "parallel/communicator.h"

struct ncclComm;
struct CUstream_st;

namespace rill {

class NcclGroup final : public CommunicatorGroup {
 public:
  // One rank per entry of `devices` (CUDA device ordinals), rank r on
  // devices[r]. Errors when NCCL is absent from the build or fails to start.
  static Result<std::unique_ptr<NcclGroup>> create(std::span<const int> devices);
  ~NcclGroup() override;
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const override { return static_cast<int>(ranks_.size()); }
  Communicator& rank(int r) override;
  // The CUDA stream rank r's collectives are enqueued on (default: the
  // legacy default stream, nullptr). Set while planning, before any step.
  void set_stream(int r, CUstream_st* stream);
  int device(int r) const { return devices_[static_cast<size_t>(r)]; }

 private:
  class Rank;
  NcclGroup() = default;

  std::vector<int> devices_;
  std::vector<ncclComm*> comms_;  // owned: destroyed with the group
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace rill
