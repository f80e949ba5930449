#pragma once
// Tokenizer for Jinja templates, configured as transformers configures
// jinja2 for chat templates: trim_blocks=True, lstrip_blocks=True, default
// delimiters, keep_trailing_newline=False, newlines normalised to "\n".
// Whitespace control ("-" and "+" on tags), comments and {% raw %} blocks are
// resolved here, so the parser sees only data, tags and expression tokens.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace rill::jinja {

enum class TokenType : uint8_t {
  kData,           // literal template text (already whitespace-controlled)
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,  // text is the decoded value
  kInteger,
  kFloat,
  kOperator,  // text is the operator ("+", "//", "(", ...)
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0.0;
  int line = 1;
};

// Errors name the line: "line 3: unexpected char '$'".
Result<std::vector<Token>> tokenize(std::string_view source);

}  // namespace rill::jinja
