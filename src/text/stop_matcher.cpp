#include "text/stop_matcher.h"

#include <algorithm>
#include <deque>

namespace rill {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
  nodes_.emplace_back();
  // Trie of the stops; a node's `out` is first set to the stop that ends at
  // exactly that node (the first one listed, for duplicates).
  for (size_t si = 0; si < stops_.size(); ++si) {
    int32_t node = 0;
    for (char ch : stops_[si]) {
      const auto byte = static_cast<uint8_t>(ch);
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        Node n;
        n.depth = nodes_[node].depth + 1;
        nodes_.push_back(std::move(n));
        auto& edges = nodes_[node].edges;
        const auto at =
            std::lower_bound(edges.begin(), edges.end(), byte, [](const Edge& e, uint8_t b) { return e.byte < b; });
        edges.insert(at, Edge{byte, next});
      }
      node = next;
    }
    if (nodes_[node].out < 0) nodes_[node].out = static_cast<int32_t>(si);
  }
  // Failure links in breadth-first order (a node's fail target is shallower,
  // so it is final before the node is visited). A node's own stop is longer
  // than any stop reached through its fail link, so `out` keeps the longest.
  std::deque<int32_t> queue;
  for (const Edge& e : nodes_[0].edges) queue.push_back(e.to);
  while (!queue.empty()) {
    const int32_t u = queue.front();
    queue.pop_front();
    if (nodes_[u].out < 0) nodes_[u].out = nodes_[nodes_[u].fail].out;
    for (const Edge& e : nodes_[u].edges) {
      nodes_[e.to].fail = step(nodes_[u].fail, e.byte);
      queue.push_back(e.to);
    }
  }
}

int32_t StopMatcher::child(int32_t node, uint8_t byte) const {
  const auto& edges = nodes_[node].edges;
  // Stops are few and short: a node has a handful of edges at most.
  for (const Edge& e : edges) {
    if (e.byte == byte) return e.to;
    if (e.byte > byte) break;
  }
  return -1;
}

int32_t StopMatcher::step(int32_t state, uint8_t byte) const {
  for (;;) {
    const int32_t next = child(state, byte);
    if (next >= 0) return next;
    if (state == 0) return 0;
    state = nodes_[state].fail;
  }
}

bool StopMatcher::push(std::string_view delta, std::string& emit) {
  if (stopped_) return true;
  if (stops_.empty()) {
    emit.append(delta);
    return false;
  }
  const size_t base = held_.size();
  held_.append(delta);
  // Each byte deepens the state by at most one and each fail step makes it
  // shallower, so this loop is amortised O(len(delta) + max_stop_len).
  for (size_t i = base; i < held_.size(); ++i) {
    state_ = step(state_, static_cast<uint8_t>(held_[i]));
    const int32_t hit = nodes_[state_].out;
    if (hit < 0) continue;
    // The stop ends at byte i and lies inside held_ (it is a suffix of the
    // state's string, which held_ ends with).
    const size_t start = i + 1 - stops_[hit].size();
    emit.append(held_, 0, start);
    matched_ = stops_[hit];
    stopped_ = true;
    held_.clear();
    state_ = 0;
    return true;
  }
  // Hold back the longest suffix that is a prefix of some stop; never cut in
  // front of a continuation byte (a stop can only start at a lead byte, so
  // this moves only for invalid UTF-8).
  size_t cut = held_.size() - static_cast<size_t>(nodes_[state_].depth);
  for (int back = 0; back < 3 && cut > 0 && cut < held_.size() && (static_cast<uint8_t>(held_[cut]) & 0xC0) == 0x80;
       ++back) {
    --cut;
  }
  emit.append(held_, 0, cut);
  held_.erase(0, cut);
  return false;
}

void StopMatcher::flush(std::string& emit) {
  emit.append(held_);
  held_.clear();
  state_ = 0;
}

}  // namespace rill
