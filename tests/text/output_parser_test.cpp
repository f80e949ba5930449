// OutputParser: expected splits of whole replies (reasoning, content, tool
// calls in the Hermes/Qwen and Llama-3 forms, malformed calls that stay
// content, calls that break after their name streamed), streamed calls (the
// name first, then argument pieces as they are read), and split invariance:
// for every case, any split of the text into pushes (random cut points, one
// byte at a time) gives the same result as one push, and nothing streamed is
// taken back (the concatenated content is the final content, so no partial
// marker ever streamed as content; the concatenated argument pieces of each
// call are its final arguments).
#include "text/output_parser.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace rill {
namespace {

struct Parsed {
  std::string content, reasoning;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  bool saw_calls = false;
  bool operator==(const Parsed&) const = default;
};

// What the call deltas said, per call index: id, name, concatenated arguments.
struct Streamed {
  std::vector<ToolCall> calls;
  size_t n_ended = 0;
};

void append(Parsed& p, const OutputDelta& d, Streamed& s) {
  p.content += d.content;
  p.reasoning += d.reasoning;
  for (const ToolCallDelta& td : d.tool_call_deltas) {
    if (td.index == s.calls.size()) {  // a new call: id and name, no arguments yet
      EXPECT_FALSE(td.name.empty());
      EXPECT_EQ(td.arguments, "");
      s.calls.push_back({td.id, td.name, ""});
    } else {
      ASSERT_EQ(td.index + 1, s.calls.size()) << "arguments for a call that is not the open one";
      EXPECT_EQ(td.id, "");
      EXPECT_EQ(td.name, "");
      EXPECT_FALSE(td.arguments.empty());
      s.calls.back().arguments += td.arguments;
    }
  }
  for (const ToolCall& c : d.tool_calls) {
    EXPECT_EQ(c.id.rfind("call_", 0), 0u);
    EXPECT_EQ(c.id.size(), 29u);
    // Every call streamed first, and its pieces add up to it byte for byte.
    EXPECT_LT(s.n_ended, s.calls.size());
    if (s.n_ended < s.calls.size()) {
      const ToolCall& streamed = s.calls[s.n_ended];
      EXPECT_EQ(streamed.id, c.id);
      EXPECT_EQ(streamed.name, c.name);
      EXPECT_EQ(streamed.arguments, c.arguments);
    }
    ++s.n_ended;
    p.calls.emplace_back(c.name, c.arguments);
  }
}

Parsed parse_pieces(const OutputParserOptions& o, const std::vector<std::string>& pieces) {
  OutputParser parser(o);
  Parsed p;
  Streamed streamed;
  for (const std::string& s : pieces) {
    OutputDelta d;
    parser.push(s, d);
    append(p, d, streamed);
  }
  OutputDelta d;
  parser.finish(d);
  append(p, d, streamed);
  EXPECT_EQ(streamed.n_ended, streamed.calls.size()) << "a streamed call never ended";
  p.saw_calls = parser.saw_tool_calls();
  return p;
}

Parsed parse_whole(const OutputParserOptions& o, const std::string& text) {
  return parse_pieces(o, {text});
}

OutputParserOptions tools_on() {
  OutputParserOptions o;
  o.parse_tool_calls = true;
  return o;
}

TEST(OutputParser, PlainTextIsContentVerbatim) {
  OutputParserOptions o;
  o.parse_reasoning = false;
  const std::string text = "  Hello <think> {\"name\": \"x\", \"arguments\": {}}\n\n";
  EXPECT_EQ(parse_whole(o, text).content, text);
  // Reasoning parsing on but no think block: still verbatim.
  EXPECT_EQ(parse_whole(OutputParserOptions{}, "Hello\n world\n").content, "Hello\n world\n");
  EXPECT_EQ(parse_whole(OutputParserOptions{}, "\n<b>bold</b>").content, "\n<b>bold</b>");
}

TEST(OutputParser, ThinkBlockIsReasoning) {
  Parsed p = parse_whole(OutputParserOptions{}, "<think>\nLet me see.\n2+2=4\n</think>\n\nThe answer is 4.");
  EXPECT_EQ(p.reasoning, "Let me see.\n2+2=4");
  EXPECT_EQ(p.content, "The answer is 4.");

  OutputParserOptions open;
  open.starts_in_reasoning = true;  // the template already wrote <think>
  p = parse_whole(open, "\nhmm\n</think>\nDone");
  EXPECT_EQ(p.reasoning, "hmm");
  EXPECT_EQ(p.content, "Done");

  // Unfinished think block: reasoning.
  p = parse_whole(open, "still thinking ");
  EXPECT_EQ(p.reasoning, "still thinking");
  EXPECT_EQ(p.content, "");

  // Reasoning off: the tags are content.
  OutputParserOptions off;
  off.parse_reasoning = false;
  off.starts_in_reasoning = true;
  p = parse_whole(off, "<think>x</think>y");
  EXPECT_EQ(p.content, "<think>x</think>y");
  EXPECT_EQ(p.reasoning, "");
}

TEST(OutputParser, HermesToolCalls) {
  Parsed p = parse_whole(tools_on(),
                         "I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                         "\"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n"
                         "</tool_call>\n");
  EXPECT_EQ(p.content, "I'll check.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].first, "get_weather");
  EXPECT_EQ(p.calls[0].second, R"({"city":"Paris","days":[1,2]})");  // key order kept
  EXPECT_EQ(p.calls[1].first, "now");
  EXPECT_EQ(p.calls[1].second, "{}");
  EXPECT_TRUE(p.saw_calls);

  // Arguments given as JSON text, "parameters" instead of "arguments", none at all.
  p = parse_whole(tools_on(),
                  "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>"
                  "<tool_call>{\"name\": \"g\", \"parameters\": {\"b\": true}}</tool_call>"
                  "<tool_call>{\"name\": \"h\"}</tool_call>");
  ASSERT_EQ(p.calls.size(), 3u);
  EXPECT_EQ(p.calls[0].second, "{\"a\": 1}");
  EXPECT_EQ(p.calls[1].second, R"({"b":true})");
  EXPECT_EQ(p.calls[2].second, "{}");
  EXPECT_EQ(p.content, "");

  // Tool calls after a think block; text after the calls is content.
  OutputParserOptions o = tools_on();
  p = parse_whole(o,
                  "<think>need weather</think>\n<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>\n"
                  "\nAnything else?");
  EXPECT_EQ(p.reasoning, "need weather");
  EXPECT_EQ(p.content, "Anything else?");
  ASSERT_EQ(p.calls.size(), 1u);
}

TEST(OutputParser, AToolCallNestedBeyondTheJsonLimitBreaksOffWithoutRecursing) {
  // A prompt can make the model write this; reading it recursively would
  // overflow the stack. The name has streamed, so it stays a call cut off at
  // the limit (128 containers, the call object included), and the rest of the
  // block is dropped.
  const std::string deep = std::string(50000, '[') + std::string(50000, ']');
  const std::string text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": " + deep + "}}</tool_call> after";
  Parsed p = parse_whole(tools_on(), text);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, "{\"x\":" + std::string(126, '['));
  EXPECT_EQ(p.content, "after");
  // Before the name it is not a call: content, as any block that is not one.
  const std::string unnamed = "<tool_call>{\"arguments\": " + deep + ", \"name\": \"f\"}</tool_call>";
  p = parse_whole(tools_on(), unnamed);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, unnamed);
  // Within the limit it is a call as usual.
  const std::string ok = std::string(20, '[') + std::string(20, ']');
  p = parse_whole(tools_on(), "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": " + ok + "}}</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, "{\"x\":" + ok + "}");
}

TEST(OutputParser, MalformedHermesCallStaysContent) {
  Parsed p = parse_whole(tools_on(), "A <tool_call>{\"name\": 3}</tool_call> B");
  EXPECT_EQ(p.content, "A <tool_call>{\"name\": 3}</tool_call> B");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_FALSE(p.saw_calls);

  p = parse_whole(tools_on(), "<tool_call>{not json</tool_call>");
  EXPECT_EQ(p.content, "<tool_call>{not json</tool_call>");

  // The stream ends inside a call: complete JSON is a call; a cut one is
  // content until its name is read, a call (with what arguments streamed,
  // "{}" when none did) after.
  p = parse_whole(tools_on(), "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, R"({"x":1})");
  p = parse_whole(tools_on(), "<tool_call>\n{\"name\": \"f");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "<tool_call>\n{\"name\": \"f");
  p = parse_whole(tools_on(), "<tool_call>\n{\"name\": \"f\", \"argu");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0], std::make_pair(std::string("f"), std::string("{}")));
  EXPECT_EQ(p.content, "");
  p = parse_whole(tools_on(), "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, \"a");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, R"({"x":[1,"a)");  // the number once it ended, the string as it came

  // Without tool parsing the markup is plain content.
  OutputParserOptions off;
  p = parse_whole(off, "<tool_call>{\"name\": \"f\"}</tool_call>");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "<tool_call>{\"name\": \"f\"}</tool_call>");
}

TEST(OutputParser, Llama3JsonCalls) {
  Parsed p = parse_whole(tools_on(), "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].first, "get_weather");
  EXPECT_EQ(p.calls[0].second, R"({"city":"Oslo"})");
  EXPECT_EQ(p.content, "");

  p = parse_whole(tools_on(),
                  "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"s\": \"}{\\\"\"}}; "
                  "{\"name\": \"b\", \"arguments\": {}}\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].second, R"({"s":"}{\""})");  // braces inside strings do not count
  EXPECT_EQ(p.calls[1].first, "b");
  EXPECT_EQ(p.content, "");

  // A JSON answer that is not a call stays content, verbatim.
  p = parse_whole(tools_on(), " {\"name\": \"Bob\", \"age\": 3}");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, " {\"name\": \"Bob\", \"age\": 3}");
  p = parse_whole(tools_on(), "{\"name\": \"f\", \"parameters\"");  // cut off before the arguments
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "{\"name\": \"f\", \"parameters\"");
  p = parse_whole(tools_on(), "{\"name\": \"f\", \"parameters\": null}");  // an answer, not a call
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "{\"name\": \"f\", \"parameters\": null}");
  p = parse_whole(tools_on(), "<|python_tag|>brave_search.call(query=\"x\")");
  EXPECT_EQ(p.content, "<|python_tag|>brave_search.call(query=\"x\")");

  // Text after a call is content.
  p = parse_whole(tools_on(), "{\"name\": \"f\", \"parameters\": {}}\n\nDone.");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "Done.");

  // JSON later in the reply is not a call.
  p = parse_whole(tools_on(), "Here: {\"name\": \"f\", \"parameters\": {}}");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "Here: {\"name\": \"f\", \"parameters\": {}}");
}

TEST(OutputParser, PartialMarkersAreHeldBack) {
  OutputParser parser(tools_on());
  OutputDelta d;
  parser.push("Sure <tool", d);
  EXPECT_EQ(d.content, "Sure");  // the space may precede a call, "<tool" may open one
  parser.push("_ca", d);
  EXPECT_EQ(d.content, "Sure");
  parser.push("ll>{\"name\": \"f\", \"arguments\": {}}</tool_c", d);
  ASSERT_EQ(d.tool_calls.size(), 1u);  // complete with its JSON
  parser.push("all>", d);
  EXPECT_EQ(d.tool_calls.size(), 1u);
  parser.finish(d);
  EXPECT_EQ(d.content, "Sure");

  OutputParser think({});
  OutputDelta t;
  think.push("<th", t);
  EXPECT_TRUE(t.empty());
  think.push("ink>abc</thi", t);
  EXPECT_EQ(t.reasoning, "abc");
  think.push("nk>", t);
  EXPECT_EQ(t.content, "");
  think.push("x", t);
  EXPECT_EQ(t.content, "x");
}

// Pushes `text` one byte at a time and records every call delta with the
// number of bytes pushed when it came out.
struct Timed {
  size_t at;
  ToolCallDelta delta;
};
std::vector<Timed> stream_bytes(const OutputParserOptions& o, std::string_view text) {
  OutputParser parser(o);
  std::vector<Timed> out;
  for (size_t i = 0; i <= text.size(); ++i) {
    OutputDelta d;
    if (i < text.size()) {
      parser.push(text.substr(i, 1), d);
    } else {
      parser.finish(d);
    }
    for (const ToolCallDelta& td : d.tool_call_deltas) out.push_back({i + 1, td});
  }
  return out;
}

TEST(OutputParser, HermesCallStreamsNameThenArgumentPieces) {
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";
  const std::vector<Timed> got = stream_bytes(tools_on(), text);
  ASSERT_GE(got.size(), 10u);
  // The name goes out with the byte that closes its string, alone.
  EXPECT_EQ(got[0].at, text.find("get_weather") + std::string("get_weather\"").size());
  EXPECT_EQ(got[0].delta.name, "get_weather");
  EXPECT_EQ(got[0].delta.arguments, "");
  EXPECT_EQ(got[0].delta.index, 0u);
  // Then the arguments as they are read: the '{' with its own byte, a string
  // character by character, the number once a delimiter ends it.
  EXPECT_EQ(got[1].at, text.find("{\"city") + 1);
  EXPECT_EQ(got[1].delta.arguments, "{");
  std::string args;
  for (size_t k = 1; k < got.size(); ++k) {
    EXPECT_EQ(got[k].delta.name, "");
    args += got[k].delta.arguments;
    if (got[k].delta.arguments == "P") {
      EXPECT_EQ(got[k].at, text.find("Paris") + 1);
    }
    if (got[k].delta.arguments == "3") {
      EXPECT_EQ(got[k].at, text.find("3}") + 2);
    }
  }
  EXPECT_EQ(args, R"({"city":"Paris","days":3})");
  EXPECT_EQ(got.back().at, text.find("}}") + 1);  // the closing brace with its own byte
}

TEST(OutputParser, JsonFormCallOpensWhenItsArgumentsBegin) {
  // Llama-3 / generic: {"name": ...} alone could be an answer; the call
  // opens with the first byte of an object or string arguments value.
  const std::string text = "{\"name\": \"f\", \"parameters\": {\"q\": \"x\"}}";
  const std::vector<Timed> got = stream_bytes(tools_on(), text);
  ASSERT_GE(got.size(), 2u);
  EXPECT_EQ(got[0].at, text.find("{\"q") + 1);
  EXPECT_EQ(got[0].delta.name, "f");
  EXPECT_EQ(got[1].at, got[0].at);
  EXPECT_EQ(got[1].delta.arguments, "{");
  // Arguments before the name: held until the name is read, then sent.
  const std::string late = "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"g\"}</tool_call>";
  const std::vector<Timed> held = stream_bytes(tools_on(), late);
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[0].delta.name, "g");
  EXPECT_EQ(held[1].delta.arguments, R"({"a":1})");
  EXPECT_EQ(held[1].at, held[0].at);
}

TEST(OutputParser, StreamedArgumentsAreWhatTheWholeCallParsesTo) {
  // The pieces build nlohmann's compact dump: whitespace dropped, strings
  // re-escaped, numbers re-formatted, as parse_tool_call_json gives.
  const std::vector<std::string> objects = {
      R"({"name": "f", "arguments": {"a": 1.50, "b": "\u00e9\/x\u0001\ud83d\ude00", "c": 1e2, "d": [true, null, -0]}})",
      R"({"name": "f", "arguments": { "big": 123456789012345678901234567890, "neg": -12.5e-3, "s": "tab\there" } })",
      R"({"name": "f", "arguments": "{\"a\": [1, 2], \"b\": \"\\u00e9\"}"})",
      R"({"name": "f", "arguments": {"nested": {"k": [{"x": {}}, [], ""]}}, "extra": [1, {"y": 2}]})",
      "{\"name\": \"f\", \"arguments\": {\"utf8\": \"caf\xc3\xa9 \xf0\x9f\x98\x80\"}}",
  };
  for (const std::string& object : objects) {
    SCOPED_TRACE(object);
    ToolCall expected;
    ASSERT_TRUE(parse_tool_call_json(object, false, expected));
    Parsed p = parse_whole(tools_on(), "<tool_call>" + object + "</tool_call>");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].second, expected.arguments);
    std::vector<std::string> bytes;
    for (char c : object) bytes.emplace_back(1, c);
    EXPECT_EQ(parse_pieces(tools_on(), bytes), parse_whole(tools_on(), object));
    Parsed json_form = parse_whole(tools_on(), object);
    ASSERT_EQ(json_form.calls.size(), 1u);
    EXPECT_EQ(json_form.calls[0].second, expected.arguments);
  }
}

TEST(OutputParser, ACallThatBreaksAfterItsNameStreamedStaysACall) {
  // Hermes: the arguments streamed so far, the rest of the block dropped.
  Parsed p =
      parse_whole(tools_on(), "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1,, \"y\": 2}}</tool_call>\nafter");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0], std::make_pair(std::string("f"), std::string(R"({"x":1,)")));
  EXPECT_EQ(p.content, "after");
  // Arguments that are not an object or a string: none streamed, so "{}".
  p = parse_whole(tools_on(), "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, "{}");
  // Text between a call's JSON and </tool_call> is dropped; a <tool_call>
  // before the closing tag starts the next call.
  p = parse_whole(tools_on(),
                  "<tool_call>{\"name\": \"f\", \"arguments\": {}} junk</tool_call>"
                  "<tool_call>{\"name\": \"g\", \"arguments\": {}}\n<tool_call>{\"name\": \"h\"}</tool_call> end");
  ASSERT_EQ(p.calls.size(), 3u);
  EXPECT_EQ(p.calls[2].first, "h");
  EXPECT_EQ(p.content, "end");
  // JSON forms: where a broken object ends is unknowable, so the rest of
  // the reply is dropped.
  p = parse_whole(tools_on(),
                  "{\"name\": \"f\", \"parameters\": {\"x\": tru}}; {\"name\": \"g\", \"parameters\": {}} tail");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0], std::make_pair(std::string("f"), std::string(R"({"x":)")));
  EXPECT_EQ(p.content, "");
  // Before the call opened, the same text is content as before.
  p = parse_whole(tools_on(), "{\"name\": \"f\", \"x\": tru} tail");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "{\"name\": \"f\", \"x\": tru} tail");
}

// What Mistral, Qwen3-Coder / Qwen3.5, Gemma 4, GLM, DeepSeek, Kimi K2 and
// Command R7B templates write for a tool-call turn
// (tools/make_tool_call_goldens.py renders them with jinja2), read back to the
// same calls however it is split.
TEST(OutputParser, TemplateCallsReadBack) {
  std::ifstream f(std::string(RILL_TEST_DATA) + "/tool_calls/goldens.json");
  ASSERT_TRUE(f) << "tests/data/tool_calls/goldens.json";
  const nlohmann::json goldens = nlohmann::json::parse(f);
  ASSERT_GE(goldens.size(), 26u);
  std::mt19937 rng(7);
  for (const nlohmann::json& g : goldens) {
    const std::string text = g["text"];
    SCOPED_TRACE(g["template"].get<std::string>() + ": " + text);
    Parsed want;
    for (const nlohmann::json& c : g["calls"]) want.calls.emplace_back(c["name"], c["arguments"]);
    want.saw_calls = true;
    EXPECT_EQ(parse_whole(tools_on(), text), want);
    std::vector<std::string> bytes;
    for (char c : text) bytes.emplace_back(1, c);
    EXPECT_EQ(parse_pieces(tools_on(), bytes), want);
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<std::string> pieces;
      for (size_t pos = 0; pos < text.size();) {
        const size_t n = std::uniform_int_distribution<size_t>(0, 9)(rng);
        pieces.push_back(text.substr(pos, n));
        pos += n;
      }
      ASSERT_EQ(parse_pieces(tools_on(), pieces), want);
    }
    // After some text, and with text after the calls.
    if (text.find("<think>") != std::string::npos) continue;  // the think block opens the reply
    want.content = "Let me check.";
    EXPECT_EQ(parse_whole(tools_on(), "Let me check.\n" + text), want);
    want.content = "Let me check.Done.";  // whitespace around calls never shows
    EXPECT_EQ(parse_whole(tools_on(), "Let me check.\n" + text + "\nDone."), want);
  }
}

// A Kimi K2 / DeepSeek framed call's name (what lies between the call and
// argument markers) is at most 256 bytes: at 256 it is a call, at 257 the
// text is content, and either way whole text, bytes and a split inside the
// argument marker agree (a fuzz-found case: the streamed parser gave up while
// the marker was still arriving, the whole one took any length).
TEST(OutputParser, FramedCallNamesAreBoundedTheSameWayWholeAndStreamed) {
  for (const bool kimi : {true, false}) {
    const std::string section = kimi ? "<|tool_calls_section_begin|>" : "<｜tool▁calls▁begin｜>";
    const std::string open = section + (kimi ? "<|tool_call_begin|>" : "<｜tool▁call▁begin｜>");
    const std::string args = kimi ? "<|tool_call_argument_begin|>" : "<｜tool▁sep｜>";
    const std::string close =
        kimi ? "<|tool_call_end|><|tool_calls_section_end|>" : "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    for (const size_t len : {1u, 200u, 255u, 256u, 257u, 300u}) {
      const std::string name(len, 'f');
      const std::string text = open + name + args + "{\"x\": 1}" + close;
      SCOPED_TRACE((kimi ? "kimi, name of " : "deepseek, name of ") + std::to_string(len));
      const Parsed whole = parse_whole(tools_on(), text);
      if (len <= 256) {
        ASSERT_EQ(whole.calls.size(), 1u);
        EXPECT_EQ(whole.calls[0], std::make_pair(name, std::string(R"({"x":1})")));
        EXPECT_EQ(whole.content, "");
      } else {
        EXPECT_TRUE(whole.calls.empty());
        EXPECT_EQ(whole.content, text.substr(section.size()));  // past the section marker, as any non-call
      }
      std::vector<std::string> bytes;
      for (char c : text) bytes.emplace_back(1, c);
      EXPECT_EQ(parse_pieces(tools_on(), bytes), whole);
      const size_t mid = open.size() + len + args.size() / 2;  // inside the argument marker
      EXPECT_EQ(parse_pieces(tools_on(), {text.substr(0, mid), text.substr(mid)}), whole);
    }
  }
}

// Command R / R+ (08-2024) and Granite 3.3 write calls as their vendors
// document them: Cohere's "Action: ```json [{tool_name, parameters}]```"
// (after an optional plan, which is content) and IBM's
// <|tool_call|>[{name, arguments}, ...]. Each read the same at every split
// point; what only looks like them stays content, verbatim.
TEST(OutputParser, CommandRAndGraniteCalls) {
  using Calls = std::vector<std::pair<std::string, std::string>>;
  struct Case {
    std::string text, content;
    Calls calls;
  };
  const Case cases[] = {
      {"Plan: I will look up the weather.\nAction: ```json\n[\n    {\n        \"tool_name\": \"get_weather\",\n"
       "        \"parameters\": {\n            \"city\": \"Paris\"\n        }\n    }\n]\n```",
       "Plan: I will look up the weather.",
       {{"get_weather", R"({"city":"Paris"})"}}},
      {"Action:\n```json\n[{\"tool_name\": \"run\", \"parameters\": {\"code\": \"```py\\nx\\n```\"}}, "
       "{\"tool_name\": \"directly-answer\", \"parameters\": {}}]```\nDone.",
       "Done.",
       {{"run", R"({"code":"```py\nx\n```"})"}, {"directly-answer", "{}"}}},
      {"Action: ```json\n[{\"tool_name\": \"f\", \"parameters\": {\"s\": \"[x]```\"}}]\n```",
       "",
       {{"f", R"({"s":"[x]```"})"}}},
      {"<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
       "{\"name\": \"search\", \"arguments\": {\"q\": [1, 2]}}]",
       "",
       {{"get_weather", R"({"city":"Paris"})"}, {"search", R"({"q":[1,2]})"}}},
      {"Sure. <|tool_call|> [{\"arguments\": {}, \"name\": \"ping\"}]", "Sure.", {{"ping", "{}"}}},
      {"Action: go home. Action: ```python\nx = 1\n```", "Action: go home. Action: ```python\nx = 1\n```", {}},
      {"Action: ```json\n[{\"tool_name\": 3}]\n``` after", "Action: ```json\n[{\"tool_name\": 3}]\n``` after", {}},
      {"Action: ```json\n[{\"tool_name\": \"f\"", "Action: ```json\n[{\"tool_name\": \"f\"", {}},
      {"<|tool_call|>not a list", "<|tool_call|>not a list", {}},
      {"<|tool_call|>", "<|tool_call|>", {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    Parsed want;
    want.content = c.content;
    want.calls = c.calls;
    want.saw_calls = !c.calls.empty();
    EXPECT_EQ(parse_whole(tools_on(), c.text), want);
    std::vector<std::string> bytes;
    for (char ch : c.text) bytes.emplace_back(1, ch);
    EXPECT_EQ(parse_pieces(tools_on(), bytes), want);
    for (size_t at = 1; at < c.text.size(); ++at) {
      ASSERT_EQ(parse_pieces(tools_on(), {c.text.substr(0, at), c.text.substr(at)}), want) << "split at " << at;
    }
  }
  // Granite's list streams as Nemo's: the name once its string closes, then the arguments.
  const std::string text = "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]";
  const std::vector<Timed> got = stream_bytes(tools_on(), text);
  ASSERT_GE(got.size(), 3u);
  EXPECT_EQ(got[0].delta.name, "get_weather");
  EXPECT_LT(got[0].at, text.find("Oslo"));
}

// A Command R block is parsed whole at each "]```" that may close it; a
// reply can hold many inside strings (a grammar can force them), so only
// the first 16 are tried and the block is otherwise read at the reply's
// end, where its closing fence makes it content: parsing stays linear.
TEST(OutputParser, CommandRTriesABoundedNumberOfClosingFences) {
  auto block = [](int n) {
    std::string arg;
    for (int i = 0; i < n; ++i) arg += "[" + std::to_string(i) + "]```";
    return "Action: ```json\n[{\"tool_name\": \"f\", \"parameters\": {\"s\": \"" + arg + "\"}}]\n```";
  };
  const Parsed few = parse_whole(tools_on(), block(15));
  ASSERT_EQ(few.calls.size(), 1u);
  EXPECT_EQ(few.calls[0].first, "f");
  EXPECT_TRUE(few.content.empty());
  const std::string many = block(40);
  const Parsed got = parse_whole(tools_on(), many);
  EXPECT_TRUE(got.calls.empty());
  EXPECT_EQ(got.content, many);
  std::vector<std::string> bytes;
  for (char ch : many) bytes.emplace_back(1, ch);
  EXPECT_EQ(parse_pieces(tools_on(), bytes), got);
}

TEST(OutputParser, MistralCallStreamsOnceItsNameEnds) {
  const std::string text = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}";
  const std::vector<Timed> got = stream_bytes(tools_on(), text);
  ASSERT_GE(got.size(), 3u);
  EXPECT_EQ(got[0].at, text.find("{"));  // with the last byte of [ARGS]
  EXPECT_EQ(got[0].delta.name, "get_weather");
  EXPECT_EQ(got[1].delta.arguments, "{");
  // Not a call: the marker and the text stay content.
  for (const std::string bad : {"[TOOL_CALLS] get_weather[ARGS]{}", "[TOOL_CALLS]get_weather[OTHER]{}", "[TOOL_CALLS]",
                                "[TOOL_CALLS][not json]", "[TOOL_CALLS]f[CALL_ID]abc"}) {
    Parsed p = parse_whole(tools_on(), bad);
    EXPECT_TRUE(p.calls.empty()) << bad;
    EXPECT_EQ(p.content, bad);
  }
  // Arguments written as a JSON string (Mistral Small 3.2's tojson of a string).
  Parsed p = parse_whole(tools_on(), "[TOOL_CALLS]f[CALL_ID]abcdefghi[ARGS]\"{\\\"a\\\": 1}\"");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, "{\"a\": 1}");
  // Broken after the name: a call with what streamed, the rest dropped.
  p = parse_whole(tools_on(), "[TOOL_CALLS]f[ARGS]{\"a\": nope}[TOOL_CALLS]g[ARGS]{}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, "{\"a\":");
}

TEST(OutputParser, XmlCallStreamsAndTypesItsValues) {
  const std::string text =
      "<tool_call>\n<function=lookup>\n<parameter=zip>\n75001\n</parameter>\n<parameter=note>\nline 1\nline "
      "\"2\"\n</parameter>\n<parameter=flag>\nTrue\n</parameter>\n</function>\n</tool_call>\nDone.";
  const std::vector<Timed> got = stream_bytes(tools_on(), text);
  ASSERT_GE(got.size(), 5u);
  EXPECT_EQ(got[0].delta.name, "lookup");
  EXPECT_EQ(got[0].at, text.find(">\n<parameter=zip") + 1);  // with the name's '>'
  EXPECT_EQ(got[1].delta.arguments, "{");
  EXPECT_EQ(got[2].delta.arguments, "\"zip\":");  // the key at its '>'
  EXPECT_EQ(got[2].at, text.find(">\n75001") + 1);
  EXPECT_EQ(got[3].delta.arguments, "75001");  // untyped: the value once </parameter> closes it
  EXPECT_EQ(got[3].at, text.find("</parameter>") + std::string("</parameter>").size());
  Parsed p = parse_whole(tools_on(), text);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, R"({"zip":75001,"note":"line 1\nline \"2\"","flag":true})");
  EXPECT_EQ(p.content, "Done.");
  // With the tools' parameter types, a string parameter stays a string.
  OutputParserOptions typed = tools_on();
  typed.parameter_types =
      std::make_shared<ToolParameterTypes>(ToolParameterTypes{{"lookup", {{"zip", "string"}, {"flag", "boolean"}}}});
  p = parse_whole(typed, text);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, R"({"zip":"75001","note":"line 1\nline \"2\"","flag":true})");
  // A string parameter streams as it comes, escaped, all but what may end it.
  const std::vector<Timed> typed_got = stream_bytes(typed, text);
  std::string zip;
  for (const Timed& t : typed_got) {
    if (t.at > text.find("75001") && t.at <= text.find("75001") + 5) zip += t.delta.arguments;
  }
  EXPECT_EQ(zip, "75001");  // each character with its own byte
  typed.parameter_types = std::make_shared<ToolParameterTypes>(ToolParameterTypes{{"lookup", {{"note", "string"}}}});
  std::string note;
  for (const Timed& t : stream_bytes(typed, text)) {
    if (t.at > text.find("line 1") && t.at <= text.find("\"2\"\n</parameter>")) note += t.delta.arguments;
  }
  EXPECT_EQ(note, "line 1\\nline ");  // the newline once the next byte shows it is the value's
  // Typed string values stream under any split to the same arguments.
  typed.parameter_types = std::make_shared<ToolParameterTypes>(
      ToolParameterTypes{{"lookup", {{"zip", "string"}, {"note", "string"}}}, {"f", {{"s", "string"}}}});
  std::mt19937 rng(11);
  for (const std::string& t :
       {text,
        std::string("<tool_call><function=f>\n<parameter=s>\n\n caf\xc3\xa9 \xf0\x9f\x98\x80 </par\n\n</parameter>"
                    "\n</function></tool_call>"),
        std::string("<tool_call><function=f>\n<parameter=s>\nab\n</param")}) {
    SCOPED_TRACE(t);
    const Parsed whole = parse_whole(typed, t);
    std::vector<std::string> bytes;
    for (char c : t) bytes.emplace_back(1, c);
    EXPECT_EQ(parse_pieces(typed, bytes), whole);
    for (int trial = 0; trial < 30; ++trial) {
      std::vector<std::string> pieces;
      for (size_t pos = 0; pos < t.size();) {
        const size_t n = std::uniform_int_distribution<size_t>(0, 5)(rng);
        pieces.push_back(t.substr(pos, n));
        pos += n;
      }
      ASSERT_EQ(parse_pieces(typed, pieces), whole);
    }
  }
  EXPECT_EQ(parse_whole(typed,
                        "<tool_call><function=f>\n<parameter=s>\n\n caf\xc3\xa9 </par\n\n</parameter>\n"
                        "</function></tool_call>")
                .calls[0]
                .second,
            "{\"s\":\"\\n caf\xc3\xa9 </par\\n\"}");
  EXPECT_EQ(parse_whole(typed, "<tool_call><function=f>\n<parameter=s>\nab\n</param").calls[0].second,
            "{\"s\":\"ab");  // cut off: what streamed
  // Not the form: the block is content. Broken after the name: a call with
  // what streamed, the rest of the block dropped.
  p = parse_whole(tools_on(), "<tool_call>\n<fun>x</fun>\n</tool_call>");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "<tool_call>\n<fun>x</fun>\n</tool_call>");
  p = parse_whole(tools_on(), "<tool_call><function=f>\n<parameter=a>\n1\n</parameter>\noops</tool_call> after");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, R"({"a":1)");
  EXPECT_EQ(p.content, "after");
  p = parse_whole(tools_on(), "<tool_call><function=f>\n<parameter=a>\nunfinished");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, R"({"a":)");
  p = parse_whole(tools_on(), "<tool_call><function=f></function></tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, "{}");
}

// Every case, under every option set, split at random points and byte by
// byte, gives the single-push result.
TEST(OutputParser, AnySplitGivesTheSameResult) {
  const std::vector<std::string> texts = {
      "Hello, world! Plain text with <b>tags</b> and {braces}.",
      "  <think>\n step one \n</think>\n\n Answer: <tool_call>",
      "<think>x</think><tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"a</tool_call>b\"}}\n</tool_call>",
      "Text\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n \n<tool_call>{\"name\": \"g\"}</tool_call>",
      "<tool_call>{bad}</tool_call> after <tool_call>{\"name\": \"ok\", \"arguments\": {\"n\": [1, {\"m\": 2}]}}",
      "\n{\"name\": \"a\", \"parameters\": {\"x\": \"{[\\\"]}\"}};{\"name\": \"b\", \"arguments\": {}} trailing",
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}",
      "<|python_tag|>not json",
      "{\"name\": \"a\", \"parameters\": {}}; {\"no\": 1}",
      "{\"answer\": 42}",
      "<thin>not a tag</thin> <tool_cal> <|python_ta",
      "\xe2\x82\xac <think>euro \xf0\x9f\x98\x80</think> caf\xc3\xa9",
      "<think>unfinished <tool_call>{\"name\": \"f\"}</tool_call>",
      "<tool_call>{\"arguments\": {\"a\": [1.0e3, \"\\u00e9\\ud83d\\ude00\"]}, \"name\": \"late\"}</tool_call>x",
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1,, }}</tool_call> after <tool_call>{\"name\": \"g\"",
      "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": \\\"caf\xc3\xa9\\\"}\"} junk</tool_call>",
      "{\"name\": \"f\", \"arguments\": {\"n\": -0.5e+2}}\n{\"name\": \"g\", \"arguments\": {\"s\": "
      "\"\xf0\x9f\x98\x80\"}}\nok",
      "{\"name\": \"f\", \"parameters\": {\"x\": 01}} rest",
      "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}<tool_call>{\"name\": \"g\", \"arguments\": {\"a\": [",
      "[TOOL_CALLS]f[ARGS]{\"a\": [1]}[TOOL_CALLS]g[CALL_ID]abcdefghi[ARGS]\"{}\" tail [TOOL_CALLS]bad name",
      "pre [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"x\"}, {\"name\": \"g\", \"arguments\": {}}] "
      "post",
      "[TOOL_CALLS][{\"name\": \"f\"}] [TOOL_CALLS]",
      "<tool_call>\n<function=f>\n<parameter=a>\n{\"x\": [1]}\n</parameter>\n<parameter=b>\nNone\n</parameter>\n"
      "</function>\n</tool_call>\n<tool_call><function=g>\n<parameter=s>\ntext\n</parameter>\nbad</tool_call>x",
      "<tool_call> <function=bad name>",
      "<|channel>thought\nplan <|tool_call>x<channel|>ok "
      "<|tool_call>call:f{a:<|\"|>s,}<|\"|>,b:[1,{c:None}]}<tool_call|>",
      "<|tool_call>call:f{a:<tool_call|> <|tool_call>call:g{}<tool_call|> <|tool_call>call:h{x:1",
      "Plan: x\nAction: ```json\n[{\"tool_name\": \"f\", \"parameters\": {\"s\": \"]```\"}}]\n```\nAction: no",
      "<|tool_call|>[{\"name\": \"f\", \"arguments\": {}}] then <|tool_call|>{\"name\": \"g\"}",
      "   ",
      "",
  };
  std::vector<OutputParserOptions> option_sets(5);
  option_sets[0].parse_reasoning = false;
  option_sets[2].parse_tool_calls = true;
  option_sets[3].parse_tool_calls = true;
  option_sets[3].starts_in_reasoning = true;
  option_sets[4].parse_reasoning = false;
  option_sets[4].parse_tool_calls = true;

  std::mt19937 rng(1234);
  for (const std::string& text : texts) {
    for (size_t oi = 0; oi < option_sets.size(); ++oi) {
      const OutputParserOptions& o = option_sets[oi];
      SCOPED_TRACE("options " + std::to_string(oi) + ", text: " + text);
      const Parsed whole = parse_whole(o, text);
      std::vector<std::string> bytes;
      for (char c : text) bytes.emplace_back(1, c);
      EXPECT_EQ(parse_pieces(o, bytes), whole);
      for (int trial = 0; trial < 60; ++trial) {
        std::vector<std::string> pieces;
        size_t pos = 0;
        while (pos < text.size()) {
          const size_t n = std::uniform_int_distribution<size_t>(0, 6)(rng);
          pieces.push_back(text.substr(pos, n));
          pos += n;
        }
        ASSERT_EQ(parse_pieces(o, pieces), whole) << "trial " << trial;
      }
    }
  }
}

// Gemma 4: the thought channel is reasoning; calls in its own syntax are
// read whole into JSON arguments (keys in the order written); text that is
// not such a call stays content, markers included.
TEST(OutputParser, Gemma4ChannelAndCalls) {
  Parsed p = parse_whole(OutputParserOptions{}, "<|channel>thought\nStep 1.\n<channel|>The answer.");
  EXPECT_EQ(p.reasoning, "Step 1.");
  EXPECT_EQ(p.content, "The answer.");
  p = parse_whole(tools_on(),
                  "Sure.\n<|tool_call>call:search{query:<|\"|>a, b {c}<|\"|>,n:-2.5e1,ok:false,"
                  "tags:[<|\"|>x<|\"|>],opt:None,nested:{k:[]},word:maybe}<tool_call|>");
  EXPECT_EQ(p.content, "Sure.");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].first, "search");
  EXPECT_EQ(p.calls[0].second,
            R"({"query":"a, b {c}","n":-25.0,"ok":false,"tags":["x"],"opt":null,"nested":{"k":[]},"word":"maybe"})");
  EXPECT_TRUE(p.saw_calls);
  // Not a call: content.
  for (const std::string bad : {"<|tool_call>call:f{a:<|\"|>open}<tool_call|>", "<|tool_call>f{}<tool_call|>",
                                "<|tool_call>call:f{a:1}extra<tool_call|>", "<|tool_call>call:f[1]<tool_call|>"}) {
    p = parse_whole(tools_on(), bad);
    EXPECT_TRUE(p.calls.empty()) << bad;
    EXPECT_EQ(p.content, bad);
  }
  // A call the reply ends inside is still read when it is whole.
  p = parse_whole(tools_on(), "<|tool_call>call:f{}");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].second, "{}");
  // Nesting beyond the limit stays content without recursing further.
  const std::string deep = "<|tool_call>call:f{a:" + std::string(5000, '[') + std::string(5000, ']') + "}<tool_call|>";
  p = parse_whole(tools_on(), deep);
  EXPECT_TRUE(p.calls.empty());
}

TEST(OutputParser, ParseToolCallJson) {
  ToolCall c;
  EXPECT_TRUE(parse_tool_call_json(R"({"name": "f", "arguments": {"z": 1, "a": 2}})", true, c));
  EXPECT_EQ(c.arguments, R"({"z":1,"a":2})");
  EXPECT_FALSE(parse_tool_call_json(R"({"name": "f"})", true, c));
  EXPECT_TRUE(parse_tool_call_json(R"({"name": "f"})", false, c));
  EXPECT_FALSE(parse_tool_call_json(R"({"name": ""})", false, c));
  EXPECT_FALSE(parse_tool_call_json(R"([{"name": "f"}])", false, c));
  EXPECT_FALSE(parse_tool_call_json(R"({"name": "f", "arguments": 3})", false, c));
  EXPECT_NE(make_tool_call_id(), make_tool_call_id());
}

}  // namespace
}  // namespace rill
