#pragma once
// CompiledGrammar: a grammar lowered to bytes, the form the matcher runs.
//
// Every rule is a list of alternatives; an alternative is a run of elements
// in one flat array, ended by a kEnd element. kChar matches one byte from a
// 256-bit set; kRule expands to the rule's alternatives. Code point classes
// become alternatives of UTF-8 byte-range sequences (so [^"] also matches
// every multi-byte character, and never a lone continuation byte), and
// repetitions become helper rules: X* is R ::= X R | (empty), tail-recursive,
// so the matcher's stacks do not grow with the repeat count; X{m,n} is m
// copies of X and a chain of n-m optional rules.
//
// Compilation rejects left recursion (a rule that can reach itself before
// consuming a byte: `a ::= a "x"`, or `("x"?)*`), naming the rule: the
// matcher expands rules eagerly and would never terminate on one.
// Immutable once built; share it freely across threads.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "text/grammar/grammar_ast.h"

namespace rill::grammar {

struct Element {
  enum class Type : uint8_t { kEnd, kChar, kRule };
  Type type = Type::kEnd;
  uint32_t arg = 0;  // kChar: byte-set index; kRule: rule id
};

inline constexpr size_t kMaxElements = 4u << 20;  // a larger grammar is refused

class CompiledGrammar {
 public:
  static Result<std::shared_ptr<const CompiledGrammar>> compile(const GrammarAst& ast);
  // parse_gbnf then compile.
  static Result<std::shared_ptr<const CompiledGrammar>> from_gbnf(std::string_view text);

  uint32_t root() const { return root_; }
  size_t n_rules() const { return rule_alt_begin_.size() - 1; }
  const Element& element(uint32_t pos) const { return elements_[pos]; }
  // Start positions of rule `r`'s alternatives.
  std::span<const uint32_t> alternatives(uint32_t r) const {
    return {alt_starts_.data() + rule_alt_begin_[r], alt_starts_.data() + rule_alt_begin_[r + 1]};
  }
  bool byte_in_set(uint32_t set, uint8_t byte) const { return (byte_sets_[set][byte >> 6] >> (byte & 63)) & 1; }
  const std::string& rule_name(uint32_t r) const { return rule_names_[r]; }
  size_t n_elements() const { return elements_.size(); }

 private:
  friend class Compiler;
  std::vector<Element> elements_;
  std::vector<uint32_t> alt_starts_;
  std::vector<uint32_t> rule_alt_begin_;  // [n_rules + 1] into alt_starts_
  std::vector<std::array<uint64_t, 4>> byte_sets_;
  std::vector<std::string> rule_names_;
  uint32_t root_ = 0;
};

}  // namespace rill::grammar
