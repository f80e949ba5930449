#pragma once
// RamTier: the host-RAM tier of the prefix cache. Holds whole runs (KvRun)
// under a byte cap, least recently used first out. Its runs' bytes come from
// a HostArena of the cap's size (resident ahead of use, reused as runs come
// and go), so a spill on a request's path is a plain copy. Not thread-safe
// (the engine thread owns it).
#include <cstddef>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/kv_run.h"

namespace rill {

class RamTier {
 public:
  // prefault: make the arena resident in the background (see HostArena).
  explicit RamTier(size_t cap_bytes, bool prefault = true);

  size_t cap_bytes() const { return cap_; }
  bool covers(uint64_t key) const { return index_.contains(key); }

  // Evicts least recently used runs until `bytes` more fit under the cap;
  // returns them (the caller spills them down, then drops them, which gives
  // their arena bytes back unless someone else still holds the run).
  std::vector<KvRunPtr> make_room(size_t bytes);
  // `bytes` for a new run from the arena, or an empty handle when no free
  // extent holds them (then the caller maps its own, HostBytes::own).
  HostBytes allocate(size_t bytes) { return arena_ ? arena_->allocate(bytes) : HostBytes(); }
  const HostArena* arena() const { return arena_.get(); }

  // Adds `run` as the most recently used and evicts the least recently used
  // runs beyond the cap; returns those (the caller spills them down). A run
  // larger than the cap is not kept: it is returned at once.
  std::vector<KvRunPtr> put(KvRunPtr run);

  // The run holding the longest prefix of `keys` (chain keys of a prompt)
  // that it can resume at (KvRun::min_resume_blocks) and how many of its
  // blocks match, or nullopt. A hit becomes the most
  // recently used. Counts a hit or a miss.
  std::optional<std::pair<KvRunPtr, int32_t>> find(std::span<const uint64_t> keys);

  // Drops every run.
  void clear();
  const TierStats& stats() const { return stats_; }
  // A restore served from this tier took `seconds` (TierStats::loads).
  void count_load(double seconds) {
    ++stats_.loads;
    stats_.load_seconds += seconds;
  }

 private:
  struct Entry {
    KvRunPtr run;
    std::list<uint64_t>::iterator lru;
  };
  void drop(uint64_t id);

  size_t cap_;
  std::unique_ptr<HostArena> arena_;  // null if it could not be mapped
  size_t bytes_ = 0;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // front: least recently used
  TierIndex index_;
  TierStats stats_;
};

}  // namespace rill
