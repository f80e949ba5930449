#include "text/grammar/token_mask_cache.h"

#include <algorithm>
#include <cstring>

namespace rill::grammar {

namespace {
void set_bit(std::span<uint64_t> mask, int32_t id) {
  mask[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
}
}  // namespace

TokenMaskCache::TokenMaskCache(std::shared_ptr<const CompiledGrammar> grammar,
                               std::shared_ptr<const TokenVocabulary> vocab, size_t key_frames)
    : grammar_(std::move(grammar)),
      vocab_(std::move(vocab)),
      key_frames_(std::max<size_t>(key_frames, 1)),
      stepper_(*grammar_) {
  size_t max_len = 0;
  for (int32_t id = 0; id < vocab_->n_vocab(); ++id) max_len = std::max(max_len, vocab_->piece(id).size());
  levels_.resize(max_len + 1);
}

void TokenMaskCache::clear() {
  entries_.clear();
  stats_.entries = 0;
  stats_.bytes = 0;
}

void TokenMaskCache::walk(uint32_t node_index, uint32_t depth, bool hole_before, Entry& e) {
  const auto& nodes = vocab_->nodes();
  const TokenVocabulary::Node& node = nodes[node_index];
  for (uint32_t c = node.child_begin; c < node.child_end; ++c) {
    const TokenVocabulary::Node& child = nodes[c];
    StackSet& next = levels_[depth + 1];
    auto r = stepper_.advance(levels_[depth], child.byte, next);
    if (r.overflow) {  // conservative: nothing through this byte
      overflow_ = true;
      next.clear();
      r.hole = false;
    }
    const bool live = !next.empty();
    if (live || r.hole) {
      for (uint32_t i = child.token_begin; i < child.token_end_here; ++i) set_bit(e.accepted, vocab_->sorted_token(i));
    } else if (hole_before) {
      for (uint32_t i = child.token_begin; i < child.token_end_here; ++i) e.dependent.push_back(i);
    }
    const bool hole = hole_before || r.hole;
    if (live && !(next.size() == 1 && next.stack(0).empty())) {
      walk(c, depth + 1, hole, e);
    } else if (hole) {
      for (uint32_t i = child.token_end_here; i < child.subtree_end; ++i) e.dependent.push_back(i);
    }
  }
}

const TokenMaskCache::Entry& TokenMaskCache::entry_for(std::span<const uint32_t> stack) {
  const size_t n_frames = std::min(stack.size(), key_frames_);
  const bool truncated = stack.size() > key_frames_;
  key_.clear();
  if (truncated) key_.append(reinterpret_cast<const char*>(&kHole), sizeof(kHole));
  key_.append(reinterpret_cast<const char*>(stack.data() + stack.size() - n_frames), n_frames * sizeof(uint32_t));
  if (auto it = entries_.find(key_); it != entries_.end()) {
    ++stats_.hits;
    return it->second;
  }
  ++stats_.misses;
  if (stats_.bytes > kMaxCacheBytes) clear();
  Entry e;
  e.accepted.assign(vocab_->mask_words(), 0);
  StackSet& start = levels_[0];
  start.clear();
  std::vector<uint32_t> cut;
  if (truncated) cut.push_back(kHole);
  cut.insert(cut.end(), stack.end() - static_cast<ptrdiff_t>(n_frames), stack.end());
  start.add(cut);
  walk(0, 0, false, e);
  // The walk pushes dependents in trie order already; keep the invariant explicit.
  std::sort(e.dependent.begin(), e.dependent.end());
  stats_.bytes += e.accepted.size() * sizeof(uint64_t) + e.dependent.size() * sizeof(uint32_t) + key_.size();
  ++stats_.entries;
  return entries_.emplace(key_, std::move(e)).first->second;
}

void TokenMaskCache::check_dependent(std::span<const uint32_t> stack, const Entry& e, std::span<uint64_t> mask) {
  StackSet& start = levels_[0];
  start.clear();
  start.add(stack);
  std::string_view prev;
  size_t valid = 0;  // levels_[1..valid] hold the steps of prev's first bytes
  for (uint32_t pos : e.dependent) {
    const int32_t id = vocab_->sorted_token(pos);
    const std::string_view piece = vocab_->piece(id);
    size_t common = 0;
    while (common < valid && common < piece.size() && prev[common] == piece[common]) ++common;
    size_t d = common;
    bool alive = d == 0 || !levels_[d].empty();
    while (alive && d < piece.size()) {
      const auto r = stepper_.advance(levels_[d], static_cast<uint8_t>(piece[d]), levels_[d + 1]);
      if (r.overflow) {
        overflow_ = true;
        levels_[d + 1].clear();
      }
      ++d;
      alive = !levels_[d].empty();
    }
    ++stats_.dependent_checked;
    if (alive) set_bit(mask, id);
    prev = piece;
    valid = d;  // levels up to d are the steps of piece[0..d)
  }
}

bool TokenMaskCache::fill_mask(const StackSet& state, std::span<uint64_t> mask) {
  std::fill(mask.begin(), mask.end(), 0);
  overflow_ = false;
  bool can_end = false;
  for (size_t i = 0; i < state.size(); ++i) {
    const auto stack = state.stack(i);
    if (stack.empty()) {
      can_end = true;
      continue;
    }
    const Entry& e = entry_for(stack);
    for (size_t w = 0; w < mask.size(); ++w) mask[w] |= e.accepted[w];
    if (!e.dependent.empty()) check_dependent(stack, e, mask);
  }
  if (can_end) {
    for (int32_t id : vocab_->eos_ids()) set_bit(mask, id);
  }
  return !overflow_;
}

}  // namespace rill::grammar
