#include "engine/kv_calibration.h"

#include <filesystem>
#include <fstream>

#include "core/e4m3.h"

namespace rill {

// Written for rill: a little prose about caches, then the code it talks
// about. Attention's queries and keys over both kinds of text are what the
// widths are fitted to.
const std::string_view kKvCalibrationText = R"(A cache is only as good as the questions it can answer quickly.
When a program reads the same file twice, the second read should cost
almost nothing; when a server sees the same prompt prefix from many users,
it should compute the shared part once and keep it. The hard part is not
storing things but deciding what to forget. Old entries that nobody asks
for take room from new ones, while an entry thrown away too early has to be
rebuilt at full price. Most designs therefore track how recently and how
often each entry was used, and evict from the cold end of a list.

The small module below keeps a bounded number of results in memory. It is
written for clarity rather than speed, and it counts its hits and misses so
that a test can check the policy instead of guessing at it.

import collections


class BoundedCache:
    """Keeps at most `capacity` values, dropping the least recently used."""

    def __init__(self, capacity):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, not {capacity}")
        self.capacity = capacity
        self.entries = collections.OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key, compute):
        if key in self.entries:
            self.entries.move_to_end(key)
            self.hits += 1
            return self.entries[key]
        self.misses += 1
        value = compute(key)
        self.entries[key] = value
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)
        return value


def hit_rate(cache):
    total = cache.hits + cache.misses
    return 0.0 if total == 0 else cache.hits / total

If the values are large, counting entries is the wrong measure: a limit in
bytes, with each value's size recorded when it is stored, keeps memory use
predictable. Either way the rule stays simple enough to explain in one
sentence, which is usually a sign that it will also be easy to debug.
)";

Status add_kv_calibration(const Tokenizer* tok, KvTypeOptions& kv) {
  if (!kv.mentions(kKvQ4Alloc)) return {};
  const std::string& path = kv.calibration_path;
  const std::string what = path.empty() ? std::string("the built-in KV calibration text") : path;
  if (tok == nullptr) return Error{"KV type q4a calibrates on " + what + ", which needs the model's tokenizer"};
  std::string text;
  if (path.empty()) {
    text = kKvCalibrationText;
  } else {
    // A regular file only (a directory reads as empty, a FIFO or a device
    // may never end), and only its first kMaxKvCalibrationBytes: the pass
    // uses 256 tokens, so a large corpus costs no more than a short text.
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      return Error{path + ": not a regular file (--kv-calibration takes a text file)"};
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) return Error{path + ": cannot read the KV calibration file (--kv-calibration)"};
    text.resize(kMaxKvCalibrationBytes);
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    if (in.bad()) return Error{path + ": cannot read the KV calibration file (--kv-calibration)"};
    text.resize(static_cast<size_t>(in.gcount()));
  }
  kv.calibration_tokens = tok->encode(text, /*add_special=*/true, /*parse_special=*/false);
  if (kv.calibration_tokens.size() < kMinKvCalibrationTokens) {
    return Error{what + ": " + std::to_string(kv.calibration_tokens.size()) +
                 " tokens; KV type q4a calibrates on at least " + std::to_string(kMinKvCalibrationTokens)};
  }
  return {};
}

}  // namespace rill
