#pragma once
// KvRun: the KV of one cached prefix, tokens [0, n_blocks * block_size) of
// a sequence in one namespace, as the host-RAM and disk tiers hold it:
// per KV layer, K and V rows [n_tokens, row_bytes] (layer-major, the KV
// file's tensor layout), and for hybrid models the recurrent state at its end. A RAM run owns its bytes; a disk run points into
// its mapped file. Runs are immutable once built and shared by pointer, so
// a tier may drop one while a restore is still copying from it.
//
// TierIndex maps the prefix tree's chain keys (PrefixTree::chain_keys) to
// the run holding that block, so a tier answers "the longest prefix of
// these keys I hold" without looking at runs.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/host_arena.h"
#include "kv/kv_file.h"

namespace rill {

struct KvRun {
  uint64_t ns = 0;
  int32_t block_size = 16;
  std::vector<int32_t> tokens;  // n_blocks * block_size ids
  std::vector<uint64_t> keys;   // chain key of each block
  std::vector<LayerKind> kinds;                     // per KV layer
  std::vector<size_t> row_bytes;                    // per KV layer
  std::vector<DType> dtypes;                        // per KV layer
  std::vector<std::span<const uint8_t>> k, v;       // per KV layer
  // Hybrid models: per recurrent layer (kind kRecurrent), the state right
  // after the run's last token; empty otherwise. Such a run resumes only
  // the whole prefix it holds, never a shorter one.
  std::vector<KvLayerData> state;
  HostBytes host;                                   // RAM runs: owns k / v (and state)
  std::vector<uint8_t> storage;                     // or this (runs built by hand, tests)
  std::shared_ptr<const KvFile> file;               // disk runs: owns k / v

  int32_t n_blocks() const { return static_cast<int32_t>(keys.size()); }
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

class TierIndex {
 public:
  struct Hit {
    uint64_t entry = 0;
    int32_t n_blocks = 0;  // blocks 0..n_blocks-1 of the prompt's chain
  };
  // The deepest key of `keys` that is indexed (every run starts at block 0,
  // so it holds all blocks above it too).
  std::optional<Hit> longest(std::span<const uint64_t> keys) const {
    for (size_t i = keys.size(); i-- > 0;) {
      auto it = map_.find(keys[i]);
      if (it != map_.end() && it->second.block == static_cast<int32_t>(i)) {
        return Hit{it->second.entry, static_cast<int32_t>(i) + 1};
      }
    }
    return std::nullopt;
  }
  bool contains(uint64_t key) const { return map_.count(key) != 0; }
  // Points every key at `entry` (the newest run wins a shared prefix).
  void add(uint64_t entry, std::span<const uint64_t> keys) {
    for (size_t i = 0; i < keys.size(); ++i) map_[keys[i]] = {entry, static_cast<int32_t>(i)};
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
};

}  // namespace rill
