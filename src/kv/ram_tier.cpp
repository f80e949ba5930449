#include "kv/ram_tier.h"

namespace rill {

RamTier::RamTier(size_t cap_bytes, bool prefault) : cap_(cap_bytes) {
  // One huge page of slack: extents round up to pages, the cap counts bytes.
  auto arena = HostArena::create(cap_bytes + LazyBuffer::kHugePage, prefault);
  if (arena.ok()) arena_ = std::move(arena).value();
}

std::vector<KvRunPtr> RamTier::make_room(size_t bytes) {
  std::vector<KvRunPtr> out;
  while (bytes_ + bytes > cap_ && !lru_.empty()) {
    const uint64_t victim = lru_.front();
    out.push_back(entries_.at(victim).run);
    drop(victim);
    ++stats_.evictions;
  }
  return out;
}

std::vector<KvRunPtr> RamTier::put(KvRunPtr run) {
  std::vector<KvRunPtr> out;
  const size_t b = run->bytes();
  if (b > cap_) {
    out.push_back(std::move(run));
    return out;
  }
  const uint64_t id = next_id_++;
  lru_.push_back(id);
  index_.add(id, run->keys, run->min_resume_blocks());
  entries_.emplace(id, Entry{std::move(run), std::prev(lru_.end())});
  bytes_ += b;
  while (bytes_ > cap_ && !lru_.empty()) {
    const uint64_t victim = lru_.front();
    out.push_back(entries_.at(victim).run);
    drop(victim);
    ++stats_.evictions;
  }
  stats_.bytes = static_cast<int64_t>(bytes_);
  stats_.entries = static_cast<int64_t>(entries_.size());
  return out;
}

std::optional<std::pair<KvRunPtr, int32_t>> RamTier::find(std::span<const uint64_t> keys) {
  const auto hit = index_.longest(keys);
  if (!hit) {
    ++stats_.misses;
    return std::nullopt;
  }
  Entry& e = entries_.at(hit->entry);
  lru_.splice(lru_.end(), lru_, e.lru);
  ++stats_.hits;
  return std::make_pair(e.run, hit->n_blocks);
}

void RamTier::drop(uint64_t id) {
  auto it = entries_.find(id);
  index_.remove(id, it->second.run->keys);
  bytes_ -= it->second.run->bytes();
  lru_.erase(it->second.lru);
  entries_.erase(it);
  stats_.bytes = static_cast<int64_t>(bytes_);
  stats_.entries = static_cast<int64_t>(entries_.size());
}

void RamTier::clear() {
  while (!lru_.empty()) drop(lru_.front());
}

}  // namespace rill
