#pragma once
// ResponseStore: the stored Responses-API responses behind
// previous_response_id and GET/DELETE /v1/responses/{id}. Thread-safe.
//
// Each entry holds the Response object as it was returned, the effective
// input of the conversation up to that response (Responses input items,
// accumulated along previous_response_id chains: the previous effective
// input + the previous output + the new input) and the instructions in
// force. Limits:
//   - TTL: an entry expires ttl_s after it was stored (reads do not extend
//     it). Expired entries are removed on every put/get/erase/stats call,
//     whatever their LRU position, and are never returned.
//   - Byte cap: when the stored bytes exceed max_bytes, least recently used
//     entries (get and put count as uses) are evicted until they fit.
//     An entry larger than the whole cap is not stored (put returns false,
//     counted as `rejected`); nothing else is evicted for it.
// Bytes are the serialized sizes of the JSON plus the id and instructions
// (an estimate of the memory held, not an exact count).
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace rill::server {

struct StoredResponse {
  nlohmann::ordered_json response;  // the Response object as returned to the client
  nlohmann::ordered_json input_items = nlohmann::ordered_json::array();  // effective input, without this output
  std::string instructions;                                              // "" when none
};

// For GET /stats. Counters are totals since the store was created.
struct ResponseStoreStats {
  int64_t entries = 0;
  int64_t bytes = 0;
  int64_t max_bytes = 0;
  double ttl_s = 0;
  int64_t hits = 0;         // get() found a live entry
  int64_t misses = 0;       // get() found nothing (unknown, deleted or expired)
  int64_t evictions = 0;    // removed by the byte cap (LRU)
  int64_t expirations = 0;  // removed by the TTL
  int64_t rejected = 0;     // put() of an entry larger than the cap
};
nlohmann::json to_json(const ResponseStoreStats& s);

// `prefix` followed by 32 random hex digits ("resp_3f9a...").
std::string random_id(std::string_view prefix);

class ResponseStore {
 public:
  using Clock = std::chrono::steady_clock;
  using NowFn = std::function<Clock::time_point()>;

  // ttl_s <= 0: entries never expire. max_bytes <= 0: nothing is stored.
  // `now` defaults to Clock::now (tests inject their own).
  ResponseStore(double ttl_s, int64_t max_bytes, NowFn now = {});

  // Stores (or replaces) the entry under `id`. False when it is larger than
  // the cap (then not stored, and an older entry under `id` is removed).
  bool put(const std::string& id, StoredResponse entry);
  // The live entry, or null when unknown, deleted or expired. Marks it as
  // most recently used.
  std::shared_ptr<const StoredResponse> get(const std::string& id);
  // False when there was no live entry.
  bool erase(const std::string& id);
  ResponseStoreStats stats();

 private:
  struct Entry {
    std::shared_ptr<const StoredResponse> value;
    int64_t bytes = 0;
    std::list<std::string>::iterator lru_pos;  // in lru_, front = most recent
    std::multimap<Clock::time_point, std::string>::iterator expiry_pos;
  };
  // Requires mu_ held.
  void expire_locked(Clock::time_point now);
  void remove_locked(std::unordered_map<std::string, Entry>::iterator it);

  const double ttl_s_;
  const int64_t max_bytes_;
  const NowFn now_;

  std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> lru_;
  std::multimap<Clock::time_point, std::string> expiry_;  // expiry time -> id
  int64_t bytes_ = 0;
  int64_t hits_ = 0, misses_ = 0, evictions_ = 0, expirations_ = 0, rejected_ = 0;
};

}  // namespace rill::server
