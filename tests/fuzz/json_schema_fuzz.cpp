// Fuzz target for the JSON Schema converter (and the regex converter under
// `pattern`). Input: a JSON text; when it parses, it is converted. Checks:
// never crashes; a refusal's message starts "json_schema: "; an accepted
// schema's grammar always parses and compiles (the converter only writes
// grammars the compiler takes), and its matcher runs on the JSON text
// itself without crashing.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "text/grammar/grammar_matcher.h"
#include "text/grammar/json_schema_grammar.h"

#define FUZZ_CHECK(cond)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  nlohmann::ordered_json schema = nlohmann::ordered_json::parse(in, nullptr, false);
  if (schema.is_discarded()) return 0;
  auto gbnf = rill::grammar::json_schema_to_gbnf(schema);
  if (!gbnf.ok()) {
    FUZZ_CHECK(gbnf.error().message.rfind("json_schema: ", 0) == 0);
    return 0;
  }
  auto g = rill::grammar::CompiledGrammar::from_gbnf(*gbnf);
  if (!g.ok()) {
    // Only size limits may refuse a converter's grammar.
    const std::string& e = g.error().message;
    if (e.find("too large") == std::string::npos && e.find("repetition count above") == std::string::npos) {
      std::fprintf(stderr, "%s\n%s\n", e.c_str(), gbnf->c_str());
      std::abort();
    }
    return 0;
  }
  rill::grammar::GrammarMatcher m(*g);
  (void)m.accept_bytes(in.substr(0, 512));
  return 0;
}
