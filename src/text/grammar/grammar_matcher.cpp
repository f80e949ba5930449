#include "text/grammar/grammar_matcher.h"

#include <algorithm>

namespace rill::grammar {

GrammarMatcher::GrammarMatcher(std::shared_ptr<TokenMaskCache> masks)
    : grammar_(masks->grammar_ptr()), masks_(std::move(masks)), stepper_(*grammar_) {
  overflowed_ = stepper_.initial(state_).overflow;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), stepper_(*grammar_) {
  overflowed_ = stepper_.initial(state_).overflow;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (terminated_) return false;
  spare_ = state_;
  for (char c : bytes) {
    const auto r = stepper_.advance(spare_, static_cast<uint8_t>(c), next_);
    overflowed_ = r.overflow;
    if (r.overflow || next_.empty()) return false;
    std::swap(spare_, next_);
  }
  std::swap(state_, spare_);
  return true;
}

bool GrammarMatcher::accept_token(int32_t id) {
  if (terminated_ || !masks_ || id < 0 || id >= masks_->vocab().n_vocab()) return false;
  StackSet before = state_;
  if (masks_->vocab().is_eos(id) && state_.can_end()) {
    terminated_ = true;
  } else if (!masks_->vocab().in_trie(id) || !accept_bytes(masks_->vocab().piece(id))) {
    return false;
  }
  history_.push_back(std::move(before));
  if (history_.size() > kMaxRollback) {
    history_.pop_front();
  }
  return true;
}

bool GrammarMatcher::rollback(size_t n_tokens) {
  if (n_tokens > history_.size()) return false;
  if (n_tokens == 0) return true;
  state_ = std::move(history_[history_.size() - n_tokens]);
  history_.resize(history_.size() - n_tokens);
  terminated_ = false;  // no state before a token is terminated: EOS is the last token
  return true;
}

bool GrammarMatcher::must_end() const {
  if (terminated_) return true;
  for (size_t i = 0; i < state_.size(); ++i) {
    if (!state_.stack(i).empty()) return false;
  }
  return true;
}

bool GrammarMatcher::fill_mask(std::span<uint64_t> mask) {
  if (terminated_) {
    std::fill(mask.begin(), mask.end(), 0);
    return true;
  }
  return masks_->fill_mask(state_, mask);
}

}  // namespace rill::grammar
