// Fuzz target for StopMatcher.
// Input: byte 0 = number of stops (mod 5); each stop = a length byte (mod 9)
// then that many bytes; the rest = deltas, each a length byte (mod 17) then
// that many bytes (the last one truncated to what is left).
// Checks against a brute-force reference (the stop ending first in the whole
// text, the longest on ties): emitted text is always a prefix of the answer
// and holds no stop string, held bytes stay bounded, emitted + held equals
// the text fed, the final output equals the answer, and with valid UTF-8
// input the emitted text never ends inside a character.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "text/stop_matcher.h"
#include "text/unicode.h"

namespace {

#define FUZZ_CHECK(cond)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

// Start of the winning stop, or npos.
size_t reference_stop(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t best = 0;
    for (const auto& s : stops) {
      if (!s.empty() && s.size() <= end && s.size() > best && text.compare(end - s.size(), s.size(), s) == 0) {
        best = s.size();
      }
    }
    if (best > 0) return end - best;
  }
  return std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto take = [&](size_t n) {
    n = std::min(n, in.size());
    std::string_view s = in.substr(0, n);
    in.remove_prefix(n);
    return s;
  };
  auto take_byte = [&]() -> size_t { return in.empty() ? 0 : static_cast<uint8_t>(take(1)[0]); };

  std::vector<std::string> stops;
  const size_t n_stops = take_byte() % 5;
  size_t max_len = 0;
  bool valid = true;
  for (size_t k = 0; k < n_stops; ++k) {
    stops.emplace_back(take(take_byte() % 9));
    max_len = std::max(max_len, stops.back().size());
    valid = valid && rill::text::is_valid_utf8(stops.back());
  }
  std::vector<std::string> deltas;
  std::string text;
  while (!in.empty()) {
    deltas.emplace_back(take(take_byte() % 17));
    text += deltas.back();
    valid = valid && rill::text::is_valid_utf8(deltas.back());
  }
  const size_t stop_at = reference_stop(text, stops);
  const std::string answer = stop_at == std::string::npos ? text : text.substr(0, stop_at);

  rill::StopMatcher m(stops);
  std::string emitted;
  size_t n_fed = 0;
  for (const auto& d : deltas) {
    if (m.stopped()) {
      FUZZ_CHECK(m.push(d, emitted));
      continue;
    }
    n_fed += d.size();
    const bool hit = m.push(d, emitted);
    FUZZ_CHECK(hit == m.stopped());
    FUZZ_CHECK(answer.compare(0, emitted.size(), emitted) == 0);
    for (const auto& s : stops) FUZZ_CHECK(s.empty() || emitted.find(s) == std::string::npos);
    if (valid) FUZZ_CHECK(rill::text::is_valid_utf8(emitted));
    if (!hit) {
      FUZZ_CHECK(emitted.size() + m.held_bytes() == n_fed);
      FUZZ_CHECK(m.held_bytes() <= (max_len == 0 ? 0 : max_len - 1 + 3));
    }
  }
  FUZZ_CHECK(m.stopped() == (stop_at != std::string::npos));
  if (!m.stopped()) m.flush(emitted);
  FUZZ_CHECK(emitted == answer);
  return 0;
}
