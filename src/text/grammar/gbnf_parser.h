#pragma once
// GBNF parser: the text grammars llama.cpp's `grammar` field takes
// (grammars/README.md there), into a GrammarAst.
//
//   root   ::= object               # comment to end of line
//   object ::= "{" ws ( pair ( "," ws pair )* )? "}"
//   name   ::= [a-zA-Z_] [a-zA-Z0-9_]{0,31}
//
// Rules: `name ::= alternatives`; names are letters, digits, '-' and '_'.
// A rule ends at the newline after which the next rule starts (or the text
// ends), so alternatives and sequences may continue on following lines.
// Items: "literal", [class] with ranges and ^ negation, `.` (any code
// point), a rule name, ( group ); postfix * + ? {m} {m,} {m,n} {,n}.
// Escapes in literals and classes: \n \r \t \\ \" \' \[ \] \- \^ \/ \xHH
// \uHHHH \UHHHHHHHH. The text must be valid UTF-8. `<|channel|>` (from '<'
// to the first '>') names the special token of that spelling (grammar_ast.h:
// special_token_literal); nothing else produces it, and a vocabulary
// without such a special token never does.
//
// Errors name the line and column ("grammar line 3, column 9: ...").
// Checks done here: syntax, duplicate rule names, references to undefined
// rules, a missing `root`, {m,n} with m > n or n > kMaxRepeat, nesting
// deeper than kMaxNesting. Left recursion is found by the compiler.
#include <string_view>

#include "core/result.h"
#include "text/grammar/grammar_ast.h"

namespace rill::grammar {

inline constexpr uint32_t kMaxRepeat = 10000;  // largest m or n in {m,n}
inline constexpr int kMaxNesting = 200;        // groups inside groups

Result<GrammarAst> parse_gbnf(std::string_view text);

}  // namespace rill::grammar
