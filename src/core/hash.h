#pragma once
// 64-bit content hashing (XXH3) for fingerprints and cache keys.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rill {

uint64_t hash64(const void* data, size_t size, uint64_t seed = 0);
inline uint64_t hash64(std::string_view s, uint64_t seed = 0) {
  return hash64(s.data(), s.size(), seed);
}
// 16 lowercase hex digits.
std::string hex64(uint64_t h);

}  // namespace rill
