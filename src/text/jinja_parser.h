#pragma once
// Recursive-descent parser for the Jinja grammar as jinja2 3.x parses it
// (operator precedence, chained comparisons, `is` tests binding tighter than
// `not`, tuples without parentheses, filter/call postfix chains), plus the
// tags chat templates use: if/elif/else, for/else (inline `if`, recursive),
// set (plain, tuple, namespace attribute, block), macro, call, filter, with,
// break/continue (loopcontrols), print, and transformers' {% generation %}.
#include <vector>

#include "core/result.h"
#include "text/jinja_ast.h"
#include "text/jinja_lexer.h"

namespace rill::jinja {

// Errors name the line: "line 4: expected 'endfor'".
Result<Body> parse(std::vector<Token> tokens);

}  // namespace rill::jinja
