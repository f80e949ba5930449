// GBNF parser: the syntax llama.cpp's grammars use parses; malformed
// grammars fail with an error naming the line, column and problem.
#include "text/grammar/gbnf_parser.h"

#include <gtest/gtest.h>

#include "text/grammar/compiled_grammar.h"

namespace rill::grammar {
namespace {

std::string error_of(std::string_view text) {
  auto g = CompiledGrammar::from_gbnf(text);
  return g.ok() ? std::string("(ok)") : g.error().message;
}

TEST(GbnfParser, ParsesRulesAlternativesAndPostfix) {
  auto ast = parse_gbnf(R"(
# a comment
root ::= item ("," item)* | "none"   # trailing comment
item ::= [a-z]+ digit? x{2,3} y{2} z{1,} w{,2}
digit ::= [0-9]
x ::= "x"
y ::= "y"
z ::= "z"
w ::= "w"
)");
  ASSERT_TRUE(ast.ok()) << ast.error().message;
  ASSERT_EQ(ast->rules.size(), 7u);
  EXPECT_EQ(ast->rules[0].name, "root");
  EXPECT_EQ(ast->rules[0].body.kind, Expr::Kind::kAlt);
  EXPECT_EQ(ast->rules[0].body.children.size(), 2u);
  const Expr& item = ast->rules[1].body;
  ASSERT_EQ(item.kind, Expr::Kind::kSeq);
  ASSERT_EQ(item.children.size(), 6u);
  EXPECT_EQ(item.children[0].kind, Expr::Kind::kRepeat);
  EXPECT_EQ(item.children[0].min, 1u);
  EXPECT_EQ(item.children[0].max, kUnbounded);
  EXPECT_EQ(item.children[1].max, 1u);
  EXPECT_EQ(item.children[2].min, 2u);
  EXPECT_EQ(item.children[2].max, 3u);
  EXPECT_EQ(item.children[3].min, 2u);
  EXPECT_EQ(item.children[3].max, 2u);
  EXPECT_EQ(item.children[4].max, kUnbounded);
  EXPECT_EQ(item.children[5].min, 0u);
  EXPECT_EQ(item.children[5].max, 2u);
}

TEST(GbnfParser, RulesContinueOverLinesUntilTheNextDefinition) {
  auto ast = parse_gbnf("root ::=\n  \"a\"\n  | \"b\"\n  \"c\"\nnext ::= \"d\"\n");
  ASSERT_TRUE(ast.ok()) << ast.error().message;
  ASSERT_EQ(ast->rules.size(), 2u);
  ASSERT_EQ(ast->rules[0].body.kind, Expr::Kind::kAlt);
  EXPECT_EQ(ast->rules[0].body.children[1].children.size(), 2u);  // "b" "c"
}

TEST(GbnfParser, DecodesEscapesInLiteralsAndClasses) {
  auto ast = parse_gbnf(R"(root ::= "\n\t\r\\\"\x41\u00e9\U0001F600" [\]\-\^a-c] [^"\\])");
  ASSERT_TRUE(ast.ok()) << ast.error().message;
  const Expr& seq = ast->rules[0].body;
  EXPECT_EQ(seq.children[0].text, "\n\t\r\\\"A\xc3\xa9\xf0\x9f\x98\x80");
  const Expr& cls = seq.children[1];
  ASSERT_EQ(cls.ranges.size(), 4u);
  EXPECT_EQ(cls.ranges[0].lo, static_cast<uint32_t>(']'));
  EXPECT_EQ(cls.ranges[3].lo, static_cast<uint32_t>('a'));
  EXPECT_EQ(cls.ranges[3].hi, static_cast<uint32_t>('c'));
  EXPECT_TRUE(seq.children[2].negated);
}

TEST(GbnfParser, NamesSpecialTokensByTheirSpelling) {
  auto ast = parse_gbnf(R"(root ::= <|channel|> "x" <think>)");
  ASSERT_TRUE(ast.ok()) << ast.error().message;
  const Expr& seq = ast->rules[0].body;
  EXPECT_EQ(seq.children[0].text, special_token_literal("<|channel|>"));
  EXPECT_EQ(seq.children[0].text, "\xFF<|channel|>\xFF");
  EXPECT_EQ(seq.children[2].text, special_token_literal("<think>"));
  EXPECT_NE(error_of("root ::= <>").find("special token"), std::string::npos);
  EXPECT_NE(error_of("root ::= <abc").find("special token"), std::string::npos);
  EXPECT_NE(error_of("root ::= <a\nb>").find("special token"), std::string::npos);
}

// Limits that keep a small grammar from costing unbounded stack or memory.
TEST(GbnfParser, PostfixChainsAndNestedRepeatsAreBounded) {
  EXPECT_NE(error_of("root ::= \"a\"" + std::string(300, '?')).find("repetition operators nested deeper than 200"),
            std::string::npos);
  EXPECT_EQ(error_of("root ::= \"a\"" + std::string(20, '?')), "(ok)");
  // ~4M elements, then 10,000 optional copies of them: refused as too large
  // before the copies are made.
  EXPECT_NE(error_of("root ::= \"a\"{2000}{2000}{0,10000}").find("too large"), std::string::npos);
}

TEST(GbnfParser, ErrorsNameLineColumnAndProblem) {
  EXPECT_EQ(error_of("root ::= \"a"), "grammar line 1, column 12: unterminated string literal");
  EXPECT_EQ(error_of("root ::= [a-"), "grammar line 1, column 13: unterminated character class");
  EXPECT_EQ(error_of("root ::= (\"a\""), "grammar line 1, column 14: expected ')'");
  EXPECT_EQ(error_of("root \"a\""), "grammar line 1, column 6: expected '::=' after rule name 'root'");
  EXPECT_EQ(error_of("root ::= x\n"), "grammar line 1, column 10: rule 'x' is used but not defined");
  EXPECT_EQ(error_of("start ::= \"a\""), "grammar: no rule named 'root' (the start rule)");
  EXPECT_EQ(error_of("root ::= \"a\"\nroot ::= \"b\""),
            "grammar line 2, column 1: rule 'root' is defined twice (first on line 1)");
  EXPECT_EQ(error_of("root ::= \"a\"{3,2}"), "grammar line 1, column 18: repetition {m,n} with m > n");
  EXPECT_EQ(error_of("root ::= \"a\"{99999}"), "grammar line 1, column 18: repetition count above 10000");
  EXPECT_EQ(error_of("root ::= \"\\q\""), "grammar line 1, column 13: unknown escape '\\q'");
  EXPECT_EQ(error_of("root ::= \"\\x4\""), "grammar line 1, column 14: \\x needs 2 hex digits");
  EXPECT_EQ(error_of("root ::= [z-a]"), "grammar line 1, column 14: character range with its end before its start");
  EXPECT_EQ(error_of("root ::= @"), "grammar line 1, column 10: unexpected character '@'");
  EXPECT_EQ(error_of("root ::= \"\xff\""), "grammar: the text is not valid UTF-8");
  EXPECT_EQ(error_of(std::string(300, '(')), "grammar line 1, column 1: expected a rule name");
  EXPECT_EQ(error_of("root ::= " + std::string(300, '(')), "grammar line 1, column 211: groups nested deeper than 200");
}

TEST(GbnfParser, CompilerRejectsLeftRecursionNamingTheRule) {
  EXPECT_EQ(error_of("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]"),
            "grammar: rule 'expr' is left-recursive (expr -> expr); rewrite it with repetition, e.g. a ::= b "
            "(\"op\" b)*");
  EXPECT_EQ(error_of("root ::= a\na ::= b? \"x\" | \"y\"\nb ::= \"z\" | a"),
            "grammar: rule 'a' is left-recursive (a -> b -> a); rewrite it with repetition, e.g. a ::= b (\"op\" b)*");
  EXPECT_EQ(error_of("root ::= (\"a\"?)*"),
            "grammar line 1, column 16: a repetition of something that can match the empty string (ambiguous "
            "without end)");
  EXPECT_EQ(error_of("root ::= (\"a\"?){0,5}"),
            "grammar line 1, column 16: a repetition of something that can match the empty string (ambiguous "
            "without end)");
  EXPECT_EQ(error_of("root ::= (\"a\"?)? \"b\"* \"c\"{0,3}"), "(ok)");
  EXPECT_EQ(error_of("root ::= \"(\" root \")\" | \"\""), "(ok)");  // right/center recursion is fine
}

}  // namespace
}  // namespace rill::grammar
