// 240 JSON Schemas of real-world shape (tests/data/grammar/schema_corpus.json,
// tools/make_json_schema_corpus.py): each compiles, accepts the instances
// the Python `jsonschema` package validated, rejects the non-instances it
// refused, and its random walks (strings the grammar can produce) parse as
// JSON; 40 more carry a keyword the converter refuses and must be refused
// naming it and where it is. With RILL_SCHEMA_WALKS_OUT set, the walks are
// written there (JSON lines {case, text}) for
// tests/integration/test_schema_corpus.py to validate with jsonschema.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text/grammar/compiled_grammar.h"
#include "text/grammar/grammar_matcher.h"
#include "text/grammar/json_schema_grammar.h"

#include "../../sanitizer_stride.h"

namespace rill::grammar {
namespace {

using Json = nlohmann::ordered_json;

Json load_corpus() {
  std::ifstream f(std::string(RILL_TEST_DATA) + "/grammar/schema_corpus.json");
  EXPECT_TRUE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  return Json::parse(ss.str());
}

bool matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view s) {
  GrammarMatcher m(g);
  return m.accept_bytes(s) && m.can_end();
}

// A random string of the grammar: bytes drawn from those it allows
// (printable ASCII first; any byte only where no ASCII one fits), stopping
// where it may end with probability 1/4. nullopt if it runs past 6000 bytes.
std::optional<std::string> random_walk(const std::shared_ptr<const CompiledGrammar>& g, std::mt19937& rng) {
  GrammarMatcher m(g);
  std::string out;
  std::vector<uint8_t> allowed;
  while (out.size() < 6000) {
    if (m.must_end() || (m.can_end() && rng() % 4 == 0)) return out;
    allowed.clear();
    auto probe = [&](int b) {
      GrammarMatcher p = m;
      if (p.accept_bytes(std::string(1, static_cast<char>(b)))) allowed.push_back(static_cast<uint8_t>(b));
    };
    for (int b = 0x20; b < 0x7F; ++b) probe(b);
    // Whitespace between tokens only now and then, so walks end.
    if (!allowed.empty() && rng() % 8 != 0) {
      std::vector<uint8_t> solid;
      for (uint8_t b : allowed) {
        if (b != ' ') solid.push_back(b);
      }
      if (!solid.empty()) allowed.swap(solid);
    }
    if (allowed.empty()) {
      for (int b = 0; b < 256; ++b) {
        if (b < 0x20 || b >= 0x7F) probe(b);
      }
    }
    if (allowed.empty()) return std::nullopt;
    const char c = static_cast<char>(allowed[rng() % allowed.size()]);
    EXPECT_TRUE(m.accept_bytes(std::string(1, c)));
    out += c;
  }
  return std::nullopt;
}

TEST(SchemaCorpus, EverySchemaCompilesAndAgreesWithJsonschema) {
  const Json corpus = load_corpus();
  ASSERT_GE(corpus["cases"].size(), 200u);
  const char* walks_path = std::getenv("RILL_SCHEMA_WALKS_OUT");
  std::ofstream walks_out;
  if (walks_path != nullptr) walks_out.open(walks_path);
  std::mt19937 rng(20261202);
  size_t n_instances = 0, n_non_instances = 0, n_walks = 0, n_with_ref = 0;
  for (size_t i = 0; i < corpus["cases"].size(); ++i) {
    const Json& c = corpus["cases"][i];
    const std::string schema = c["schema"].dump();
    SCOPED_TRACE("case " + std::to_string(i) + ": " + schema);
    n_with_ref += schema.find("$ref") != std::string::npos;
    auto gbnf = json_schema_to_gbnf(c["schema"]);
    ASSERT_TRUE(gbnf.ok()) << gbnf.error().message;
    auto g = CompiledGrammar::from_gbnf(*gbnf);
    ASSERT_TRUE(g.ok()) << g.error().message << "\n" << *gbnf;
    for (const Json& instance : c["instances"]) {
      EXPECT_TRUE(matches(*g, instance.get<std::string>())) << "jsonschema-valid, refused: " << instance;
      ++n_instances;
    }
    for (const Json& instance : c["non_instances"]) {
      EXPECT_FALSE(matches(*g, instance.get<std::string>())) << "jsonschema-invalid, accepted: " << instance;
      ++n_non_instances;
    }
    // Two walks a schema; under the sanitizers every 4th schema's
    // (sanitizer_stride.h).
    for (int w = 0; w < 2 && i % testing::kSanitizerStride == 0; ++w) {
      auto text = random_walk(*g, rng);
      if (!text) continue;
      ++n_walks;
      EXPECT_TRUE(Json::accept(*text)) << *text;
      if (walks_out.is_open()) walks_out << Json{{"case", i}, {"text", *text}}.dump() << "\n";
    }
  }
  EXPECT_GE(n_instances, 600u);
  EXPECT_GE(n_non_instances, 600u);
  EXPECT_GE(n_walks, corpus["cases"].size() / testing::kSanitizerStride);
  EXPECT_GE(n_with_ref, 40u);
  std::printf(
      "schema corpus: %zu schemas (%zu with $ref), %zu instances accepted, %zu non-instances refused, %zu walks\n",
      corpus["cases"].size(), n_with_ref, n_instances, n_non_instances, n_walks);
}

TEST(SchemaCorpus, UnsupportedKeywordsAreRefusedByName) {
  const Json corpus = load_corpus();
  ASSERT_GE(corpus["unsupported"].size(), 40u);
  std::map<std::string, int> by_keyword;
  for (const Json& c : corpus["unsupported"]) {
    auto gbnf = json_schema_to_gbnf(c["schema"]);
    ASSERT_FALSE(gbnf.ok()) << c["schema"].dump() << " gave\n" << *gbnf;
    const std::string expected = "'" + c["keyword"].get<std::string>() + "' at " + c["path"].get<std::string>();
    EXPECT_NE(gbnf.error().message.find(expected), std::string::npos)
        << gbnf.error().message << "\nexpected it to name " << expected;
    ++by_keyword[c["keyword"].get<std::string>()];
  }
  std::string counts;
  for (const auto& [k, n] : by_keyword) counts += " " + k + "=" + std::to_string(n);
  std::printf("refused keywords:%s\n", counts.c_str());
}

}  // namespace
}  // namespace rill::grammar
