#include "model/tensor_parallel.h"

#include <cassert>
#include <cstring>
#include <string>
#include <utility>

namespace rill {

TensorParallelModel::TensorParallelModel(std::unique_ptr<CommunicatorGroup> group,
                                         std::vector<std::unique_ptr<Model>> shards)
    : group_(std::move(group)), shards_(std::move(shards)), status_(shards_.size()) {
  assert(!shards_.empty() && group_ && group_->size() == n_ranks());
  for (int r = 1; r < n_ranks(); ++r) workers_.emplace_back([this, r] { worker(r); });
  plan_kv_export();
}

void TensorParallelModel::plan_kv_export() {
  const ModelConfig& cfg = config();
  const int64_t n_kv = cfg.n_head_kv > 0 ? cfg.n_head_kv : cfg.n_head;
  const int n = n_ranks();
  // tensor_split.h: more ranks than KV heads replicate each head over n / n_kv ranks.
  const int replicas = n > n_kv && n_kv > 0 ? static_cast<int>(n / n_kv) : 1;
  std::vector<std::vector<KvLayer>> per_rank;
  for (const auto& s : shards_) per_rank.push_back(s->kv_layers());
  const std::vector<KvLayer>& first = per_rank[0];
  for (const auto& layers : per_rank) {
    if (layers.empty() || layers.size() != first.size()) return;
    for (size_t l = 0; l < layers.size(); ++l) {
      if (layers[l].group != first[l].group || layers[l].dtype != first[l].dtype ||
          layers[l].row_bytes != first[l].row_bytes || layers[l].v_row_bytes != first[l].v_row_bytes)
        return;
    }
  }
  layers_ = first;
  slices_.assign(first.size(), {});
  for (size_t l = 0; l < first.size(); ++l) {
    size_t row = 0, v_row = 0;
    for (int r = 0; r < n; ++r) {
      Slice sl;
      sl.rank = r;
      sl.bytes = first[l].row_bytes;
      sl.owner = r % replicas == 0;
      sl.offset = sl.owner ? row : slices_[l][static_cast<size_t>(r - r % replicas)].offset;
      if (sl.owner) row += sl.bytes;
      if (sl.owner) v_row += first[l].v_row_bytes;
      slices_[l].push_back(sl);
    }
    layers_[l].row_bytes = row;
    // V in another type than K (model/kv_types.h): its one-device row, for
    // the tiers to refuse the layer (the copies below move K-sized slices).
    layers_[l].v_row_bytes = v_row;
  }
}

std::string TensorParallelModel::kv_numerics() const {
  std::string s = shards_[0]->kv_numerics();
  const std::string tp = "tp=" + std::to_string(n_ranks());
  if (s.find(tp) == std::string::npos) s += " " + tp;
  return s;
}

Status TensorParallelModel::copy_kv_out(int64_t layer, int32_t block, uint8_t* k, uint8_t* v) const {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) return Error{"this model does not export its KV"};
  const size_t block_bytes = static_cast<size_t>(kv_block_size()) * layers_[static_cast<size_t>(layer)].row_bytes;
  return copy_kv_blocks_out(layer, std::span<const int32_t>(&block, 1), block_bytes, k, v);
}

Status TensorParallelModel::copy_kv_in(int64_t layer, int32_t block, const uint8_t* k, const uint8_t* v) {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) return Error{"this model does not import KV"};
  const size_t block_bytes = static_cast<size_t>(kv_block_size()) * layers_[static_cast<size_t>(layer)].row_bytes;
  return copy_kv_blocks_in(layer, std::span<const int32_t>(&block, 1), block_bytes, k, v);
}

namespace {
// `rows` rows of `bytes` each, strided by from_stride at `from` and by to_stride at `to`.
void copy_rows(uint8_t* to, size_t to_stride, const uint8_t* from, size_t from_stride, size_t bytes, size_t rows) {
  for (size_t i = 0; i < rows; ++i) std::memcpy(to + i * to_stride, from + i * from_stride, bytes);
}
}  // namespace

Status TensorParallelModel::copy_kv_blocks_out(int64_t layer, std::span<const int32_t> blocks, size_t block_bytes,
                                               uint8_t* k, uint8_t* v) const {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) return Error{"this model does not export its KV"};
  const size_t row = layers_[static_cast<size_t>(layer)].row_bytes;
  const size_t bs = static_cast<size_t>(kv_block_size());
  if (block_bytes != bs * row) return Error{"KV export: block_bytes does not match the layer's rows"};
  if (layers_[static_cast<size_t>(layer)].v_row_bytes != 0) {
    return Error{"KV export: the layer stores K and V in different types"};
  }
  const size_t rows = blocks.size() * bs;
  for (const Slice& sl : slices(layer)) {
    if (!sl.owner) continue;
    kv_scratch_.resize(2 * rows * sl.bytes);
    uint8_t* sk = kv_scratch_.data();
    uint8_t* sv = sk + rows * sl.bytes;
    RILL_TRY(shards_[static_cast<size_t>(sl.rank)]->copy_kv_blocks_out(layer, blocks, bs * sl.bytes, sk, sv));
    copy_rows(k + sl.offset, row, sk, sl.bytes, sl.bytes, rows);
    copy_rows(v + sl.offset, row, sv, sl.bytes, sl.bytes, rows);
  }
  return {};
}

Status TensorParallelModel::copy_kv_blocks_in(int64_t layer, std::span<const int32_t> blocks, size_t block_bytes,
                                              const uint8_t* k, const uint8_t* v) {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) return Error{"this model does not import KV"};
  const size_t row = layers_[static_cast<size_t>(layer)].row_bytes;
  const size_t bs = static_cast<size_t>(kv_block_size());
  if (block_bytes != bs * row) return Error{"KV import: block_bytes does not match the layer's rows"};
  if (layers_[static_cast<size_t>(layer)].v_row_bytes != 0) {
    return Error{"KV import: the layer stores K and V in different types"};
  }
  const size_t rows = blocks.size() * bs;
  for (const Slice& sl : slices(layer)) {  // replicas too: every rank attends with its heads
    kv_scratch_.resize(2 * rows * sl.bytes);
    uint8_t* sk = kv_scratch_.data();
    uint8_t* sv = sk + rows * sl.bytes;
    copy_rows(sk, sl.bytes, k + sl.offset, row, sl.bytes, rows);
    copy_rows(sv, sl.bytes, v + sl.offset, row, sl.bytes, rows);
    RILL_TRY(shards_[static_cast<size_t>(sl.rank)]->copy_kv_blocks_in(layer, blocks, bs * sl.bytes, sk, sv));
  }
  return {};
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

Status TensorParallelModel::forward_greedy(const Batch& batch, const TokenMasks& masks, int32_t* ids) {
  return run_step(batch, [&] { return shards_[0]->forward_greedy(batch, masks, ids); });
}

Status TensorParallelModel::forward_sample(const Batch& batch, const DeviceSamplingParams* rows,
                                           const TokenMasks& masks, int32_t* ids) {
  return run_step(batch, [&] { return shards_[0]->forward_sample(batch, rows, masks, ids); });
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
