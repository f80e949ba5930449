#pragma once
// SimulatedGroup: a tensor-parallel group of N ranks inside one process on
// the CPU, each rank driven by its own thread. It exists so the sharding
// math of the model families is tested in CI (no GPU) against the
// one-device result.
//
// Determinism: every collective's result is a function of the ranks'
// inputs only, never of thread timing. all_reduce_sum folds the ranks'
// values in rank order, ((x0 + x1) + x2) + ..., element by element, and
// writes the one result into every rank's buffer, so all ranks hold the
// same bits (replicated activations stay replicated).
//
// Mechanics: a collective is a rendezvous at a barrier. Each rank posts its
// buffer and count, waits for all ranks, does its share of the work reading
// the others' posted buffers (all_reduce_sum: one contiguous chunk of the
// elements, summed and written to every rank's buffer; the chunks are
// disjoint, so no rank reads what another writes), then waits again so no
// buffer is reused while another rank still reads it. Nothing is allocated
// per collective.
#include <barrier>
#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace rill {

class SimulatedGroup final : public CommunicatorGroup {
 public:
  // n_ranks in [1, kMaxRanks].
  static constexpr int kMaxRanks = 64;
  static Result<std::unique_ptr<SimulatedGroup>> create(int n_ranks);
  ~SimulatedGroup() override;

  int size() const override { return n_ranks_; }
  Communicator& rank(int r) override;

 private:
  class Rank;
  struct Post {
    const float* send = nullptr;  // the rank's input
    float* recv = nullptr;        // the rank's output (== send for in-place collectives)
    int64_t n = 0;
    int root = 0;
    int op = 0;  // Op
  };
  enum class Op { kAllReduceSum, kAllGather, kBroadcast };
  static const char* op_name(int op);

  explicit SimulatedGroup(int n_ranks);
  // Runs one collective for rank r (called from that rank's thread).
  Status run(int r, Op op, const float* send, float* recv, int64_t n, int root);
  // Rank r's share of an all-reduce over the posted buffers.
  void reduce_chunk(int r, int64_t n);

  int n_ranks_;
  std::vector<Post> posts_;  // [n_ranks]; slot r written only by rank r, read after the barrier
  std::barrier<> barrier_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace rill
