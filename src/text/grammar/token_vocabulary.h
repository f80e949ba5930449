#pragma once
// TokenVocabulary: a model's tokens as the bytes they decode to, in a trie,
// for computing grammar token masks.
//
// Each token is Tokenizer::token_to_piece (byte-level BPE: the bytes of its
// Ġ-encoded text; SentencePiece: ▁ as a space, <0xXX> as its byte).
// A special token's bytes are its spelling between two 0xFF bytes
// (grammar_ast.h: special_token_literal), so a grammar allows it only where
// it names it; tokens whose bytes hold 0xFF otherwise, ordinary
// end-of-generation tokens and tokens with no bytes are left out of the
// trie. The end-of-generation tokens (EOS and the end-of-turn tokens) are
// listed apart; a mask allows them where the grammar may end (and a special
// one also where the grammar names it).
//
// The trie: children of a node are contiguous, and the tokens are numbered
// in depth-first (sorted byte string) order, so every node's subtree is one
// range of that order. Immutable; shared by every mask cache on it.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace rill {
class Tokenizer;
}

namespace rill::grammar {

class TokenVocabulary {
 public:
  struct Node {
    uint32_t child_begin = 0, child_end = 0;  // into nodes()
    uint32_t token_begin = 0;                 // into sorted order: tokens ending here...
    uint32_t token_end_here = 0;              // ...are [token_begin, token_end_here)
    uint32_t subtree_end = 0;                 // the subtree's tokens: [token_begin, subtree_end)
    uint8_t byte = 0;                         // the byte on the edge into this node
  };

  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tok);
  // With these end-of-generation ids instead of the tokenizer's (the engine
  // adds generation_config's).
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tok, std::vector<int32_t> eos_ids);
  // `pieces[id]`: the token's bytes; `excluded[id]`: leave it out (special).
  TokenVocabulary(std::vector<std::string> pieces, const std::vector<bool>& excluded, std::vector<int32_t> eos_ids);

  int32_t n_vocab() const { return static_cast<int32_t>(pieces_.size()); }
  size_t mask_words() const { return (pieces_.size() + 63) / 64; }
  const std::vector<Node>& nodes() const { return nodes_; }  // nodes()[0] is the root
  // Token id at position `i` of the sorted order.
  int32_t sorted_token(uint32_t i) const { return sorted_[i]; }
  std::string_view piece(int32_t id) const { return pieces_[id]; }
  bool in_trie(int32_t id) const { return in_trie_[id]; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  bool is_eos(int32_t id) const;

 private:
  void build(uint32_t node, uint32_t lo, uint32_t hi, uint32_t depth);

  std::vector<std::string> pieces_;  // [n_vocab]
  std::vector<bool> in_trie_;        // [n_vocab]
  std::vector<int32_t> sorted_;      // trie tokens in byte order
  std::vector<Node> nodes_;
  std::vector<int32_t> eos_ids_;
};

}  // namespace rill::grammar
