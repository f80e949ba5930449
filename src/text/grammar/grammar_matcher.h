#pragma once
// GrammarMatcher: one request's position in a grammar. It accepts text
// (bytes) or tokens, says whether the text may end here, fills token masks
// through a shared TokenMaskCache, and rolls back accepted tokens (for
// speculative decoding: up to kMaxRollback).
//
// A refused byte or token leaves the state unchanged. After an EOS token
// (accepted only where the grammar may end) the matcher is terminated and
// refuses everything. Not thread-safe (see TokenMaskCache).
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string_view>

#include "text/grammar/compiled_grammar.h"
#include "text/grammar/parse_stacks.h"
#include "text/grammar/token_mask_cache.h"

namespace rill::grammar {

inline constexpr size_t kMaxRollback = 16;

class GrammarMatcher {
 public:
  // Token-level matcher over the cache's grammar and vocabulary.
  explicit GrammarMatcher(std::shared_ptr<TokenMaskCache> masks);
  // Bytes only (no vocabulary: accept_token and fill_mask must not be used).
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Consumes `bytes` if the grammar allows them here, all or nothing.
  bool accept_bytes(std::string_view bytes);
  // Consumes a token: its bytes, or an end-of-generation token where the
  // grammar may end. Records the previous state for rollback().
  bool accept_token(int32_t id);
  // Undoes the last n accepted tokens; false (nothing undone) when fewer
  // than n are recorded.
  bool rollback(size_t n_tokens);

  bool can_end() const { return !terminated_ && state_.can_end(); }
  // No byte can follow (the grammar is complete and allows nothing more).
  bool must_end() const;
  bool terminated() const { return terminated_; }
  // True when the last step hit the parse-stack bounds (parse_stacks.h).
  bool overflowed() const { return overflowed_; }

  // mask[vocab.mask_words()]: bit t set iff accept_token(t) would succeed.
  // Returns false when the stack bounds cut the mask (see TokenMaskCache).
  bool fill_mask(std::span<uint64_t> mask);

  const StackSet& state() const { return state_; }

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  std::shared_ptr<TokenMaskCache> masks_;
  Stepper stepper_;
  StackSet state_, next_, spare_;
  std::deque<StackSet> history_;  // states before the last accepted tokens, oldest first
  bool terminated_ = false;
  bool overflowed_ = false;
};

}  // namespace rill::grammar
