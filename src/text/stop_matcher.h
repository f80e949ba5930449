#pragma once
// StopMatcher: finds stop strings in a stream of decoded text deltas and holds
// back any suffix that could still become a stop string, so no byte of a stop
// string is ever emitted to the client.
//
// Which stop wins: the stop is reported at the first position in the text
// where any stop string ends; among the stops ending there, the one that
// starts earliest (the longest) wins. Equivalently: scan the text byte by
// byte and stop as soon as some stop string has been fully seen. The emitted
// text is then everything before the winning stop's first byte; it never
// contains a whole stop string (that one would have ended earlier).
//
// UTF-8: deltas are valid UTF-8 (IncrementalDecoder guarantees it) and so are
// stop strings (the server validates them). A held-back suffix is a prefix of
// a stop string, so it starts with a non-continuation byte: emitted text never
// ends inside a character. The cut is also moved back over up to 3
// continuation bytes, so invalid stops cannot split a character either.
//
// Cost: an Aho-Corasick automaton over the stop strings; push() is amortised
// O(len(delta) + max_stop_len) and touches only the held-back bytes and the
// delta, never the whole text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rill {

class StopMatcher {
 public:
  // Empty strings are ignored; duplicates are harmless.
  explicit StopMatcher(std::vector<std::string> stops);

  // Feeds newly decoded text. Appends to `emit` the text that is now safe to
  // send: everything except a suffix that could still start a stop string.
  // When a stop string completes, appends the text before it, sets stopped()
  // and returns true; the stop string and everything after it are dropped.
  // After stopped(), push() appends nothing and returns true.
  bool push(std::string_view delta, std::string& emit);

  // End of stream (EOS, length limit): appends the held-back text. A later
  // push() starts matching afresh (nothing carries over the flush).
  void flush(std::string& emit);

  bool stopped() const { return stopped_; }
  // The stop string that matched; empty until stopped().
  const std::string& matched() const { return matched_; }
  // Bytes received but not yet emitted (at most max_stop_len - 1 + 3).
  size_t held_bytes() const { return held_.size(); }
  bool has_stops() const { return !stops_.empty(); }

 private:
  struct Edge {
    uint8_t byte;
    int32_t to;
  };
  struct Node {
    std::vector<Edge> edges;  // sorted by byte
    int32_t fail = 0;         // longest proper suffix that is also a trie node
    int32_t depth = 0;
    int32_t out = -1;  // longest stop ending here (self or via fail), index into stops_
  };

  int32_t child(int32_t node, uint8_t byte) const;
  int32_t step(int32_t state, uint8_t byte) const;

  std::vector<std::string> stops_;
  std::vector<Node> nodes_;  // nodes_[0]: root
  int32_t state_ = 0;        // trie node of the longest suffix of the text that prefixes a stop
  std::string held_;         // text not emitted yet; ends with the state's depth bytes
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace rill
