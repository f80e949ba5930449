// GrammarMatcher over bytes: accepts exactly the strings of the grammar,
// prefix by prefix, with UTF-8 classes, repetition bounds and rollback.
#include "text/grammar/grammar_matcher.h"

#include <gtest/gtest.h>

namespace rill::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> compile(std::string_view text) {
  auto g = CompiledGrammar::from_gbnf(text);
  EXPECT_TRUE(g.ok()) << g.error().message;
  return g.ok() ? *g : nullptr;
}

// Whole-string match: every prefix accepted and the grammar may end.
bool matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view s) {
  GrammarMatcher m(g);
  return m.accept_bytes(s) && m.can_end();
}

TEST(GrammarMatcher, LiteralsAlternativesAndRepetition) {
  auto g = compile(R"g(root ::= ("ab" | "c")+ "!"? d{2,3}
d ::= [0-9])g");
  for (const char* s : {"ab12", "cab123", "c!99", "ababab!000"}) EXPECT_TRUE(matches(g, s)) << s;
  for (const char* s : {"", "12", "ab1", "ab1234", "a12", "ab!!12", "abc"}) EXPECT_FALSE(matches(g, s)) << s;
  GrammarMatcher m(g);
  EXPECT_TRUE(m.accept_bytes("a"));
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept_bytes("x"));  // refused: state unchanged
  EXPECT_TRUE(m.accept_bytes("b12"));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.accept_bytes("3"));
  EXPECT_TRUE(m.must_end());
}

TEST(GrammarMatcher, CharClassesAreCodePointsInUtf8) {
  auto g = compile(R"g(root ::= [^"\\]* "\"" [a-zé-ë😀] .)g");
  EXPECT_TRUE(matches(g, "h\xc3\xa9llo \xe2\x82\xac\"\xc3\xa9x"));
  EXPECT_TRUE(matches(g, "\"\xf0\x9f\x98\x80\xf0\x9f\x98\x81"));
  EXPECT_TRUE(matches(g, "\"\xc3\xab\xe4\xb8\xad"));
  EXPECT_FALSE(matches(g,
                       "\"\xc3\xac"
                       "a"));                    // ì is outside é-ë
  EXPECT_FALSE(matches(g, "a\\\"aa"));           // backslash excluded
  EXPECT_FALSE(matches(g, "\x80\"aa"));          // a lone continuation byte is no character
  EXPECT_FALSE(matches(g, "\xed\xa0\x80\"aa"));  // a surrogate is no character
  EXPECT_FALSE(matches(g, "\xc0\xaf\"aa"));      // overlong encoding
  GrammarMatcher m(g);
  EXPECT_TRUE(m.accept_bytes("\"\xf0\x9f"));  // inside a character: a prefix is fine
  EXPECT_FALSE(m.accept_bytes("\x41"));
}

TEST(GrammarMatcher, BoundedRepetitionCounts) {
  auto g = compile(R"g(root ::= "a"{2,4} "b"{3} "c"{,1} "d"{2,})g");
  EXPECT_TRUE(matches(g, "aabbbdd"));
  EXPECT_TRUE(matches(g, "aaaabbbcddddd"));
  EXPECT_FALSE(matches(g, "abbbdd"));
  EXPECT_FALSE(matches(g, "aaaaabbbdd"));
  EXPECT_FALSE(matches(g, "aabbdd"));
  EXPECT_FALSE(matches(g, "aabbbccdd"));
  EXPECT_FALSE(matches(g, "aabbbd"));
}

TEST(GrammarMatcher, NestedRecursionBalancesParentheses) {
  auto g = compile(R"g(root ::= expr
expr ::= term (("+" | "-") term)*
term ::= [0-9]+ | "(" expr ")")g");
  EXPECT_TRUE(matches(g, "1+(2-(3+44))-5"));
  EXPECT_TRUE(matches(g, "((((((((((1))))))))))"));
  EXPECT_FALSE(matches(g, "((1)"));
  EXPECT_FALSE(matches(g, "(1))"));
  EXPECT_FALSE(matches(g, "1+"));
}

TEST(GrammarMatcher, EmptyAlternativesAndEmptyGrammar) {
  auto g = compile(R"g(root ::= "" | "x")g");
  EXPECT_TRUE(matches(g, ""));
  EXPECT_TRUE(matches(g, "x"));
  EXPECT_FALSE(matches(g, "xx"));
  auto never = compile(R"g(root ::= [^\x00-\U0010FFFF])g");  // the empty class matches nothing
  GrammarMatcher m(never);
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept_bytes("a"));
}

TEST(GrammarMatcher, AmbiguityIsBoundedAndReported) {
  // Each "a" may start a new `x` or continue one: the number of parses grows
  // with the input, but stacks are deduplicated and capped.
  auto g = compile(R"g(root ::= x*
x ::= "a" | "a" "a" | "a" "a" "a")g");
  GrammarMatcher m(g);
  EXPECT_TRUE(m.accept_bytes(std::string(200, 'a')));
  EXPECT_LE(m.state().size(), kMaxStacks);
  EXPECT_TRUE(m.can_end());
  // Exponentially many distinct stacks: a center-recursive ambiguous grammar.
  auto wild = compile(R"g(root ::= a
a ::= "x" a "y" | "x" a | "x" b | ""
b ::= "x" a "z" | "x" b "z" | "")g");
  GrammarMatcher w(wild);
  bool refused = false;
  for (int i = 0; i < 40 && !refused; ++i) refused = !w.accept_bytes("x");
  EXPECT_TRUE(refused);
  EXPECT_TRUE(w.overflowed());
}

}  // namespace
}  // namespace rill::grammar
