#pragma once
// KvRun: the KV of one cached prefix, tokens [0, n_blocks * block_size) of
// a sequence in one namespace, as the host-RAM and disk tiers hold it:
// per KV layer, K and V rows [n_rows, row_bytes] (layer-major, the KV
// file's tensor layout) of blocks [first_block, n_blocks), and for hybrid
// models the recurrent state at its end. A full layer holds every block
// (first_block 0); a sliding layer only those resuming at the run's end
// reads (first_needed_block, model/kv_spec.h). A RAM run owns its bytes; a
// disk run points into its mapped file. Runs are immutable once built and
// shared by pointer, so a tier may drop one while a restore is still
// copying from it.
//
// Where a run can resume a sequence: at m of its blocks only if every
// sliding layer holds what resuming at m reads; the first block that needs
// moves with m, so a run whose sliding layers dropped blocks resumes only at
// its end (min_resume_blocks), as does a run with a recurrent state.
//
// TierIndex maps the prefix tree's chain keys (PrefixTree::chain_keys) to
// the run holding that block, so a tier answers "the longest prefix of
// these keys I can resume" without looking at runs.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/host_arena.h"
#include "kv/kv_file.h"
#include "model/kv_spec.h"

namespace rill {

struct KvRun {
  uint64_t ns = 0;
  int32_t block_size = 16;
  std::vector<int32_t> tokens;       // n_blocks * block_size ids
  std::vector<uint64_t> keys;        // chain key of each block
  std::vector<LayerKind> kinds;      // per KV layer
  std::vector<int32_t> windows;      // per KV layer: sliding window (tokens), 0 for full
  std::vector<int32_t> first_block;  // per KV layer: k / v hold blocks [first_block, n_blocks)
  std::vector<size_t> row_bytes;     // per KV layer: K's
  std::vector<DType> dtypes;         // per KV layer: K's
  // Per KV layer: V's where some layer's V is stored in another type than
  // its K (k4c); empty: V as K in every layer.
  std::vector<size_t> v_row_bytes;
  std::vector<DType> v_dtypes;
  std::vector<std::span<const uint8_t>> k, v;  // per KV layer
  // Hybrid models: per recurrent layer (kind kRecurrent), the state right
  // after the run's last token; empty otherwise. Such a run resumes only
  // the whole prefix it holds, never a shorter one.
  std::vector<KvLayerData> state;
  HostBytes host;                      // RAM runs: owns k / v (and state)
  std::vector<uint8_t> storage;        // or this (runs built by hand, tests)
  std::shared_ptr<const KvFile> file;  // disk runs: owns k / v

  int32_t n_blocks() const { return static_cast<int32_t>(keys.size()); }
  size_t v_row(size_t l) const { return v_row_bytes.empty() ? row_bytes[l] : v_row_bytes[l]; }
  DType v_dtype(size_t l) const { return v_dtypes.empty() ? dtypes[l] : v_dtypes[l]; }
  int32_t min_resume_blocks() const;
  size_t bytes() const {
    size_t b = 0;
    for (size_t l = 0; l < k.size(); ++l) b += k[l].size() + v[l].size();
    for (const KvLayerData& l : state) {
      for (const KvTensorData& t : l.tensors) b += t.bytes.size();
    }
    return b;
  }
};
using KvRunPtr = std::shared_ptr<const KvRun>;

// The fewest leading blocks of a run of n_blocks a sequence can resume at
// (n_blocks + 1: none): per layer, kind, window and first block held as in
// KvRun; with a recurrent state, only n_blocks. The tiers index, match and
// restore runs by this one rule.
inline int32_t kv_min_resume_blocks(int32_t n_blocks, int32_t block_size, bool has_state,
                                    std::span<const LayerKind> kinds, std::span<const int32_t> windows,
                                    std::span<const int32_t> first_block) {
  if (has_state) return n_blocks;
  int32_t m = 1;
  for (size_t l = 0; l < first_block.size(); ++l) {
    if (first_block[l] <= 0) continue;
    const LayerGroupSpec g{kinds[l], windows[l]};
    while (m <= n_blocks && first_needed_block(g, m * block_size, block_size) < first_block[l]) ++m;
  }
  return m;
}

inline int32_t KvRun::min_resume_blocks() const {
  return kv_min_resume_blocks(n_blocks(), block_size, !state.empty(), kinds, windows, first_block);
}

class TierIndex {
 public:
  struct Hit {
    uint64_t entry = 0;
    int32_t n_blocks = 0;  // blocks 0..n_blocks-1 of the prompt's chain
  };
  // The deepest key of `keys` indexed at a depth its run can resume at
  // (every run starts at block 0, so it holds all blocks above it too).
  std::optional<Hit> longest(std::span<const uint64_t> keys) const {
    for (size_t i = keys.size(); i-- > 0;) {
      auto it = map_.find(keys[i]);
      if (it != map_.end() && it->second.block == static_cast<int32_t>(i) && it->second.resumable) {
        return Hit{it->second.entry, static_cast<int32_t>(i) + 1};
      }
    }
    return std::nullopt;
  }
  // Whether some run holds this block (resumable there or not).
  bool contains(uint64_t key) const { return map_.count(key) != 0; }
  // Points the keys at `entry`: the newest run wins a shared prefix, except
  // where it cannot resume (depth < min_resume) and another run is indexed.
  void add(uint64_t entry, std::span<const uint64_t> keys, int32_t min_resume = 1) {
    for (size_t i = 0; i < keys.size(); ++i) {
      const Slot slot{entry, static_cast<int32_t>(i), static_cast<int32_t>(i) + 1 >= min_resume};
      if (slot.resumable) {
        map_[keys[i]] = slot;
      } else {
        map_.try_emplace(keys[i], slot);
      }
    }
  }
  // Forgets the keys that still point at `entry`.
  void remove(uint64_t entry, std::span<const uint64_t> keys) {
    for (uint64_t key : keys) {
      auto it = map_.find(key);
      if (it != map_.end() && it->second.entry == entry) map_.erase(it);
    }
  }
  void clear() { map_.clear(); }

 private:
  struct Slot {
    uint64_t entry;
    int32_t block;
    bool resumable;  // the run can resume a sequence at block + 1 blocks
  };
  std::unordered_map<uint64_t, Slot> map_;
};

// Counters each tier reports (/stats, /metrics).
struct TierStats {
  int64_t bytes = 0, entries = 0;
  int64_t hits = 0, misses = 0, evictions = 0, errors = 0;
  // Restores this tier served (KvTiers::restore) and their time from the
  // lookup to the KV in device blocks: mapping, page-in and copy (and, for
  // the disk tier with verify on, hashing).
  int64_t loads = 0;
  double load_seconds = 0;
  // Disk tier: files removed because a newer file holds their whole chain
  // and resumes everywhere they did (DiskTier::add).
  int64_t replaced = 0;
};

}  // namespace rill
