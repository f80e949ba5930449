#pragma once
// Flat open-addressing hash tables for the tokenizer's two big lookups:
// token text -> id (TokenIndex) and merge pair -> (rank, id) (PairMap).
// Hundreds of thousands of entries are inserted at load time, so both keep
// their data in a few contiguous arrays instead of one heap node per entry
// (which made loading a 262k vocabulary cache-miss bound).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rill::text {

class TokenIndex {
 public:
  void reserve(size_t n_entries);
  // Maps `key` to `id`, replacing an existing mapping.
  void insert_or_assign(std::string_view key, int32_t id);
  // Maps `key` to `id` unless `key` is already present. Returns whether it inserted.
  bool emplace(std::string_view key, int32_t id);
  std::optional<int32_t> find(std::string_view key) const;
  size_t size() const { return ids_.size(); }

 private:
  struct Slot {
    uint32_t tag = 0;    // high hash bits, to skip most key compares
    uint32_t entry = 0;  // entry index + 1; 0 = empty
  };
  size_t locate(std::string_view key, uint64_t hash) const;  // slot holding key, or the empty one
  std::string_view key_of(uint32_t entry) const {
    return std::string_view(arena_).substr(offsets_[entry], offsets_[entry + 1] - offsets_[entry]);
  }
  void rehash(size_t n_slots);

  std::string arena_;                 // all keys, concatenated
  std::vector<uint32_t> offsets_{0};  // [n + 1] key boundaries in arena_
  std::vector<int32_t> ids_;          // [n]
  std::vector<Slot> slots_;           // power-of-two size, at most half full
};

inline std::optional<int32_t> find_token(const TokenIndex& index, std::string_view text) {
  return index.find(text);
}

// uint64 key -> (rank, id). Keys must be below 2^64 - 1.
class PairMap {
 public:
  struct Value {
    int32_t rank;
    int32_t id;
  };
  void reserve(size_t n_entries);
  // Inserts unless present (the first insertion wins).
  void emplace(uint64_t key, Value v) { put(key, v, false); }
  void insert_or_assign(uint64_t key, Value v) { put(key, v, true); }
  const Value* find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    const size_t mask = slots_.size() - 1;
    for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.key_plus_one == 0) return nullptr;
      if (s.key_plus_one == key + 1) return &s.value;
    }
  }
  size_t size() const { return n_; }

 private:
  struct Slot {
    uint64_t key_plus_one = 0;  // 0 = empty
    Value value{};
  };
  static uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  void rehash(size_t n_slots);
  void put(uint64_t key, Value v, bool replace);

  std::vector<Slot> slots_;
  size_t n_ = 0;
};

}  // namespace rill::text
