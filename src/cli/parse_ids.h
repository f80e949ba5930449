#pragma once
// "1,2,3" -> {1, 2, 3}. Errors name the offending item.
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace rill::cli {

inline Result<std::vector<int32_t>> parse_ids(std::string_view text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(pos, comma - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    int32_t v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0) {
      return Error{"'" + std::string(item) + "' is not a token id (expected comma-separated non-negative integers)"};
    }
    ids.push_back(v);
    pos = comma + 1;
  }
  if (ids.empty()) return Error{"no token ids given"};
  return ids;
}

}  // namespace rill::cli
