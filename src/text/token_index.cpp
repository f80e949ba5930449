#include "text/token_index.h"

#include <xxhash.h>

namespace rill::text {

namespace {

size_t slots_for(size_t n_entries) {
  size_t n = 16;
  while (n < 2 * n_entries) n *= 2;
  return n;
}

}  // namespace

void TokenIndex::reserve(size_t n_entries) {
  if (slots_for(n_entries) > slots_.size()) rehash(slots_for(n_entries));
  ids_.reserve(n_entries);
  offsets_.reserve(n_entries + 1);
}

void TokenIndex::rehash(size_t n_slots) {
  slots_.assign(n_slots, Slot{});
  const size_t mask = n_slots - 1;
  for (uint32_t e = 0; e < ids_.size(); ++e) {
    const uint64_t h = XXH3_64bits(arena_.data() + offsets_[e], offsets_[e + 1] - offsets_[e]);
    size_t i = h & mask;
    while (slots_[i].entry != 0) i = (i + 1) & mask;
    slots_[i] = {static_cast<uint32_t>(h >> 32), e + 1};
  }
}

size_t TokenIndex::locate(std::string_view key, uint64_t hash) const {
  const size_t mask = slots_.size() - 1;
  const uint32_t tag = static_cast<uint32_t>(hash >> 32);
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.entry == 0 || (s.tag == tag && key_of(s.entry - 1) == key)) return i;
  }
}

bool TokenIndex::emplace(std::string_view key, int32_t id) {
  if (2 * (ids_.size() + 1) > slots_.size()) rehash(slots_for(2 * (ids_.size() + 1)));
  const uint64_t h = XXH3_64bits(key.data(), key.size());
  const size_t i = locate(key, h);
  if (slots_[i].entry != 0) return false;
  arena_.append(key);
  offsets_.push_back(static_cast<uint32_t>(arena_.size()));
  ids_.push_back(id);
  slots_[i] = {static_cast<uint32_t>(h >> 32), static_cast<uint32_t>(ids_.size())};
  return true;
}

void TokenIndex::insert_or_assign(std::string_view key, int32_t id) {
  if (!emplace(key, id)) {
    const size_t i = locate(key, XXH3_64bits(key.data(), key.size()));
    ids_[slots_[i].entry - 1] = id;
  }
}

std::optional<int32_t> TokenIndex::find(std::string_view key) const {
  if (slots_.empty()) return std::nullopt;
  const size_t i = locate(key, XXH3_64bits(key.data(), key.size()));
  if (slots_[i].entry == 0) return std::nullopt;
  return ids_[slots_[i].entry - 1];
}

void PairMap::reserve(size_t n_entries) {
  if (slots_for(n_entries) > slots_.size()) rehash(slots_for(n_entries));
}

void PairMap::rehash(size_t n_slots) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(n_slots, Slot{});
  const size_t mask = n_slots - 1;
  for (const Slot& s : old) {
    if (s.key_plus_one == 0) continue;
    size_t i = mix(s.key_plus_one - 1) & mask;
    while (slots_[i].key_plus_one != 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void PairMap::put(uint64_t key, Value v, bool replace) {
  if (2 * (n_ + 1) > slots_.size()) rehash(slots_for(2 * (n_ + 1)));
  const size_t mask = slots_.size() - 1;
  size_t i = mix(key) & mask;
  for (; slots_[i].key_plus_one != 0; i = (i + 1) & mask) {
    if (slots_[i].key_plus_one == key + 1) {
      if (replace) slots_[i].value = v;
      return;
    }
  }
  slots_[i] = {key + 1, v};
  ++n_;
}

}  // namespace rill::text
