#include "text/grammar/grammar_cache.h"

namespace rill::grammar {

Result<std::shared_ptr<const CompiledGrammar>> GrammarCache::get(std::string_view gbnf) {
  return get_or_compile(gbnf, [&] { return CompiledGrammar::from_gbnf(gbnf); });
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCache::get_built(
    std::string_view key, const std::function<Result<GrammarAst>()>& build) {
  return get_or_compile(key, [&]() -> Result<std::shared_ptr<const CompiledGrammar>> {
    RILL_ASSIGN_OR_RETURN(GrammarAst ast, build());
    return CompiledGrammar::compile(ast);
  });
}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCache::get_or_compile(
    std::string_view gbnf, const std::function<Result<std::shared_ptr<const CompiledGrammar>>()>& compile) {
  {
    std::lock_guard lk(mu_);
    if (auto it = index_.find(gbnf); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Compiled outside the lock: another thread may compile the same text at
  // the same time; the first to insert wins and both get a valid grammar.
  RILL_ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> g, compile());
  std::lock_guard lk(mu_);
  if (auto it = index_.find(gbnf); it != index_.end()) return it->second->second;
  lru_.emplace_front(std::string(gbnf), g);
  index_.emplace(lru_.front().first, lru_.begin());
  if (lru_.size() > kCapacity) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return g;
}

size_t GrammarCache::size() const {
  std::lock_guard lk(mu_);
  return lru_.size();
}

GrammarCache& GrammarCache::shared() {
  static GrammarCache cache;
  return cache;
}

}  // namespace rill::grammar
