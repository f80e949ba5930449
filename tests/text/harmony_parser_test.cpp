// The harmony output format (gpt-oss) through OutputParser with
// OutputParserOptions::harmony: the analysis channel becomes reasoning, the
// final channel content, a commentary message addressed to functions.NAME a
// tool call (recipient before or after the channel, as the model and the
// template write it); the result is the same for every split of the text
// into push() calls, and markers never leak into what is emitted.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "text/output_parser.h"

namespace rill {
namespace {

struct Parsed {
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  std::vector<ToolCallDelta> deltas;
};

Parsed parse(const std::vector<std::string>& pieces, bool tools = true) {
  OutputParserOptions o;
  o.harmony = true;
  o.parse_tool_calls = tools;
  OutputParser p(o);
  Parsed r;
  auto take = [&](const OutputDelta& d) {
    r.content += d.content;
    r.reasoning += d.reasoning;
    r.calls.insert(r.calls.end(), d.tool_calls.begin(), d.tool_calls.end());
    r.deltas.insert(r.deltas.end(), d.tool_call_deltas.begin(), d.tool_call_deltas.end());
  };
  for (const std::string& s : pieces) {
    OutputDelta d;
    p.push(s, d);
    take(d);
  }
  OutputDelta d;
  p.finish(d);
  take(d);
  return r;
}

// The text in one piece, in pieces of n bytes for n = 1..7, and cut at every byte.
std::vector<std::vector<std::string>> splits(const std::string& text) {
  std::vector<std::vector<std::string>> out{{text}};
  for (size_t n = 1; n <= 7; ++n) {
    std::vector<std::string> v;
    for (size_t i = 0; i < text.size(); i += n) v.push_back(text.substr(i, n));
    out.push_back(v);
  }
  for (size_t i = 1; i < text.size(); ++i) out.push_back({text.substr(0, i), text.substr(i)});
  return out;
}

const std::string kReply =
    "<|channel|>analysis<|message|>The user wants a joke. <think> is not a marker here.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Why did the compiler < quit? Too many errors.<|return|>";

TEST(Harmony, AnalysisIsReasoningAndFinalIsContent) {
  for (const auto& pieces : splits(kReply)) {
    const Parsed r = parse(pieces);
    EXPECT_EQ(r.reasoning, "The user wants a joke. <think> is not a marker here.");
    EXPECT_EQ(r.content, "Why did the compiler < quit? Too many errors.");
    EXPECT_TRUE(r.calls.empty());
  }
}

TEST(Harmony, ToolCallInTheModelsForm) {
  const std::string text =
      "<|channel|>analysis<|message|>Need the weather.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
      "{\"location\": \"Paris\", \"unit\": \"celsius\"}<|call|>";
  for (const auto& pieces : splits(text)) {
    const Parsed r = parse(pieces);
    EXPECT_EQ(r.reasoning, "Need the weather.");
    EXPECT_EQ(r.content, "");
    ASSERT_EQ(r.calls.size(), 1u);
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(r.calls[0].arguments, R"({"location":"Paris","unit":"celsius"})");
    EXPECT_EQ(r.calls[0].id.rfind("call_", 0), 0u);
    // The first delta names the call; the argument pieces add up to the arguments.
    ASSERT_GE(r.deltas.size(), 2u);
    EXPECT_EQ(r.deltas[0].name, "get_weather");
    EXPECT_EQ(r.deltas[0].id, r.calls[0].id);
    std::string args;
    for (size_t i = 1; i < r.deltas.size(); ++i) args += r.deltas[i].arguments;
    EXPECT_EQ(args, r.calls[0].arguments);
  }
}

// The form the chat template writes for history (recipient in the header
// before the channel), two calls in one reply, the stream ending at <|call|>
// (an end-of-sequence token the detokenizer may drop: then without it).
TEST(Harmony, TemplateFormAndSeveralCalls) {
  for (const std::string end : {"<|call|>", ""}) {
    const std::string text =
        "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\":\"CET\"}<|call|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"location\": \"Oslo\"}" +
        end;
    const Parsed r = parse({text});
    ASSERT_EQ(r.calls.size(), 2u) << end;
    EXPECT_EQ(r.calls[0].name, "get_time");
    EXPECT_EQ(r.calls[0].arguments, R"({"tz":"CET"})");
    EXPECT_EQ(r.calls[1].name, "get_weather");
    EXPECT_EQ(r.calls[1].arguments, R"({"location":"Oslo"})");
    EXPECT_EQ(r.deltas.front().index, 0u);
    EXPECT_EQ(r.deltas.back().index, 1u);
    EXPECT_NE(r.calls[0].id, r.calls[1].id);
  }
}

TEST(Harmony, WithoutToolsACallIsContentAndPreamblesAreContent) {
  const std::string text =
      "<|channel|>commentary<|message|>Let me look.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":1}<|call|>";
  const Parsed with = parse({text});
  EXPECT_EQ(with.content, "Let me look.");
  ASSERT_EQ(with.calls.size(), 1u);
  const Parsed without = parse({text}, /*tools=*/false);
  EXPECT_EQ(without.content, "Let me look.{\"a\":1}");
  EXPECT_TRUE(without.calls.empty());
}

TEST(Harmony, UnfinishedAndMalformedReplies) {
  // The stream ends inside the analysis: it stays reasoning.
  EXPECT_EQ(parse({"<|channel|>analysis<|message|>thinking so f"}).reasoning, "thinking so f");
  // A partial marker at the very end is text.
  EXPECT_EQ(parse({"<|channel|>final<|message|>a <|en"}).content, "a <|en");
  // Arguments that are not JSON are passed on as written.
  const Parsed bad = parse({"<|channel|>commentary to=functions.f<|message|>not json<|call|>"});
  ASSERT_EQ(bad.calls.size(), 1u);
  EXPECT_EQ(bad.calls[0].arguments, "not json");
  // A reply that ignores the format is content; a header cut off carries nothing.
  EXPECT_EQ(parse({"plain answer"}).content, "plain answer");
  EXPECT_EQ(parse({"<|channel|>final"}).content, "");
}

}  // namespace
}  // namespace rill
