#include "model/tensor_parallel.h"

#include <cassert>
#include <string>
#include <utility>

namespace rill {

TensorParallelModel::TensorParallelModel(std::unique_ptr<CommunicatorGroup> group,
                                         std::vector<std::unique_ptr<Model>> shards)
    : group_(std::move(group)), shards_(std::move(shards)), status_(shards_.size()) {
  assert(!shards_.empty() && group_ && group_->size() == n_ranks());
  for (int r = 1; r < n_ranks(); ++r) workers_.emplace_back([this, r] { worker(r); });
}

TensorParallelModel::~TensorParallelModel() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

size_t TensorParallelModel::kv_bytes_per_token() const {
  size_t total = 0;
  for (const auto& s : shards_) total += s->kv_bytes_per_token();
  return total;
}

void TensorParallelModel::worker(int r) {
  uint64_t seen = 0;
  for (;;) {
    const Batch* batch = nullptr;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      batch = batch_;
    }
    Status s = shards_[static_cast<size_t>(r)]->forward(*batch, nullptr);
    std::lock_guard lock(mu_);
    status_[static_cast<size_t>(r)] = std::move(s);
    if (--n_running_ == 0) done_.notify_one();
  }
}

template <typename Rank0>
Status TensorParallelModel::run_step(const Batch& batch, Rank0&& rank0) {
  {
    std::lock_guard lock(mu_);
    batch_ = &batch;
    n_running_ = n_ranks() - 1;
    ++generation_;
  }
  wake_.notify_all();
  status_[0] = rank0();
  {
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return n_running_ == 0; });
  }
  for (const Status& s : status_) {
    if (!s.ok()) return s.error();
  }
  return Status::Ok();
}

Status TensorParallelModel::forward(const Batch& batch, float* logits) {
  return run_step(batch, [&] { return shards_[0]->forward(batch, logits); });
}

Status TensorParallelModel::forward_greedy(const Batch& batch, int32_t* ids) {
  return run_step(batch, [&] { return shards_[0]->forward_greedy(batch, ids); });
}

Status TensorParallelModel::forward_sample(const Batch& batch, const DeviceSamplingParams* rows, int32_t* ids) {
  return run_step(batch, [&] { return shards_[0]->forward_sample(batch, rows, ids); });
}

Result<std::unique_ptr<Model>> create_tensor_parallel_model(std::unique_ptr<CommunicatorGroup> group,
                                                            const ModelOptions& options, const std::string& path,
                                                            const RankFactory& make_rank) {
  const int n_ranks = group->size();
  ModelOptions o = options;
  o.tensor_parallel = 1;
  if (o.kv_cache_bytes > 0) o.kv_cache_bytes /= n_ranks;
  std::vector<std::unique_ptr<Model>> ranks;
  for (int r = 0; r < n_ranks; ++r) {
    RILL_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, make_rank(r, o));
    if (r == 0) {  // the others take rank 0's block count (their KV rows are as long)
      o.kv_cache_bytes =
          static_cast<int64_t>(m->n_kv_blocks()) * m->kv_block_size() * static_cast<int64_t>(m->kv_bytes_per_token());
      o.gpu_memory_fraction = 0;
    } else if (m->n_kv_blocks() != ranks[0]->n_kv_blocks()) {
      return Error{path + ": tensor-parallel rank " + std::to_string(r) + " holds " + std::to_string(m->n_kv_blocks()) +
                   " KV blocks, rank 0 " + std::to_string(ranks[0]->n_kv_blocks())};
    }
    ranks.push_back(std::move(m));
  }
  return std::unique_ptr<Model>(std::make_unique<TensorParallelModel>(std::move(group), std::move(ranks)));
}

}  // namespace rill
