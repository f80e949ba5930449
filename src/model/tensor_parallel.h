#pragma once
// TensorParallelModel: one Model made of N rank models (shards) that run
// every step together, one thread per rank, exchanging partial results
// through their group's collectives (parallel/communicator.h). The
// scheduler sees a single model: one forward() per step, one KV block
// space (block b of every rank holds that rank's heads of the same tokens).
//
// Shards are Models with two extra duties: rank r's forward() takes part in
// the collectives of rank r of the group, and writes the full logits
// [sample_rows.size(), n_vocab] when given a buffer (ranks other than 0 are
// given none: their copy of the gathered logits stays in their scratch).
// Every shard reports the same config, limits and KV block geometry.
//
// Threads: rank 0 runs on the caller's thread; ranks 1..N-1 each on a
// worker created once and parked between steps. A step costs one wake-up
// per worker and allocates nothing.
//
// Ranks are built by create_tensor_parallel_model (below) from a device's
// rank factory: llama.cpu's over a SimulatedGroup, llama.cuda's over an
// NcclGroup, one GPU per rank.
//
// forward_greedy / forward_sample are offered when rank 0 offers them
// (the CUDA shards: rank 0 holds the gathered logits and picks on its
// device); the other ranks then run forward(batch, nullptr).
//
// KV export (the prefix cache's RAM and disk tiers) gives the rows a
// one-device model would: a token's K (or V) row of all KV heads,
// head-major. The ranks hold consecutive head ranges in rank order (split
// evenly, or each rank one head replicated over N / n_head_kv ranks), so a
// full row is the owners' slices side by side, an owner being the first
// rank of each range; an import hands every rank, replicas included, its
// heads' slice. The numerics name the group size (tp=N), since the ranks'
// reduction order differs from one device's, so a tier never resumes KV
// across a change of N.
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "parallel/communicator.h"

namespace rill {

class TensorParallelModel final : public Model {
 public:
  // Requires shards.size() == group->size() >= 1, shard r built on group->rank(r).
  TensorParallelModel(std::unique_ptr<CommunicatorGroup> group, std::vector<std::unique_ptr<Model>> shards);
  ~TensorParallelModel() override;
  TensorParallelModel(const TensorParallelModel&) = delete;
  TensorParallelModel& operator=(const TensorParallelModel&) = delete;

  int n_ranks() const { return static_cast<int>(shards_.size()); }

  const ModelConfig& config() const override { return shards_[0]->config(); }
  int64_t n_vocab() const override { return shards_[0]->n_vocab(); }
  int64_t n_ctx() const override { return shards_[0]->n_ctx(); }
  int max_batch_tokens() const override { return shards_[0]->max_batch_tokens(); }
  int max_batch_seqs() const override { return shards_[0]->max_batch_seqs(); }
  const KvSpec& kv_spec() const override { return shards_[0]->kv_spec(); }
  int32_t kv_block_size() const override { return shards_[0]->kv_block_size(); }
  int32_t n_kv_blocks() const override { return shards_[0]->n_kv_blocks(); }
  // All ranks' KV together (replicated KV heads count once per rank holding them).
  size_t kv_bytes_per_token() const override;
  // Runs the step on every rank; the first failing rank's error, else Ok.
  Status forward(const Batch& batch, float* logits) override;
  bool has_forward_greedy() const override { return shards_[0]->has_forward_greedy(); }
  Status forward_greedy(const Batch& batch, const TokenMasks& masks, int32_t* ids) override;
  bool has_forward_sample() const override { return shards_[0]->has_forward_sample(); }
  Status forward_sample(const Batch& batch, const DeviceSamplingParams* rows, const TokenMasks& masks,
                        int32_t* ids) override;

  // KV export: see above. Empty (tiers off) when a rank exports none or the
  // ranks' layers disagree.
  std::vector<KvLayer> kv_layers() const override { return layers_; }
  Status copy_kv_out(int64_t layer, int32_t block, uint8_t* k, uint8_t* v) const override;
  Status copy_kv_in(int64_t layer, int32_t block, const uint8_t* k, const uint8_t* v) override;
  Status copy_kv_blocks_out(int64_t layer, std::span<const int32_t> blocks, size_t block_bytes, uint8_t* k,
                            uint8_t* v) const override;
  Status copy_kv_blocks_in(int64_t layer, std::span<const int32_t> blocks, size_t block_bytes, const uint8_t* k,
                           const uint8_t* v) override;
  // Rank 0's numerics plus " tp=N" (unless the rank names it already).
  std::string kv_numerics() const override;

 private:
  void worker(int r);
  // Fills layers_ and slices_ from the ranks' KV layers.
  void plan_kv_export();
  // One rank's part of a full KV row of layer `layer`.
  struct Slice {
    int rank = 0;
    size_t offset = 0;   // bytes into the full row
    size_t bytes = 0;    // the rank's row
    bool owner = false;  // the first rank holding these heads: exports them
  };
  const std::vector<Slice>& slices(int64_t layer) const { return slices_[static_cast<size_t>(layer)]; }
  // Posts the step to the workers (forward(batch, nullptr) on ranks
  // 1..N-1), runs rank0() here, waits for the workers.
  template <typename Rank0>
  Status run_step(const Batch& batch, Rank0&& rank0);

  std::unique_ptr<CommunicatorGroup> group_;  // destroyed after the shards that use it
  std::vector<std::unique_ptr<Model>> shards_;
  std::vector<Status> status_;               // [n_ranks]: the last step's result per rank
  std::vector<KvLayer> layers_;              // the full rows' layers (empty: no export)
  std::vector<std::vector<Slice>> slices_;   // [layer][rank]
  mutable std::vector<uint8_t> kv_scratch_;  // one rank's K and V of an export or import

  // The step handed to the workers: generation_ counts steps posted,
  // n_running_ the workers not yet done with the current one.
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const Batch* batch_ = nullptr;
  uint64_t generation_ = 0;
  int n_running_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;  // ranks 1..N-1
};

// Rank `rank` of a group as a model, built with `options`; the factory
// knows the group (captured) and names the rank in its errors as it likes.
using RankFactory = std::function<Result<std::unique_ptr<Model>>(int rank, const ModelOptions& options)>;

// The one tensor-parallel factory of every device: ranks 0..N-1 of `group`
// from make_rank, in order, tied into a TensorParallelModel. Each rank gets
// `options` with tensor_parallel 1 and kv_cache_bytes (the whole model's
// budget) split evenly; every rank after 0 is then given rank 0's KV block
// count (as exact bytes, gpu_memory_fraction 0), since the engine sees one
// block space. Errors: the first failing rank's, or (naming `path`, the
// model) a rank whose block count still differs from rank 0's.
Result<std::unique_ptr<Model>> create_tensor_parallel_model(std::unique_ptr<CommunicatorGroup> group,
                                                            const ModelOptions& options, const std::string& path,
                                                            const RankFactory& make_rank);

}  // namespace rill
