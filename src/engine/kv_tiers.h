#pragma once
// KvTiers: the prefix cache's host-RAM and disk tiers under the device
// prefix tree (ARCHITECTURE.md, "Prefix cache").
//
//  - Spill: when the block pool evicts a cached block, the prefix tree hands
//    over the chain root -> that block (spill hook). Unless a tier already
//    holds that chain, its KV is copied out of the model into a run (KvRun)
//    that goes to the RAM tier; runs the RAM tier evicts go to the disk tier
//    (or straight to disk without a RAM tier). A chain is stored from its
//    root, so one run serves every prompt that shares a prefix of it that
//    the run can resume at (below). The RAM tier's runs live in its
//    pre-faulted arena: the spill makes room first, then copies once.
//  - Restore: before a request is scheduled, the longest prefix of its
//    prompt that a tier holds beyond what the device cache matches is copied
//    into fresh device blocks and inserted into the prefix tree; admission
//    then matches it like any cached prefix (and reports it as cached
//    tokens). If the pool has no room the prompt is simply computed.
//  - Persist: a finished warm-up request's prefix is written to disk now.
//  - Write-behind: a finished request's computed prefix (prompt and output,
//    whole blocks, at least write_behind_min_tokens) is copied out of the
//    device cache and queued for the disk tier's writer, unless the tier
//    (or its queue) already holds that chain, so a restarted server finds
//    ordinary traffic on disk, not only evicted blocks and warm-ups. The
//    queue is bounded (kMaxWriteBehindBytes): a run that does not fit is
//    dropped (counted) before anything is copied, and never waits.
//
// Layer groups: a run is keyed by the request-level namespace and holds
// every attention group's blocks of the chain (per KV layer, its group's
// blocks). The tree caches each group under KvManager::group_ns(ns, g); a
// spill of any group's chain stores the prefix that every group's chain
// covers, and a restore puts every group's blocks back so admission's
// common match covers them.
//
// Sliding groups: a run of n blocks keeps only blocks [first_needed_block
// (model/kv_spec.h), n) of a sliding group: what resuming at n reads. So it
// can resume a prompt only at depths where it holds what that resume reads
// (KvRun::min_resume_blocks; the tiers index only those), and a restore
// inserts the blocks it lacks as hollow tree nodes (PrefixTree), before the
// window of the restored prefix, which admission never resumes into. A
// chain with hollow nodes is stored only as deep as its kept blocks exist.
//
// Hybrid models (one recurrent group): a run ends at a block boundary whose
// recurrent-state checkpoint (StatePool, keyed by the key group's block, as
// KvManager keys them) exists, and holds that state (kind "recurrent" in the
// file). A restore installs it as the checkpoint of the restored last block,
// so admission resumes the recurrence there. Such a run serves only prompts
// that extend its whole prefix (there is no state at its inner boundaries).
//
// Everything runs on the engine thread, except writing spilled runs to disk:
// a DiskWriter thread does that off the request's path, and poll() (the
// engine calls it every loop) indexes the finished files. A warm-up's
// persist() writes synchronously (its request reports what was written).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "kv/block_pool.h"
#include "kv/disk_tier.h"
#include "kv/disk_writer.h"
#include "kv/prefix_tree.h"
#include "kv/ram_tier.h"
#include "kv/state_pool.h"
#include "model/model.h"

namespace rill {

struct KvTierConfig {
  int64_t ram_bytes = 0;    // 0: no RAM tier
  std::string disk_dir;     // empty: no disk tier
  int64_t disk_bytes = 0;   // cap of the disk tier
  bool verify = false;      // --kv-verify: check every disk file's tensor hashes at open (loads always do)
  KvFileIdentity identity;  // model, config, tokenizer (ns per run)
  int64_t write_behind_min_tokens = 256;  // write-behind of finished requests; <= 0: off
};

class KvTiers {
 public:
  // Opens the configured tiers and installs the spill hook on `tree`.
  // states: the engine's state pool (required for models with recurrent
  // layers, which also need checkpoint slots and state export).
  static Result<std::unique_ptr<KvTiers>> open(const KvTierConfig& config, Model& model, BlockPool& pool,
                                               PrefixTree& tree, StatePool* states);
  ~KvTiers();

  // The spill hook (see PrefixTree::SpillHook); group_ns is a group's
  // namespace (KvManager::group_ns) of a request namespace seen before by
  // restore() or persist().
  void spill(uint64_t group_ns, std::span<const int32_t> tokens, std::span<const int32_t> blocks);
  // Loads the longest tier-held prefix of prompt (all but its last token)
  // beyond the device match (of every group) into the device cache; returns
  // the tokens loaded (0 on a miss or without room). ns: the request's
  // namespace.
  int32_t restore(uint64_t ns, std::span<const int32_t> prompt);
  // Writes the device-cached chain (of every group) that prefixes `tokens`
  // to the disk tier. Errors: no disk tier, nothing cached, a write failure.
  Result<int32_t> persist(uint64_t ns, std::span<const int32_t> tokens);

  // Write-behind (engine thread): queues the device-cached chain prefixing
  // `tokens` (every token's KV computed) for the disk tier. Returns the
  // tokens queued: 0 without a disk tier, below the minimum, already held
  // on disk or queued, or dropped because the queue is full.
  int32_t write_behind(uint64_t ns, std::span<const int32_t> tokens);
  // Indexes the disk writes finished since the last call (engine thread).
  void poll();
  // Any thread, for shutdown: DiskWriter::close(deadline): waits until the
  // queued disk writes are on disk or the deadline passes, then drops the
  // rest and everything queued later. Returns the runs dropped at the
  // deadline; 0 without a disk tier.
  int64_t close_disk_queue(std::chrono::steady_clock::time_point deadline);
  // The disk writer's counters (0 without a disk tier); any thread.
  int64_t disk_queue_depth() const { return writer_ ? writer_->queue_depth() : 0; }
  int64_t disk_written() const { return writer_ ? writer_->n_written() : 0; }
  int64_t disk_dropped() const { return (writer_ ? writer_->n_dropped() : 0) + write_behind_dropped_; }
  int64_t write_behind_queued() const { return write_behind_queued_; }

  const RamTier* ram() const { return ram_.get(); }
  const DiskTier* disk() const { return disk_.get(); }
  int64_t restored_tokens() const { return restored_tokens_; }
  int64_t spill_errors() const { return spill_errors_; }
  const std::string& last_error() const { return last_error_; }

 private:
  KvTiers(Model& model, BlockPool& pool, PrefixTree& tree) : model_(model), pool_(pool), tree_(tree) {}
  // Copies the KV of blocks[g][0, keys.size()) of every attention group g
  // out of the model into a new run, and (hybrid models) the recurrent
  // state of checkpoint slot `checkpoint`.
  // The run's bytes go into `memory` when it holds them (else a mapping of
  // its own).
  Result<KvRunPtr> build_run(uint64_t ns, std::span<const int32_t> tokens,
                             const std::vector<std::vector<int32_t>>& blocks, std::vector<uint64_t> keys,
                             int32_t checkpoint = -1, HostBytes memory = HostBytes()) const;
  // Bytes of a run of n_blocks (with the recurrent state: with_state).
  size_t run_bytes(int32_t n_blocks, bool with_state) const;
  // Layer l's V row bytes and type (K's where V is stored as K).
  static size_t v_row(const Model::KvLayer& l) { return l.v_row_bytes ? l.v_row_bytes : l.row_bytes; }
  static DType v_dtype(const Model::KvLayer& l) { return l.v_row_bytes ? l.v_dtype : l.dtype; }
  // Model::copy_kv_blocks_* of layer l's blocks `ids` to / from k and v,
  // each tensor its own side's block bytes apart.
  Status copy_blocks_out(size_t l, std::span<const int32_t> ids, uint8_t* k, uint8_t* v) const;
  Status copy_blocks_in(size_t l, std::span<const int32_t> ids, const uint8_t* k, const uint8_t* v);
  // The first block of `group` a run of n_blocks keeps (and a resume at
  // n_blocks reads): first_needed_block (model/kv_spec.h).
  int32_t first_kept(int32_t group, int32_t n_blocks) const;
  // The deepest n' <= n at which every group's chain `ids` (-1: a hollow
  // node, no KV) holds the blocks a run of n' keeps.
  size_t deepest_storable(const std::vector<std::vector<int32_t>>& ids, size_t n) const;
  // deepest_storable, and for hybrid models also ending at a checkpoint
  // (*checkpoint: its slot, else -1).
  size_t storable_prefix(std::vector<std::vector<int32_t>>& ids, size_t n, int32_t* checkpoint) const;
  // Hybrid models: shortens *n_blocks to the deepest boundary of the key
  // group's chain `key_blocks` that has a checkpoint; returns its slot, -1
  // when there is none (then *n_blocks is 0).
  int32_t trim_to_checkpoint(std::span<const int32_t> key_blocks, size_t* n_blocks) const;
  bool hybrid() const { return !state_layers_.empty(); }
  size_t state_layer_bytes(size_t layer) const;
  // Remembers which request namespace and group each group namespace is.
  void learn_ns(uint64_t ns);
  // Each attention group's device match of `tokens` (leases held).
  std::vector<PrefixMatch> match_groups(uint64_t ns, std::span<const int32_t> tokens);
  // What of `tokens` the device cache holds that a run can store: the
  // matches (leases held until the run is built), each group's block ids,
  // the storable block count (storable_prefix) and its checkpoint slot.
  struct DevicePrefix {
    std::vector<PrefixMatch> matches;
    std::vector<std::vector<int32_t>> ids;
    size_t n_blocks = 0;
    int32_t checkpoint = -1;
  };
  DevicePrefix device_prefix(uint64_t ns, std::span<const int32_t> tokens);
  bool run_fits_model(const KvRun& run) const;
  // Queues a run for the disk tier (no-op without one).
  void to_disk(KvRunPtr run);
  void note_disk_error(const Error& e);
  // Spilled runs queued for disk beyond this wait for older writes.
  static constexpr size_t kMaxPendingDiskBytes = size_t{256} << 20;
  // Write-behind queues only within this much pending, so the spills that
  // must reach disk keep half of the queue.
  static constexpr size_t kMaxWriteBehindBytes = kMaxPendingDiskBytes / 2;

  Model& model_;
  BlockPool& pool_;
  PrefixTree& tree_;
  KvSpec spec_;
  std::vector<int32_t> attention_groups_;  // indices into spec_
  std::vector<Model::KvLayer> layers_;
  StatePool* states_ = nullptr;
  std::vector<std::vector<Model::StateTensor>> state_layers_;  // empty: no recurrent state
  int32_t key_group_ = 0;  // the attention group checkpoints are keyed by (KvManager's)
  struct GroupOf {
    uint64_t ns = 0;
    int32_t group = 0;
  };
  std::unordered_map<uint64_t, GroupOf> group_of_ns_;  // by group namespace
  std::unique_ptr<RamTier> ram_;
  std::unique_ptr<DiskTier> disk_;
  std::unique_ptr<DiskWriter> writer_;  // with disk_
  int64_t restored_tokens_ = 0, spill_errors_ = 0;
  int64_t write_behind_min_tokens_ = 0;
  int64_t write_behind_queued_ = 0;
  std::atomic<int64_t> write_behind_dropped_{0};  // read by stats() on any thread
  std::string last_error_;
};

}  // namespace rill
