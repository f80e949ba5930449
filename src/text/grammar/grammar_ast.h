#pragma once
// The parsed form of a text grammar (GBNF/EBNF, as llama.cpp's `grammar`
// field takes it), before lowering to bytes: named rules whose bodies are
// expression trees over Unicode code points. The GBNF parser produces it;
// the compiler (compiled_grammar.h) lowers it to a byte-level automaton.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rill::grammar {

inline constexpr uint32_t kUnbounded = UINT32_MAX;  // Expr::max of `*`, `+`, `{m,}`
inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

// Inclusive code point range.
struct CodepointRange {
  uint32_t lo = 0, hi = 0;
};

struct Expr {
  enum class Kind {
    kSeq,      // children in order; an empty kSeq matches the empty string
    kAlt,      // one of children
    kLiteral,  // `text` (UTF-8 bytes) exactly
    kClass,    // one code point in `ranges` (or not in them, when negated)
    kRef,      // the rule named `text`
    kRepeat,   // children[0] between min and max times (max may be kUnbounded)
  };
  Kind kind = Kind::kSeq;
  std::vector<Expr> children;
  std::string text;
  std::vector<CodepointRange> ranges;
  bool negated = false;
  uint32_t min = 0, max = 0;
  uint32_t line = 0, col = 0;  // where it was written (1-based; 0: generated)
};

// A special token (one id of the vocabulary, e.g. Mistral's [TOOL_CALLS] or
// harmony's <|channel|>) named by a grammar is a kLiteral of these bytes:
// its spelling between two 0xFF bytes. No UTF-8 text holds 0xFF, so no
// text matches it; TokenVocabulary gives each special token exactly these
// bytes, so the one token that does is that special token.
inline constexpr char kTokenMark = '\xFF';
inline std::string special_token_literal(std::string_view spelling) {
  std::string s(1, kTokenMark);
  s += spelling;
  s += kTokenMark;
  return s;
}

struct Rule {
  std::string name;
  Expr body;
  uint32_t line = 0;
};

struct GrammarAst {
  std::vector<Rule> rules;  // in definition order; names are unique
};

}  // namespace rill::grammar
