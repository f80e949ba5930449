#pragma once
// TokenMaskCache: which tokens of a vocabulary may come next from a parse
// state, computed by walking the vocabulary trie with the matcher and cached
// by the top frames of each parse stack (the adaptive token-mask cache of
// xgrammar, in a simpler form).
//
// A mask for a state is the union over its stacks. For one stack, the walk
// starts from its top `key_frames` frames only, with a kHole below them when
// the stack is deeper: tokens accepted by those frames alone, or ending
// exactly where they pop to the hole, are accepted whatever lies below
// (cached as a bitset); tokens that run past the hole are "dependent" (a
// short list, cached too) and are checked against the whole stack on each
// call, walking them in trie order so shared prefixes are stepped once.
// So after the first visit of a (top frames) key a mask costs one bitset OR
// per stack plus the dependent checks; the first visit walks the subtrie
// the key allows (milliseconds for a state like "inside a JSON string").
//
// EOS (and the vocabulary's other end-of-generation tokens) is allowed
// when some stack is complete. A special token is allowed only where the
// grammar names it (token_vocabulary.h).
//
// Memory: entries hold n_vocab bits each; when the cache passes
// kMaxCacheBytes it is emptied and refilled on demand. Not thread-safe:
// one owner thread (the engine's) for the cache and every matcher on it.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/grammar/compiled_grammar.h"
#include "text/grammar/parse_stacks.h"
#include "text/grammar/token_vocabulary.h"

namespace rill::grammar {

inline constexpr size_t kDefaultKeyFrames = 6;
inline constexpr size_t kMaxCacheBytes = size_t{64} << 20;

class TokenMaskCache {
 public:
  TokenMaskCache(std::shared_ptr<const CompiledGrammar> grammar, std::shared_ptr<const TokenVocabulary> vocab,
                 size_t key_frames = kDefaultKeyFrames);

  // mask[vocab.mask_words()]: bit t set iff token t may come next from
  // `state`. Returns false when a stack's walk hit the StackSet bounds (the
  // tokens that needed it are left out).
  bool fill_mask(const StackSet& state, std::span<uint64_t> mask);

  const CompiledGrammar& grammar() const { return *grammar_; }
  const std::shared_ptr<const CompiledGrammar>& grammar_ptr() const { return grammar_; }
  const TokenVocabulary& vocab() const { return *vocab_; }

  struct Stats {
    size_t hits = 0, misses = 0, entries = 0, bytes = 0, dependent_checked = 0;
  };
  const Stats& stats() const { return stats_; }
  // Drops every entry (a benchmark measures cold masks with it).
  void clear();

 private:
  struct Entry {
    std::vector<uint64_t> accepted;   // [mask_words] by token id
    std::vector<uint32_t> dependent;  // sorted positions (TokenVocabulary::sorted_token)
  };

  const Entry& entry_for(std::span<const uint32_t> stack);
  void walk(uint32_t node, uint32_t depth, bool hole_before, Entry& e);
  // Sets the bits of e.dependent's tokens that `stack` (a whole stack) accepts.
  void check_dependent(std::span<const uint32_t> stack, const Entry& e, std::span<uint64_t> mask);

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  size_t key_frames_;
  Stepper stepper_;
  std::vector<StackSet> levels_;  // [max token length + 1], reused by every walk
  std::unordered_map<std::string, Entry> entries_;
  std::string key_;
  bool overflow_ = false;
  Stats stats_;
};

}  // namespace rill::grammar
