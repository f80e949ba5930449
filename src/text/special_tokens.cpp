#include "text/special_tokens.h"

#include <algorithm>
#include <cctype>

#include "text/unicode.h"

namespace rill::text {

namespace {

bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Start of the run of whitespace characters that ends at `end`.
size_t whitespace_run_start(std::string_view s, size_t end) {
  size_t pos = end;
  while (pos > 0) {
    size_t b = pos - 1;
    while (b > 0 && (static_cast<uint8_t>(s[b]) & 0xC0) == 0x80) --b;
    const Utf8Probe p = probe_utf8(s.substr(b, pos - b));
    if (!p.complete || !is_white_space(p.cp)) break;
    pos = b;
  }
  return pos;
}

size_t whitespace_run_end(std::string_view s, size_t begin) {
  size_t pos = begin;
  while (pos < s.size()) {
    const Utf8Probe p = probe_utf8(s.substr(pos, 4));
    if (!p.complete || !is_white_space(p.cp)) break;
    pos += p.valid_prefix_len;
  }
  return pos;
}

bool is_word_char(std::string_view s, size_t pos, bool before) {
  if (before) {
    if (pos == 0) return false;
    size_t b = pos - 1;
    while (b > 0 && (static_cast<uint8_t>(s[b]) & 0xC0) == 0x80) --b;
    const unsigned char c = static_cast<unsigned char>(s[b]);
    return c >= 0x80 || std::isalnum(c) || c == '_';
  }
  if (pos >= s.size()) return false;
  const unsigned char c = static_cast<unsigned char>(s[pos]);
  return c >= 0x80 || std::isalnum(c) || c == '_';
}

}  // namespace

void AddedTokenMatcher::build(std::vector<AddedToken> tokens, Rule rule) {
  rule_ = rule;
  tokens_.clear();
  for (auto& t : tokens)
    if (!t.content.empty()) tokens_.push_back(std::move(t));
  edges_.clear();
  terminal_.assign(1, -1);
  std::fill(std::begin(first_byte_), std::end(first_byte_), false);
  for (size_t k = 0; k < tokens_.size(); ++k) {
    int32_t node = 0;
    for (char c : tokens_[k].content) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
      auto [it, inserted] = edges_.try_emplace(key, static_cast<int32_t>(terminal_.size()));
      if (inserted) terminal_.push_back(-1);
      node = it->second;
    }
    if (terminal_[node] < 0) terminal_[node] = static_cast<int32_t>(k);  // first definition wins
    first_byte_[static_cast<uint8_t>(tokens_[k].content[0])] = true;
  }
  by_length_.resize(tokens_.size());
  for (size_t k = 0; k < tokens_.size(); ++k) by_length_[k] = static_cast<int32_t>(k);
  std::stable_sort(by_length_.begin(), by_length_.end(),
                   [&](int32_t a, int32_t b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t pos) const {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) best = terminal_[node];
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, bool parse_special, std::vector<Fragment>& out) const {
  out.clear();
  if (text.empty()) return;
  if (tokens_.empty()) {
    out.push_back({text, -1});
    return;
  }
  if (rule_ == Rule::kLeftmostLongest)
    split_leftmost_longest(text, parse_special, out);
  else
    split_longest_first(text, parse_special, out);
}

void AddedTokenMatcher::split_leftmost_longest(std::string_view text, bool parse_special,
                                               std::vector<Fragment>& out) const {
  size_t start_offset = 0;
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    const int32_t k = longest_at(text, i);
    if (k < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = tokens_[k];
    size_t start = i, stop = i + tok.content.size();
    i = stop;  // matching resumes after this match whether or not it is used
    if (tok.special && !parse_special) continue;
    if (tok.single_word && (is_word_char(text, start, true) || is_word_char(text, stop, false))) continue;
    if (tok.lstrip) start = std::max(whitespace_run_start(text, start), start_offset);
    if (tok.rstrip) stop = whitespace_run_end(text, stop);
    if (start > start_offset) out.push_back({text.substr(start_offset, start - start_offset), -1});
    out.push_back({text.substr(start, stop - start), tok.id});
    start_offset = stop;
    i = std::max(i, stop);
  }
  if (start_offset < text.size()) out.push_back({text.substr(start_offset), -1});
}

void AddedTokenMatcher::split_longest_first(std::string_view text, bool parse_special,
                                            std::vector<Fragment>& out) const {
  bool present[256] = {};
  for (char c : text) present[static_cast<uint8_t>(c)] = true;
  out.push_back({text, -1});
  std::vector<Fragment> next;
  for (int32_t k : by_length_) {
    const AddedToken& tok = tokens_[k];
    if (tok.special && !parse_special) continue;
    if (!present[static_cast<uint8_t>(tok.content[0])]) continue;
    if (text.find(tok.content) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& f : out) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (;;) {
        const size_t m = rest.find(tok.content);
        if (m == std::string_view::npos) break;
        // llama.cpp's lstrip/rstrip trim ASCII spaces from the neighbours.
        size_t left_len = m;
        if (tok.lstrip)
          while (left_len > 0 && std::isspace(static_cast<unsigned char>(rest[left_len - 1]))) --left_len;
        if (left_len > 0) next.push_back({rest.substr(0, left_len), -1});
        next.push_back({rest.substr(m, tok.content.size()), tok.id});
        size_t right = m + tok.content.size();
        if (tok.rstrip)
          while (right < rest.size() && std::isspace(static_cast<unsigned char>(rest[right]))) ++right;
        rest = rest.substr(right);
      }
      if (!rest.empty()) next.push_back({rest, -1});
    }
    out.swap(next);
  }
}

}  // namespace rill::text
