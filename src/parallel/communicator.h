#pragma once
// Communicator: one rank's handle on the collectives of a tensor-parallel
// group (NCCL on CUDA, SimulatedGroup on the CPU for tests).
//
// Contract shared by every implementation (it is NCCL's): every rank of the
// group calls the same collectives in the same order with the same counts;
// a rank's output is complete for the rank's next work (on the CPU when the
// call returns; on a GPU in the order of the rank's stream). A rank
// that skips a collective stalls the others: the model code keeps every
// rank's sequence of calls identical by running the same step on all of them.
// Buffers are addressable by the rank's device (host memory for the CPU).
//
// Collectives are called once per layer per step, never per token; the
// virtual call is cheap next to the data they move.
#include <cstdint>

#include "core/result.h"

namespace rill {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[i] = sum over ranks r = 0, 1, ..., size-1 of rank r's data[i], the
  // same bits on every rank. data: [n] floats, in place.
  virtual Status all_reduce_sum(float* data, int64_t n) = 0;
  // recv[r * n + i] = rank r's send[i]. send: [n], recv: [size * n]; send
  // and recv must not overlap.
  virtual Status all_gather(const float* send, int64_t n, float* recv) = 0;
  // Every rank's data becomes rank `root`'s data. data: [n], in place.
  virtual Status broadcast(float* data, int64_t n, int root) = 0;
};

// The communicators of all ranks of one group, owned together (one process
// drives every rank). Destroying the group ends its communicators: destroy
// it only after every rank has returned from its last collective.
class CommunicatorGroup {
 public:
  virtual ~CommunicatorGroup() = default;
  virtual int size() const = 0;
  // Rank r's communicator, 0 <= r < size(); valid while the group lives.
  virtual Communicator& rank(int r) = 0;
};

}  // namespace rill
