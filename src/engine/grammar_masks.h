#pragma once
// GrammarMasks: the engine's side of constrained decoding. It owns the
// model's TokenVocabulary (built on first use: the tokenizer's tokens as
// bytes, in a trie, with the engine's end-of-generation ids) and one
// TokenMaskCache per distinct CompiledGrammar, so requests that share a
// grammar (GrammarCache hands out one object per grammar text) share its
// cached masks: after the first request the masks of the states it visited
// cost a bitset OR, not a vocabulary walk.
//
// Engine thread only (TokenMaskCache is not thread-safe). Mask caches of
// grammars no request holds any more are dropped once more than
// kIdleCaches of them are kept.
#include <cstddef>
#include <memory>
#include <unordered_map>
#include <vector>

#include "text/grammar/compiled_grammar.h"
#include "text/grammar/token_mask_cache.h"
#include "text/grammar/token_vocabulary.h"

namespace rill {

class Tokenizer;

class GrammarMasks {
 public:
  static constexpr size_t kIdleCaches = 8;

  GrammarMasks(const Tokenizer& tokenizer, std::vector<int32_t> eos_ids)
      : tokenizer_(tokenizer), eos_ids_(std::move(eos_ids)) {}

  // The shared mask cache for `grammar` (built on first use).
  std::shared_ptr<grammar::TokenMaskCache> cache_for(const std::shared_ptr<const grammar::CompiledGrammar>& g);
  const grammar::TokenVocabulary& vocabulary();
  size_t n_caches() const { return caches_.size(); }

 private:
  void drop_idle();

  const Tokenizer& tokenizer_;
  std::vector<int32_t> eos_ids_;
  std::shared_ptr<const grammar::TokenVocabulary> vocab_;
  // A cache holds its grammar, so a key's address is not reused while it is here.
  std::unordered_map<const grammar::CompiledGrammar*, std::shared_ptr<grammar::TokenMaskCache>> caches_;
};

}  // namespace rill
