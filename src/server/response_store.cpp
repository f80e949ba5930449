#include "server/response_store.h"

#include <cassert>
#include <random>

namespace rill::server {

nlohmann::json to_json(const ResponseStoreStats& s) {
  return {{"entries", s.entries},  {"bytes", s.bytes},   {"max_bytes", s.max_bytes}, {"ttl_s", s.ttl_s},
          {"hits", s.hits},        {"misses", s.misses}, {"evictions", s.evictions}, {"expirations", s.expirations},
          {"rejected", s.rejected}};
}

std::string random_id(std::string_view prefix) {
  // One generator per thread, seeded from the OS: ids need to be unique and
  // unguessable enough for a local server, not cryptographic.
  thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
  }());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  for (int half = 0; half < 2; ++half) {
    uint64_t bits = rng();
    for (int i = 0; i < 16; ++i, bits >>= 4) id += kHex[bits & 15];
  }
  return id;
}

namespace {

// Serialized size plus a fixed allowance for the map/list nodes.
constexpr int64_t kEntryOverhead = 256;

size_t json_bytes(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).size();
}

int64_t entry_bytes(const std::string& id, const StoredResponse& e) {
  return kEntryOverhead + int64_t(id.size()) + int64_t(json_bytes(e.response)) + int64_t(json_bytes(e.input_items)) +
         int64_t(e.instructions.size());
}

}  // namespace

ResponseStore::ResponseStore(double ttl_s, int64_t max_bytes, NowFn now)
    : ttl_s_(ttl_s), max_bytes_(max_bytes), now_(now ? std::move(now) : NowFn([] { return Clock::now(); })) {}

void ResponseStore::remove_locked(std::unordered_map<std::string, Entry>::iterator it) {
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru_pos);
  if (it->second.expiry_pos != expiry_.end()) expiry_.erase(it->second.expiry_pos);
  entries_.erase(it);
}

void ResponseStore::expire_locked(Clock::time_point now) {
  while (!expiry_.empty() && expiry_.begin()->first <= now) {
    auto it = entries_.find(expiry_.begin()->second);
    assert(it != entries_.end());
    remove_locked(it);
    ++expirations_;
  }
}

bool ResponseStore::put(const std::string& id, StoredResponse entry) {
  const int64_t bytes = entry_bytes(id, entry);
  const Clock::time_point now = now_();
  std::lock_guard lk(mu_);
  expire_locked(now);
  if (auto old = entries_.find(id); old != entries_.end()) remove_locked(old);
  if (bytes > max_bytes_) {
    ++rejected_;
    return false;
  }
  while (bytes_ + bytes > max_bytes_) {
    assert(!lru_.empty());
    remove_locked(entries_.find(lru_.back()));
    ++evictions_;
  }
  lru_.push_front(id);
  Entry e;
  e.value = std::make_shared<const StoredResponse>(std::move(entry));
  e.bytes = bytes;
  e.lru_pos = lru_.begin();
  e.expiry_pos = expiry_.end();
  if (ttl_s_ > 0) {
    const auto ttl = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(ttl_s_));
    e.expiry_pos = expiry_.emplace(now + ttl, id);
  }
  entries_.emplace(id, std::move(e));
  bytes_ += bytes;
  return true;
}

std::shared_ptr<const StoredResponse> ResponseStore::get(const std::string& id) {
  const Clock::time_point now = now_();
  std::lock_guard lk(mu_);
  expire_locked(now);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second.lru_pos);
  return it->second.value;
}

bool ResponseStore::erase(const std::string& id) {
  const Clock::time_point now = now_();
  std::lock_guard lk(mu_);
  expire_locked(now);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  remove_locked(it);
  return true;
}

ResponseStoreStats ResponseStore::stats() {
  const Clock::time_point now = now_();
  std::lock_guard lk(mu_);
  expire_locked(now);
  ResponseStoreStats s;
  s.entries = int64_t(entries_.size());
  s.bytes = bytes_;
  s.max_bytes = max_bytes_;
  s.ttl_s = ttl_s_;
  s.hits = hits_;
  s.misses = misses_;
  s.evictions = evictions_;
  s.expirations = expirations_;
  s.rejected = rejected_;
  return s;
}

}  // namespace rill::server
