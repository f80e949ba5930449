#pragma once
// Regular expressions to GBNF: the `regex` request field and JSON Schema
// `pattern`. The subset every schema pattern needs, with ECMA-262 meaning:
// literals and escapes (\n \t \r \f \v \0 \xHH \uHHHH, escaped
// metacharacters), `.` (any character but line terminators), classes with
// ranges and negation, \d \w \s \D \W \S, groups ( ) (?: ) (?<name> ),
// alternation, quantifiers * + ? {n} {n,} {n,m} (lazy forms match the same
// strings), ^ at the start and $ at the end. Backreferences, lookaround,
// word boundaries and anchors elsewhere are errors naming the construct.
//
// Anchoring: kWhole treats the regex as matching the whole text (the
// `regex` field); kSearch follows JSON Schema, where a pattern matches
// anywhere unless anchored: an unanchored side gets "any characters".
#include <string>
#include <string_view>

#include "core/result.h"

namespace rill::grammar {

enum class RegexAnchoring { kWhole, kSearch };
// kRaw: the characters themselves. kJsonString: as they appear inside a
// JSON string literal (", \ and control characters as escapes).
enum class RegexOutput { kRaw, kJsonString };

// A GBNF expression (no rules of its own) for the strings the regex matches.
Result<std::string> regex_to_gbnf_expression(std::string_view regex, RegexAnchoring anchoring, RegexOutput output);

// A whole grammar (`root ::= ...`) for the `regex` request field.
Result<std::string> regex_to_gbnf(std::string_view regex);

}  // namespace rill::grammar
