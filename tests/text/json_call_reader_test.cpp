// JsonCallReader against the reference it must match: parse_tool_call_json
// (nlohmann's parser behind core/json_parse). On valid calls and on tens of
// thousands of byte mutations of them, the reader accepts exactly what the
// reference accepts and produces the same arguments text; read byte by byte
// it produces the same as read whole.
#include "text/json_call_reader.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "text/output_parser.h"

namespace rill {
namespace {

struct Outcome {
  bool ok = false;
  std::string name, arguments;
  bool operator==(const Outcome&) const = default;
};

// The reader over `text` (split into pieces of `step` bytes; 0: whole):
// a call when the object completed and only whitespace follows it, as the
// reference requires of a whole text.
Outcome read_call(std::string_view text, bool require_arguments, size_t step) {
  JsonCallReader reader(require_arguments);
  std::string arguments;
  size_t pos = 0;
  while (pos < text.size() && reader.status() == JsonCallReader::Status::kReading) {
    const size_t n = step == 0 ? text.size() - pos : std::min(step, text.size() - pos);
    const size_t used = reader.read(text.substr(pos, n));
    pos += used;
    if (reader.is_call()) arguments += reader.take_arguments();
    if (used < n) break;
  }
  reader.finish();
  if (reader.is_call()) arguments += reader.take_arguments();
  Outcome o;
  if (reader.status() != JsonCallReader::Status::kComplete) return o;
  for (size_t i = pos; i < text.size(); ++i) {
    const char c = text[i];
    if (c != ' ' && c != '\n' && c != '\t' && c != '\r') return o;
  }
  o.ok = true;
  o.name = reader.name();
  o.arguments = arguments;
  return o;
}

Outcome reference(std::string_view text, bool require_arguments) {
  ToolCall call;
  Outcome o;
  o.ok = parse_tool_call_json(text, require_arguments, call);
  if (o.ok) {
    o.name = call.name;
    o.arguments = call.arguments;
  }
  return o;
}

// Keys at one level have distinct lengths, so no mutation of one byte makes
// two keys equal (duplicate keys are the one documented difference).
const std::vector<std::string> kCalls = {
    R"({"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2.5, -3e2], "ok": true}})",
    R"({"name":"f","parameters":{"a":null,"bb":false,"ccc":{"d":[{}, [], ""]}}})",
    R"(  {"arguments": {"q": "x\"y\\z\/\u00e9\ud83d\ude00\n"}, "name": "late", "id": 7}  )",
    R"({"name": "s", "arguments": "{\"a\": [1, 2], \"b\": \"\\u00e9\"}"})",
    R"({"name": "n", "arguments": null, "x": 0.0})",
    R"({"name": "none"})",
    "{\"name\": \"u\", \"arguments\": {\"t\": \"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\", \"nn\": 10}}",
    R"({"name": "num", "arguments": {"a": 0, "bb": -0.125, "ccc": 1E+3, "dddd": 123456789012345678901234}})",
};

TEST(JsonCallReader, ValidCallsMatchTheReference) {
  for (const std::string& text : kCalls) {
    for (bool require : {false, true}) {
      SCOPED_TRACE(text + (require ? " (arguments required)" : ""));
      const Outcome want = reference(text, require);
      EXPECT_EQ(read_call(text, require, 0), want);
      EXPECT_EQ(read_call(text, require, 1), want);
      EXPECT_EQ(read_call(text, require, 5), want);
    }
  }
  EXPECT_TRUE(reference(kCalls[0], true).ok);
  EXPECT_FALSE(reference(kCalls[5], true).ok);
  EXPECT_TRUE(reference(kCalls[5], false).ok);
}

TEST(JsonCallReader, NameAndArgumentsAreKnownAsSoonAsTheyAreRead) {
  JsonCallReader reader(/*require_arguments=*/true);
  const std::string head = R"({"name": "f", "arguments": {"city": "Pa)";
  EXPECT_EQ(reader.read(head), head.size());
  EXPECT_TRUE(reader.is_call());
  EXPECT_EQ(reader.name(), "f");
  EXPECT_EQ(reader.take_arguments(), R"({"city":"Pa)");
  EXPECT_EQ(reader.read("ris\", \"n\": 12"), 13u);
  EXPECT_EQ(reader.take_arguments(), R"(ris","n":)");  // 12 may go on
  EXPECT_EQ(reader.read("}} tail"), 2u);               // stops after the object
  EXPECT_EQ(reader.status(), JsonCallReader::Status::kComplete);
  EXPECT_EQ(reader.take_arguments(), "12}");
  // A multi-byte character or an escape is held until complete.
  JsonCallReader r2(false);
  r2.read("{\"name\": \"g\", \"arguments\": {\"e\": \"\xc3");
  EXPECT_EQ(r2.take_arguments(), R"({"e":")");
  r2.read("\xa9\\u00");
  EXPECT_EQ(r2.take_arguments(), "\xc3\xa9");
  r2.read("e9\\ud83d");
  EXPECT_EQ(r2.take_arguments(), "\xc3\xa9");
  r2.read("\\ude00");
  EXPECT_EQ(r2.take_arguments(), "\xf0\x9f\x98\x80");
  // Required arguments: a name alone is no call yet.
  JsonCallReader r3(true);
  r3.read(R"({"name": "h", "parameters": )");
  EXPECT_FALSE(r3.is_call());
  r3.read("\"");
  EXPECT_TRUE(r3.is_call());
}

TEST(JsonCallReader, ArgumentsOnlyReadsABareValue) {
  // Mistral's name[ARGS]{...}: the value alone, a call from its first byte.
  JsonCallReader r = JsonCallReader::arguments_only();
  const std::string head = R"({"a": [1.50, "\u00e9"])";
  EXPECT_EQ(r.read(head), head.size());
  EXPECT_TRUE(r.is_call());
  EXPECT_EQ(r.take_arguments(), "{\"a\":[1.5,\"\xc3\xa9\"]");
  EXPECT_EQ(r.read("}[TOOL_CALLS]"), 1u);
  EXPECT_EQ(r.status(), JsonCallReader::Status::kComplete);
  EXPECT_EQ(r.take_arguments(), "}");
  JsonCallReader text = JsonCallReader::arguments_only();
  const std::string quoted = R"("{\"a\": 1}" tail)";
  EXPECT_EQ(text.read(quoted), quoted.find(" tail"));
  EXPECT_EQ(text.status(), JsonCallReader::Status::kComplete);
  EXPECT_EQ(text.take_arguments(), R"({"a": 1})");
  JsonCallReader bad = JsonCallReader::arguments_only();
  EXPECT_EQ(bad.read("[1]"), 0u);
  EXPECT_EQ(bad.status(), JsonCallReader::Status::kInvalid);
  EXPECT_FALSE(bad.is_call());
}

TEST(JsonCallReader, InvalidTextStopsAtTheOffendingByte) {
  JsonCallReader reader(false);
  const std::string broken = R"({"name": "f", "arguments": {"x": tru}})";
  EXPECT_EQ(reader.read(broken), broken.find("u}") + 1);
  EXPECT_EQ(reader.status(), JsonCallReader::Status::kInvalid);
  EXPECT_TRUE(reader.is_call());
  JsonCallReader unnamed(false);
  EXPECT_EQ(unnamed.read(R"({"name": 3})"), 9u);
  EXPECT_FALSE(unnamed.is_call());
  JsonCallReader deep(false);
  const std::string text = R"({"name": "f", "arguments": {"x": )" + std::string(200, '[');
  EXPECT_EQ(deep.read(text), text.size() - 200 + 126);  // 128 containers at most, the call object included
  EXPECT_EQ(deep.status(), JsonCallReader::Status::kInvalid);
}

TEST(JsonCallReader, MutatedCallsMatchTheReference) {
  static const std::string kAlphabet =
      "{}[]\":,\\ \n0123456789eE.-+tfnulrsa/bxz"
      "\x01\x7f\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xed\xa0\xc0\xff";
  std::mt19937 rng(20261202);
  int n_ok = 0, n_checked = 0;
  for (int trial = 0; trial < 40000; ++trial) {
    std::string text = kCalls[rng() % kCalls.size()];
    const int n_mutations = 1 + int(rng() % 3);
    for (int m = 0; m < n_mutations && !text.empty(); ++m) {
      const size_t at = rng() % text.size();
      const char c = kAlphabet[rng() % kAlphabet.size()];
      switch (rng() % 4) {
        case 0:
          text[at] = c;
          break;
        case 1:
          text.erase(at, 1);
          break;
        case 2:
          text.insert(text.begin() + long(at), c);
          break;
        default:
          text.insert(at, text.substr(at, 1 + rng() % 4));
          break;
      }
    }
    const bool require = rng() % 2 == 0;
    const Outcome want = reference(text, require);
    ASSERT_EQ(read_call(text, require, 0), want) << text;
    ASSERT_EQ(read_call(text, require, 1 + rng() % 7), want) << text;
    n_ok += want.ok;
    ++n_checked;
  }
  // Both outcomes are well represented.
  EXPECT_GT(n_ok, n_checked / 20);
  EXPECT_LT(n_ok, n_checked - n_checked / 20);
}

}  // namespace
}  // namespace rill
