#pragma once
// GrammarCache: compiled grammars shared between requests. Compiling a large
// JSON schema's grammar takes milliseconds and its token-mask cache (built by
// the engine per CompiledGrammar) gets warmer the more requests use it, so
// requests with the same grammar text get the same CompiledGrammar object.
// Thread-safe; keeps the kCapacity most recently used grammars (a grammar in
// use by a request stays alive through the request's shared_ptr anyway).
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/result.h"
#include "text/grammar/compiled_grammar.h"

namespace rill::grammar {

class GrammarCache {
 public:
  static constexpr size_t kCapacity = 64;

  // The compiled grammar for GBNF `text` (CompiledGrammar::from_gbnf's
  // errors are not cached).
  Result<std::shared_ptr<const CompiledGrammar>> get(std::string_view gbnf);
  // A grammar built as an AST (e.g. several grammars merged), cached under
  // `key`, which must name everything `build` depends on and must not be
  // valid GBNF text of another grammar (prefix it: "tools\n...").
  Result<std::shared_ptr<const CompiledGrammar>> get_built(std::string_view key,
                                                           const std::function<Result<GrammarAst>()>& build);
  size_t size() const;

  // The process-wide cache the server's routes share.
  static GrammarCache& shared();

 private:
  Result<std::shared_ptr<const CompiledGrammar>> get_or_compile(
      std::string_view key, const std::function<Result<std::shared_ptr<const CompiledGrammar>>()>& compile);

  using Lru = std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>>;
  mutable std::mutex mu_;
  Lru lru_;                                                    // most recent first
  std::unordered_map<std::string_view, Lru::iterator> index_;  // keys view lru_'s strings
};

}  // namespace rill::grammar
