#include "parallel/simulated_group.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <string>

namespace rill {

class SimulatedGroup::Rank final : public Communicator {
 public:
  Rank(SimulatedGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.n_ranks_; }
  Status all_reduce_sum(float* data, int64_t n) override {
    return group_.run(rank_, Op::kAllReduceSum, data, data, n, 0);
  }
  Status all_gather(const float* send, int64_t n, float* recv) override {
    return group_.run(rank_, Op::kAllGather, send, recv, n, 0);
  }
  Status broadcast(float* data, int64_t n, int root) override {
    return group_.run(rank_, Op::kBroadcast, data, data, n, root);
  }

 private:
  SimulatedGroup& group_;
  int rank_;
};

Result<std::unique_ptr<SimulatedGroup>> SimulatedGroup::create(int n_ranks) {
  if (n_ranks < 1 || n_ranks > kMaxRanks) {
    return Error{"simulated tensor-parallel group: " + std::to_string(n_ranks) + " ranks (expected 1 to " +
                 std::to_string(kMaxRanks) + ")"};
  }
  return std::unique_ptr<SimulatedGroup>(new SimulatedGroup(n_ranks));
}

SimulatedGroup::SimulatedGroup(int n_ranks)
    : n_ranks_(n_ranks), posts_(static_cast<size_t>(n_ranks)), barrier_(n_ranks) {
  for (int r = 0; r < n_ranks; ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
}

SimulatedGroup::~SimulatedGroup() = default;

const char* SimulatedGroup::op_name(int op) {
  switch (static_cast<Op>(op)) {
    case Op::kAllReduceSum:
      return "all_reduce_sum";
    case Op::kAllGather:
      return "all_gather";
    case Op::kBroadcast:
      return "broadcast";
  }
  return "?";
}

Communicator& SimulatedGroup::rank(int r) {
  assert(r >= 0 && r < n_ranks_);
  return *ranks_[static_cast<size_t>(r)];
}

void SimulatedGroup::reduce_chunk(int r, int64_t n) {
  // Rank r sums elements [begin, end): contiguous, disjoint across ranks.
  const int64_t per_rank = (n + n_ranks_ - 1) / n_ranks_;
  const int64_t begin = std::min(n, r * per_rank), end = std::min(n, begin + per_rank);
  for (int64_t i = begin; i < end; ++i) {
    float sum = posts_[0].send[i];
    for (int q = 1; q < n_ranks_; ++q) sum += posts_[static_cast<size_t>(q)].send[i];
    for (int q = 0; q < n_ranks_; ++q) posts_[static_cast<size_t>(q)].recv[i] = sum;
  }
}

Status SimulatedGroup::run(int r, Op op, const float* send, float* recv, int64_t n, int root) {
  posts_[static_cast<size_t>(r)] = {send, recv, n, root, static_cast<int>(op)};
  barrier_.arrive_and_wait();
  // Every rank checks the same posts, so all agree on whether to proceed.
  const Post& first = posts_[0];
  bool consistent = first.n >= 0 && first.root >= 0 && first.root < n_ranks_;
  for (const Post& p : posts_) consistent = consistent && p.n == first.n && p.op == first.op && p.root == first.root;
  if (consistent) {
    switch (op) {
      case Op::kAllReduceSum:
        reduce_chunk(r, n);
        break;
      case Op::kAllGather:
        for (int q = 0; q < n_ranks_; ++q) {
          std::memcpy(recv + q * n, posts_[static_cast<size_t>(q)].send, static_cast<size_t>(n) * sizeof(float));
        }
        break;
      case Op::kBroadcast:
        if (r != root)
          std::memcpy(recv, posts_[static_cast<size_t>(root)].send, static_cast<size_t>(n) * sizeof(float));
        break;
    }
  }
  std::string mismatch;  // built before the second barrier: later, ranks may post again
  if (!consistent) {
    for (const Post& p : posts_) {
      mismatch += (mismatch.empty() ? "" : ", ") + std::string(op_name(p.op)) + "(n=" + std::to_string(p.n) +
                  ", root=" + std::to_string(p.root) + ")";
    }
  }
  // No rank returns (and reuses its buffer) while another still reads it.
  barrier_.arrive_and_wait();
  if (!consistent) {
    return Error{"simulated tensor-parallel group: the ranks' collectives disagree: " + mismatch};
  }
  return Status::Ok();
}

}  // namespace rill
