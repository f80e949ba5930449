// Fuzz target for the GBNF parser and compiler, and the matcher behind them.
// Input: a grammar text, then (after the first 0x00 byte, if any) a text to
// match. Checks: parsing never crashes and either compiles or gives an
// error starting "grammar"; a compiled grammar's matcher consumes the text
// byte by byte without crashing, stays within the stack bounds, and a
// refused byte leaves the state as it was.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "text/grammar/grammar_matcher.h"

#define FUZZ_CHECK(cond)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t cut = in.find('\0');
  const std::string_view grammar_text = in.substr(0, cut);
  const std::string_view text = cut == std::string_view::npos ? std::string_view() : in.substr(cut + 1);
  auto g = rill::grammar::CompiledGrammar::from_gbnf(grammar_text);
  if (!g.ok()) {
    FUZZ_CHECK(g.error().message.rfind("grammar", 0) == 0);
    return 0;
  }
  rill::grammar::GrammarMatcher m(*g);
  for (char c : text.substr(0, 256)) {
    const rill::grammar::StackSet before = m.state();
    const bool ok = m.accept_bytes(std::string_view(&c, 1));
    FUZZ_CHECK(m.state().size() <= rill::grammar::kMaxStacks);
    if (!ok) FUZZ_CHECK(m.state() == before);
  }
  (void)m.can_end();
  return 0;
}
