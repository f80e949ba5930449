#include "engine/grammar_masks.h"

#include "text/tokenizer.h"

namespace rill {

const grammar::TokenVocabulary& GrammarMasks::vocabulary() {
  if (!vocab_) vocab_ = grammar::TokenVocabulary::from_tokenizer(tokenizer_, eos_ids_);
  return *vocab_;
}

std::shared_ptr<grammar::TokenMaskCache> GrammarMasks::cache_for(
    const std::shared_ptr<const grammar::CompiledGrammar>& g) {
  vocabulary();
  if (auto it = caches_.find(g.get()); it != caches_.end()) return it->second;
  drop_idle();
  auto cache = std::make_shared<grammar::TokenMaskCache>(g, vocab_);
  caches_.emplace(g.get(), cache);
  return cache;
}

void GrammarMasks::drop_idle() {
  // Idle: only this map holds the cache (no running request's matcher does).
  size_t idle = 0;
  for (const auto& [key, cache] : caches_) idle += cache.use_count() == 1;
  for (auto it = caches_.begin(); it != caches_.end() && idle >= kIdleCaches;) {
    if (it->second.use_count() == 1) {
      it = caches_.erase(it);
      --idle;
    } else {
      ++it;
    }
  }
}

}  // namespace rill
