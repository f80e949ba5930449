// JSON Schema to grammar, held to the Python `jsonschema` package: for
// every (schema, instance) case of tests/data/grammar/json_schema_golden.json
// (tools/make_json_schema_golden.py) the grammar accepts the instance text
// iff jsonschema says it is valid; every unsupported schema is refused with
// an error naming its keyword. Plus regex, choice and json_object grammars.
#include "text/grammar/json_schema_grammar.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text/grammar/grammar_matcher.h"
#include "text/grammar/regex_grammar.h"

namespace rill::grammar {
namespace {

using Json = nlohmann::ordered_json;

Json load_golden() {
  std::ifstream f(std::string(RILL_TEST_DATA) + "/grammar/json_schema_golden.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return Json::parse(ss.str());
}

bool matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view s) {
  GrammarMatcher m(g);
  return m.accept_bytes(s) && m.can_end();
}

TEST(JsonSchemaGrammar, AgreesWithJsonschemaOnEveryGoldenCase) {
  const Json golden = load_golden();
  ASSERT_GE(golden["cases"].size(), 200u);
  size_t n_valid = 0, n_checked = 0;
  for (const auto& c : golden["cases"]) {
    const std::string schema = c["schema"].dump();
    auto gbnf = json_schema_to_gbnf(c["schema"]);
    ASSERT_TRUE(gbnf.ok()) << schema << ": " << gbnf.error().message;
    auto g = CompiledGrammar::from_gbnf(*gbnf);
    ASSERT_TRUE(g.ok()) << schema << ": " << g.error().message << "\n" << *gbnf;
    const std::string instance = c["instance"].get<std::string>();
    EXPECT_EQ(matches(*g, instance), c["valid"].get<bool>()) << "schema " << schema << "\ninstance " << instance;
    n_valid += c["valid"].get<bool>();
    ++n_checked;
  }
  EXPECT_GT(n_valid, 100u);
  EXPECT_GT(n_checked - n_valid, 100u);
}

TEST(JsonSchemaGrammar, RefusesWhatItCannotEnforceNamingTheKeyword) {
  const Json golden = load_golden();
  ASSERT_GE(golden["unsupported"].size(), 20u);
  for (const auto& c : golden["unsupported"]) {
    auto gbnf = json_schema_to_gbnf(c["schema"]);
    ASSERT_FALSE(gbnf.ok()) << c["schema"].dump() << " gave\n" << *gbnf;
    EXPECT_NE(gbnf.error().message.find(c["error_contains"].get<std::string>()), std::string::npos)
        << gbnf.error().message;
    EXPECT_EQ(gbnf.error().message.rfind("json_schema: ", 0), 0u) << gbnf.error().message;
  }
}

TEST(JsonSchemaGrammar, JsonObjectIsAnyObject) {
  auto g = CompiledGrammar::from_gbnf(json_object_gbnf());
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(matches(*g, R"({"a": [1, -2.5e+3, true, null, {"b": "\u00e9\n"}], "c": {}})"));
  EXPECT_TRUE(matches(*g, "{}"));
  EXPECT_FALSE(matches(*g, "[1]"));
  EXPECT_FALSE(matches(*g, R"({"a": 01})"));
  EXPECT_FALSE(matches(*g, R"({"a" 1})"));
  EXPECT_FALSE(matches(*g, R"({'a': 1})"));
}

TEST(RegexGrammar, WholeMatchSemantics) {
  struct Case {
    const char* regex;
    std::vector<const char*> yes, no;
  };
  const std::vector<Case> cases = {
      {"[A-Z][a-z]*( [A-Z][a-z]*)?", {"Ada", "Ada Lovelace", "A"}, {"ada", "Ada  L", ""}},
      {"\\d{3}-\\d{4}", {"555-1234"}, {"5551234", "55-1234"}},
      {"(cat|dog)s?", {"cat", "dogs"}, {"cats!", "bird"}},
      {"a.c",
       {"abc", "a\"c",
        "a\xc3\xa9"
        "c"},
       {"a\nc", "ac"}},
      {"[^0-9]+", {"abc", "\xe4\xb8\xad"}, {"a1"}},
      {"x{2,}y?", {"xx", "xxxxy"}, {"x", "xy"}},
      {"\\u00e9\\x41\\.",
       {"\xc3\xa9"
        "A."},
       {"\xc3\xa9"
        "Ab"}},
      {"(?:ab)+?", {"ab", "abab"}, {"aba"}},
      {"^yes$", {"yes"}, {"yess"}},
  };
  for (const auto& c : cases) {
    auto gbnf = regex_to_gbnf(c.regex);
    ASSERT_TRUE(gbnf.ok()) << c.regex << ": " << gbnf.error().message;
    auto g = CompiledGrammar::from_gbnf(*gbnf);
    ASSERT_TRUE(g.ok()) << c.regex << ": " << g.error().message << "\n" << *gbnf;
    for (const char* s : c.yes) EXPECT_TRUE(matches(*g, s)) << c.regex << " ~ " << s;
    for (const char* s : c.no) EXPECT_FALSE(matches(*g, s)) << c.regex << " !~ " << s;
  }
}

TEST(RegexGrammar, ErrorsNameTheConstruct) {
  EXPECT_EQ(regex_to_gbnf("(a").error().message, "regex: '(' without ')' at offset 2");
  EXPECT_EQ(regex_to_gbnf("a)").error().message, "regex: unbalanced ')' at offset 1");
  EXPECT_EQ(regex_to_gbnf("[a-").error().message, "regex: '[' without ']' at offset 3");
  EXPECT_EQ(regex_to_gbnf("*a").error().message, "regex: nothing to repeat at offset 0");
  EXPECT_EQ(regex_to_gbnf("(a)\\1").error().message, "regex: backreferences (\\1) are not supported at offset 5");
  EXPECT_EQ(regex_to_gbnf("a(?!b)").error().message, "regex: lookaround assertions are not supported at offset 2");
  EXPECT_EQ(regex_to_gbnf("a^b").error().message, "regex: '^' is supported only at the start at offset 1");
  EXPECT_EQ(regex_to_gbnf("[z-a]").error().message, "regex: range out of order in character class at offset 4");
  EXPECT_EQ(regex_to_gbnf("a++").error().message, "regex: possessive quantifiers are not supported at offset 2");
  // A repeated group that can match nothing: refused in the regex's terms,
  // never handed out as a grammar that does not compile.
  for (const char* re : {"(a*)*", "()+", "(a?){2,5}"}) {
    EXPECT_EQ(regex_to_gbnf(re).error().message,
              "regex: a repeated group that can match the empty string (such as (a*)*) is not supported")
        << re;
  }
  EXPECT_TRUE(regex_to_gbnf("[\\k]").ok() || regex_to_gbnf("[\\k]").error().message.rfind("regex: ", 0) == 0);
}

TEST(ChoiceGrammar, ExactlyOneOfTheStrings) {
  auto gbnf = choice_gbnf({"yes", "no", "maybe \"so\""});
  ASSERT_TRUE(gbnf.ok());
  auto g = CompiledGrammar::from_gbnf(*gbnf);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(matches(*g, "yes"));
  EXPECT_TRUE(matches(*g, "maybe \"so\""));
  EXPECT_FALSE(matches(*g, "yesno"));
  EXPECT_FALSE(matches(*g, "ye"));
  EXPECT_EQ(choice_gbnf({}).error().message, "choice: the list is empty");
}

}  // namespace
}  // namespace rill::grammar
