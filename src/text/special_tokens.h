#pragma once
// AddedTokenMatcher: cuts added/special tokens out of raw text before
// normalization, as the references do. Two matching rules:
//  - kLeftmostLongest (tokenizers' AddedVocabulary): scan left to right, at
//    each position take the longest added token; a special token found while
//    special parsing is off stays plain text.
//  - kLongestFirst (llama.cpp tokenizer_st_partition): tokens in order of
//    decreasing length each split every remaining text fragment.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace rill::text {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;  // matched only when parse_special
  bool lstrip = false;   // absorbs whitespace on its left
  bool rstrip = false;   // absorbs whitespace on its right
  bool single_word = false;
};

// One piece of the input: plain text (id < 0) or a recognised token.
struct Fragment {
  std::string_view text;
  int32_t id = -1;
};

class AddedTokenMatcher {
 public:
  enum class Rule { kLeftmostLongest, kLongestFirst };

  void build(std::vector<AddedToken> tokens, Rule rule);
  bool empty() const { return tokens_.empty(); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

  void split(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;

 private:
  // Longest token starting at text[pos]: index into tokens_, or -1.
  int32_t longest_at(std::string_view text, size_t pos) const;
  void split_leftmost_longest(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;
  void split_longest_first(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;

  Rule rule_ = Rule::kLeftmostLongest;
  std::vector<AddedToken> tokens_;
  // Byte trie: (node << 8 | byte) -> child node; node 0 is the root.
  std::unordered_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> terminal_;  // [n_nodes] token index ending here, or -1
  bool first_byte_[256] = {};
  std::vector<int32_t> by_length_;  // token indices, longest first (kLongestFirst)
};

}  // namespace rill::text
