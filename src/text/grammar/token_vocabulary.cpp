#include "text/grammar/token_vocabulary.h"

#include <algorithm>

#include "text/grammar/grammar_ast.h"
#include "text/tokenizer.h"

namespace rill::grammar {

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tok) {
  return from_tokenizer(tok, tok.eos_ids());
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tok,
                                                                       std::vector<int32_t> eos_ids) {
  const int32_t n = tok.n_vocab();
  std::vector<std::string> pieces(static_cast<size_t>(n));
  std::vector<bool> excluded(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    const std::string piece = tok.token_to_piece(id);
    if (tok.is_special(id)) {
      pieces[id] = special_token_literal(piece);  // allowed only where a grammar names it
    } else if (piece.find(kTokenMark) == std::string::npos) {
      pieces[id] = piece;
    } else {
      excluded[id] = true;  // a lone 0xFF byte: no grammar allows it, and it must not start a token name
    }
  }
  return std::make_shared<const TokenVocabulary>(std::move(pieces), excluded, std::move(eos_ids));
}

TokenVocabulary::TokenVocabulary(std::vector<std::string> pieces, const std::vector<bool>& excluded,
                                 std::vector<int32_t> eos_ids)
    : pieces_(std::move(pieces)), in_trie_(pieces_.size()), eos_ids_(std::move(eos_ids)) {
  std::erase_if(eos_ids_, [&](int32_t id) { return id < 0 || id >= n_vocab(); });
  for (size_t id = 0; id < pieces_.size(); ++id) {
    // An end-of-generation token ends the text even where it is not special
    // (Qwen3's "</s>"), so it is never taken for its bytes; a special one
    // (its bytes start with kTokenMark) is also allowed where a grammar names it.
    const bool named_eos = !pieces_[id].empty() && pieces_[id][0] == kTokenMark;
    in_trie_[id] = !(id < excluded.size() && excluded[id]) && !pieces_[id].empty() &&
                   (named_eos || !is_eos(static_cast<int32_t>(id)));
    if (in_trie_[id]) sorted_.push_back(static_cast<int32_t>(id));
  }
  std::sort(sorted_.begin(), sorted_.end(),
            [&](int32_t a, int32_t b) { return pieces_[a] != pieces_[b] ? pieces_[a] < pieces_[b] : a < b; });
  nodes_.resize(1);
  build(0, 0, static_cast<uint32_t>(sorted_.size()), 0);
}

bool TokenVocabulary::is_eos(int32_t id) const {
  return std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end();
}

// Tokens sorted_[lo, hi) share their first `depth` bytes (the path to `node`).
void TokenVocabulary::build(uint32_t node, uint32_t lo, uint32_t hi, uint32_t depth) {
  uint32_t i = lo;
  while (i < hi && pieces_[sorted_[i]].size() == depth) ++i;
  nodes_[node].token_begin = lo;
  nodes_[node].token_end_here = i;
  nodes_[node].subtree_end = hi;
  std::vector<std::pair<uint32_t, uint32_t>> groups;
  for (uint32_t j = i; j < hi;) {
    const char b = pieces_[sorted_[j]][depth];
    uint32_t k = j;
    while (k < hi && pieces_[sorted_[k]][depth] == b) ++k;
    groups.push_back({j, k});
    j = k;
  }
  const auto first = static_cast<uint32_t>(nodes_.size());
  nodes_.resize(nodes_.size() + groups.size());
  nodes_[node].child_begin = first;
  nodes_[node].child_end = first + static_cast<uint32_t>(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const uint32_t child = first + static_cast<uint32_t>(g);
    nodes_[child].byte = static_cast<uint8_t>(pieces_[sorted_[groups[g].first]][depth]);
    build(child, groups[g].first, groups[g].second, depth + 1);
  }
}

}  // namespace rill::grammar
