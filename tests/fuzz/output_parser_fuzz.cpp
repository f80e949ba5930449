// Fuzz target for OutputParser.
// Input: byte 0 = options (bit 0 parse_reasoning, bit 1 starts_in_reasoning,
// bit 2 parse_tool_calls, bit 3 harmony); byte 1 = seed of the split points; the rest = the
// generated text.
// Checks: the result (content, reasoning, tool calls) is the same when the
// text is pushed whole, byte by byte and in the seeded random pieces; every
// tool call has an id and a non-empty name and streamed first (a first delta
// with its id and name, then argument pieces that add up to its arguments);
// saw_tool_calls() agrees with the calls returned; with both parsers off the
// content is the text itself.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "text/output_parser.h"

namespace {

#define FUZZ_CHECK(cond)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

struct Parsed {
  std::string content, reasoning, calls;  // calls as "name\0arguments\0..."
  bool saw = false;
  bool operator==(const Parsed&) const = default;
};

void append(Parsed& p, const rill::OutputDelta& d, std::vector<rill::ToolCall>& streamed, size_t& n_ended) {
  p.content += d.content;
  p.reasoning += d.reasoning;
  for (const rill::ToolCallDelta& td : d.tool_call_deltas) {
    if (td.index == streamed.size()) {
      FUZZ_CHECK(!td.name.empty() && td.arguments.empty());
      streamed.push_back({td.id, td.name, ""});
    } else {
      FUZZ_CHECK(td.index + 1 == streamed.size() && td.name.empty() && td.id.empty());
      streamed.back().arguments += td.arguments;
    }
  }
  for (const rill::ToolCall& c : d.tool_calls) {
    FUZZ_CHECK(c.id.rfind("call_", 0) == 0);
    FUZZ_CHECK(!c.name.empty());
    FUZZ_CHECK(n_ended < streamed.size());
    FUZZ_CHECK(streamed[n_ended].id == c.id && streamed[n_ended].name == c.name);
    FUZZ_CHECK(streamed[n_ended].arguments == c.arguments);
    ++n_ended;
    p.calls += c.name;
    p.calls += '\0';
    p.calls += c.arguments;
    p.calls += '\0';
  }
}

Parsed run(const rill::OutputParserOptions& o, const std::vector<std::string_view>& pieces) {
  rill::OutputParser parser(o);
  Parsed p;
  std::vector<rill::ToolCall> streamed;
  size_t n_ended = 0;
  for (std::string_view s : pieces) {
    rill::OutputDelta d;
    parser.push(s, d);
    append(p, d, streamed, n_ended);
  }
  rill::OutputDelta d;
  parser.finish(d);
  append(p, d, streamed, n_ended);
  FUZZ_CHECK(n_ended == streamed.size());
  p.saw = parser.saw_tool_calls();
  FUZZ_CHECK(p.saw == !p.calls.empty());
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  rill::OutputParserOptions o;
  o.parse_reasoning = data[0] & 1;
  o.starts_in_reasoning = data[0] & 2;
  o.parse_tool_calls = data[0] & 4;
  o.harmony = data[0] & 8;
  std::mt19937 rng(data[1]);
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);

  const Parsed whole = run(o, {text});
  if (!o.parse_reasoning && !o.parse_tool_calls && !o.harmony) FUZZ_CHECK(whole.content == text);
  std::vector<std::string_view> bytes, pieces;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  FUZZ_CHECK(run(o, bytes) == whole);
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = std::uniform_int_distribution<size_t>(0, 12)(rng);
    pieces.push_back(text.substr(pos, n));
    pos += n;
  }
  FUZZ_CHECK(run(o, pieces) == whole);
  return 0;
}
