// Structured-output request fields and forced tool calls: the fields' 400s
// name the field (and the refused schema keyword), and the tool-call
// grammar produces exactly what the output parser reads back: random walks
// through the grammar's bytes, in every call format, all parse as calls of
// the offered tools whose arguments match the schema.
#include "server/structured_output.h"

#include <gtest/gtest.h>

#include <random>

#include "text/grammar/grammar_matcher.h"
#include "text/output_parser.h"

#include "../sanitizer_stride.h"

namespace rill::server {
namespace {

using Json = nlohmann::ordered_json;

std::optional<ApiError> read_format(const char* body_text, OutputConstraint& out) {
  static Json body;  // FieldReader keeps a pointer
  body = Json::parse(body_text);
  const FieldReader r(body);
  if (auto e = read_response_format(r, out)) return e;
  return read_grammar_fields(r, out);
}

TEST(StructuredOutput, ResponseFormatErrorsNameTheField) {
  struct Case {
    const char* body;
    const char* param;
    const char* needle;
  };
  const Case cases[] = {
      {R"({"response_format": {"type": "json_object", "schema": 123}})", "response_format.schema", "JSON Schema"},
      {R"({"response_format": {"type": "yaml"}})", "response_format.type", "yaml"},
      {R"({"response_format": {"type": "json_object", "strict": true}})", "response_format.strict", "unknown field"},
      {R"({"response_format": {"type": "json_schema"}})", "response_format.json_schema", "required"},
      {R"({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}})",
       "response_format.json_schema.name", "required"},
      {R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
          {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}}}}})",
       "response_format.json_schema.schema", "'multipleOf' at #/properties/n"},
      {R"({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""})", "grammar", "only one"},
      {R"({"regex": "(a", "choice": ["x"]})", "regex", ""},
      {R"({"choice": []})", "choice", "at least one"},
      {R"({"choice": ["a", 1]})", "choice[1]", "string"},
  };
  for (const Case& c : cases) {
    OutputConstraint out;
    auto e = read_format(c.body, out);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->param, c.param) << e->message;
    EXPECT_NE(e->message.find(c.needle), std::string::npos) << e->message;
  }
}

TEST(StructuredOutput, FormatsBecomeGrammarsThatAcceptTheirOutputs) {
  struct Case {
    const char* body;
    const char* good;
    const char* bad;
  };
  const Case cases[] = {
      {R"({"response_format": {"type": "json_object"}})", R"({"a": [1, {"b": null}]})", "[1]"},
      {R"({"response_format": {"type": "json_object", "schema": {"type": "object", "properties": {"k": {"type":
          "integer"}}, "required": ["k"]}}})",
       R"({"k": 3})", R"({"k": "3"})"},
      {R"({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": true, "schema":
          {"type": "object", "properties": {"e": {"enum": ["x", "y"]}}, "required": ["e"],
          "additionalProperties": false}}}})",
       R"({"e": "y"})", R"({"e": "z"})"},
      {R"({"grammar": "root ::= [a-c]+"})", "abcab", "abd"},
      {R"({"regex": "[0-9]{3}-[0-9]{2}"})", "123-45", "12-345"},
      {R"({"choice": ["yes", "no"]})", "no", "maybe"},
  };
  for (const Case& c : cases) {
    OutputConstraint out;
    auto e = read_format(c.body, out);
    ASSERT_FALSE(e.has_value()) << e->message;
    auto g = compile_constraint(out);
    ASSERT_TRUE(std::holds_alternative<std::shared_ptr<const grammar::CompiledGrammar>>(g)) << c.body;
    const auto& compiled = std::get<std::shared_ptr<const grammar::CompiledGrammar>>(g);
    grammar::GrammarMatcher good(compiled), bad(compiled);
    EXPECT_TRUE(good.accept_bytes(c.good) && good.can_end()) << c.body;
    EXPECT_FALSE(bad.accept_bytes(c.bad) && bad.can_end()) << c.body;
  }
  OutputConstraint text;
  ASSERT_FALSE(read_format(R"({"response_format": {"type": "text"}})", text).has_value());
  EXPECT_TRUE(text.empty());
}

TEST(StructuredOutput, ResponsesTextFormat) {
  Json text = Json::parse(R"({"format": {"type": "json_schema", "name": "c", "strict": true, "schema":
      {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}}})");
  OutputConstraint out;
  ASSERT_FALSE(read_text_format(FieldReader(text, "text"), out).has_value());
  EXPECT_EQ(out.param, "text.format.schema");
  Json bad = Json::parse(R"({"format": {"type": "json_schema", "name": "c", "schema": {"not": {}}}})");
  auto e = read_text_format(FieldReader(bad, "text"), out);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "text.format.schema");
  EXPECT_NE(e->message.find("'not'"), std::string::npos) << e->message;
}

// gpt-oss: the constraint applies to the final channel's text, after an
// analysis message of any text (here without a tokenizer: the markers as
// text, which the analysis text may then spell too; with harmony's special
// tokens it cannot: tests/integration/test_harmony.py).
TEST(StructuredOutput, HarmonyConstraintsApplyToTheFinalChannel) {
  Json text = Json::parse(R"({"format": {"type": "json_schema", "name": "c", "strict": true, "schema":
      {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}}})");
  OutputConstraint out;
  ASSERT_FALSE(read_text_format(FieldReader(text, "text"), out).has_value());
  bool names_tokens = false;
  auto g = compile_constraint(out, nullptr, &names_tokens, /*harmony=*/true);
  ASSERT_TRUE(std::holds_alternative<std::shared_ptr<const grammar::CompiledGrammar>>(g));
  EXPECT_TRUE(names_tokens);
  const auto& compiled = std::get<std::shared_ptr<const grammar::CompiledGrammar>>(g);
  const std::string final_answer = "<|channel|>final<|message|>{\"a\": true}";
  for (const std::string& good :
       {final_answer, "<|channel|>analysis<|message|>{ not JSON ü\n<|end|><|start|>assistant" + final_answer,
        "<|channel|>analysis<|message|><|end|><|start|>assistant" + final_answer}) {
    grammar::GrammarMatcher m(compiled);
    EXPECT_TRUE(m.accept_bytes(good) && m.can_end()) << good;
  }
  for (const std::string& bad : {std::string("{\"a\": true}"), std::string("<|channel|>final<|message|>{\"a\": 1}"),
                                 std::string("<|channel|>commentary<|message|>{\"a\": true}")}) {
    grammar::GrammarMatcher m(compiled);
    EXPECT_FALSE(m.accept_bytes(bad) && m.can_end()) << bad;
  }
  // Not harmony: the constraint is the whole reply.
  auto plain = compile_constraint(out);
  ASSERT_TRUE(std::holds_alternative<std::shared_ptr<const grammar::CompiledGrammar>>(plain));
  grammar::GrammarMatcher m(std::get<std::shared_ptr<const grammar::CompiledGrammar>>(plain));
  EXPECT_TRUE(m.accept_bytes("{\"a\": false}") && m.can_end());
}

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "plan", "parameters": {"type": "object", "$defs": {"Stop":
    {"type": "object", "properties": {"at": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["at"],
     "additionalProperties": false}},
    "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}, "stop": {"$ref": "#/$defs/Stop"},
      "fast": {"type": ["boolean", "null"]}},
    "required": ["code", "stop"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "ping"}}])";

// A random string of the grammar: random allowed bytes, stopping where it
// may end with probability 1/4 (always once it must).
std::optional<std::string> random_walk(const std::shared_ptr<const grammar::CompiledGrammar>& g, std::mt19937& rng) {
  grammar::GrammarMatcher m(g);
  std::string out;
  while (out.size() < 4000) {
    if (m.must_end() || (m.can_end() && rng() % 4 == 0)) return out;
    std::vector<uint8_t> allowed;
    for (int b = 0; b < 256; ++b) {
      grammar::GrammarMatcher probe = m;
      if (probe.accept_bytes(std::string(1, static_cast<char>(b)))) allowed.push_back(static_cast<uint8_t>(b));
    }
    if (allowed.empty()) return std::nullopt;
    // Prefer ASCII so walks end (and strings close) in reasonable time.
    std::vector<uint8_t> ascii;
    for (uint8_t b : allowed) {
      if (b < 0x80) ascii.push_back(b);
    }
    const auto& pool = !ascii.empty() && rng() % 8 != 0 ? ascii : allowed;
    const char c = static_cast<char>(pool[rng() % pool.size()]);
    EXPECT_TRUE(m.accept_bytes(std::string(1, c)));
    out += c;
  }
  return std::nullopt;
}

TEST(StructuredOutput, ToolCallGrammarsProduceWhatTheParserReadsBack) {
  const Json tools = Json::parse(kTools);
  for (auto format :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kGeneric, ToolCallFormat::kMistralArgs,
        ToolCallFormat::kMistralCallId, ToolCallFormat::kMistralJson, ToolCallFormat::kQwenXml, ToolCallFormat::kGlm,
        ToolCallFormat::kGlmCompact, ToolCallFormat::kDeepSeekV31, ToolCallFormat::kDsml, ToolCallFormat::kKimi,
        ToolCallFormat::kCommandR7b, ToolCallFormat::kCommandR, ToolCallFormat::kGranite, ToolCallFormat::kHarmony,
        ToolCallFormat::kGemma4}) {
    SCOPED_TRACE(tool_call_format_name(format));
    for (bool parallel : {false, true}) {
      auto g = tool_call_grammar(tools, format, parallel);
      ASSERT_TRUE(std::holds_alternative<std::shared_ptr<const grammar::CompiledGrammar>>(g));
      const auto& compiled = std::get<std::shared_ptr<const grammar::CompiledGrammar>>(g);
      std::mt19937 rng(static_cast<uint32_t>(format) * 2 + parallel);
      // 24 walks a format; under the sanitizers (sanitizer_stride.h) 6 for
      // single calls (parallel calls keep 24: some formats need that many
      // to give a walk with several calls).
      const int walks = parallel ? 24 : 24 / testing::kSanitizerStride;
      int n_walks = 0, max_calls = 0;
      for (int i = 0; i < walks; ++i) {
        auto text = random_walk(compiled, rng);
        if (!text) continue;
        ++n_walks;
        OutputParser parser({.parse_reasoning = true,
                             .starts_in_reasoning = false,
                             .parse_tool_calls = true,
                             .parameter_types = tool_parameter_types(tools),
                             .harmony = format == ToolCallFormat::kHarmony});
        OutputDelta d;
        parser.push(*text, d);
        parser.finish(d);
        SCOPED_TRACE(*text);
        EXPECT_EQ(d.content, "");
        ASSERT_GE(d.tool_calls.size(), 1u);
        if (!parallel) {
          EXPECT_EQ(d.tool_calls.size(), 1u);
        }
        max_calls = std::max(max_calls, static_cast<int>(d.tool_calls.size()));
        for (const ToolCall& c : d.tool_calls) {
          const Json args = Json::parse(c.arguments);
          ASSERT_TRUE(args.is_object());
          if (c.name == "get_weather") {
            ASSERT_EQ(args.size(), 2u);
            EXPECT_TRUE(args["city"].is_string());
            const std::string city = args["city"].get<std::string>();  // maxLength counts code points
            EXPECT_LE(std::count_if(city.begin(), city.end(), [](char ch) { return (ch & 0xC0) != 0x80; }), 6);
            EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f");
          } else if (c.name == "plan") {
            ASSERT_TRUE(args["code"].is_string());
            EXPECT_EQ(args["code"].get<std::string>().size(), 3u);
            ASSERT_TRUE(args["stop"].is_object());
            ASSERT_TRUE(args["stop"]["at"].is_number_integer());
            EXPECT_GE(args["stop"]["at"].get<int>(), 1);
            EXPECT_LE(args["stop"]["at"].get<int>(), 9);
            EXPECT_TRUE(!args.contains("fast") || args["fast"].is_boolean() || args["fast"].is_null());
            EXPECT_LE(args.size(), 3u);
          } else {
            EXPECT_EQ(c.name, "ping");
          }
        }
      }
      EXPECT_GT(n_walks, walks * 2 / 3);
      if (parallel && format != ToolCallFormat::kHarmony) {  // harmony: one call per turn
        EXPECT_GT(max_calls, 1);
      }
    }
  }
}

// Gemma 4's own syntax where every parameter is a string or a JSON scalar:
// <|"|>-quoted strings, optional parameters left out with their commas.
TEST(StructuredOutput, Gemma4ForcedCallsUseItsSyntaxForScalarParameters) {
  const Json tools = Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"type": "string", "enum": ["c", "f"]}},
      "required": ["city"]}}},
    {"type": "function", "function": {"name": "count", "parameters": {"type": "object",
      "properties": {"note": {"type": "string", "maxLength": 4}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "exact": {"type": "boolean"}}, "required": ["n"]}}}])");
  auto g = tool_call_grammar(tools, ToolCallFormat::kGemma4, true);
  ASSERT_TRUE(std::holds_alternative<std::shared_ptr<const grammar::CompiledGrammar>>(g));
  std::mt19937 rng(7);
  int n_walks = 0, n_optional_left_out = 0;
  for (int i = 0; i < 40; ++i) {
    auto text = random_walk(std::get<std::shared_ptr<const grammar::CompiledGrammar>>(g), rng);
    if (!text) continue;
    ++n_walks;
    SCOPED_TRACE(*text);
    EXPECT_EQ(text->rfind("<|tool_call>call:", 0), 0u);
    OutputParser parser({.parse_tool_calls = true, .parameter_types = tool_parameter_types(tools)});
    OutputDelta d;
    parser.push(*text, d);
    parser.finish(d);
    EXPECT_EQ(d.content, "");
    ASSERT_GE(d.tool_calls.size(), 1u);
    for (const ToolCall& c : d.tool_calls) {
      const Json args = Json::parse(c.arguments);
      if (c.name == "get_weather") {
        ASSERT_TRUE(args["city"].is_string());
        EXPECT_TRUE(!args.contains("unit") || args["unit"] == "c" || args["unit"] == "f");
        n_optional_left_out += !args.contains("unit");
      } else {
        ASSERT_EQ(c.name, "count");
        ASSERT_TRUE(args["n"].is_number_integer());
        EXPECT_TRUE(!args.contains("note") || args["note"].is_string());
        EXPECT_TRUE(!args.contains("exact") || args["exact"].is_boolean());
        n_optional_left_out += !args.contains("note");
      }
    }
  }
  EXPECT_GT(n_walks, 30);
  EXPECT_GT(n_optional_left_out, 0);
}

TEST(StructuredOutput, ToolSchemaErrorsNameTheTool) {
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters":
      {"type": "object", "properties": {"x": {"type": "string", "contentEncoding": "base64"}}}}}])");
  auto g = tool_call_grammar(tools, ToolCallFormat::kGeneric, true);
  ASSERT_TRUE(std::holds_alternative<ApiError>(g));
  EXPECT_EQ(std::get<ApiError>(g).param, "tools[0].function.parameters");
  EXPECT_NE(std::get<ApiError>(g).message.find("contentEncoding"), std::string::npos);
}

TEST(StructuredOutput, XmlToolCallFormRefusesWhatItCannotWriteBare) {
  const char* cases[][2] = {
      {R"({"type": "object", "properties": {"x": {"enum": [1, 2]}}})", "needs a 'type'"},
      {R"({"type": "object", "properties": {"x": {"type": ["integer", "string"]}}})", "mixes \"string\""},
      {R"({"type": "object", "properties": {"x": {"type": "string", "format": "date"}}})",
       "'format' at #/properties/x"},
      {R"({"type": "object", "anyOf": [{"required": ["x"]}], "properties": {"x": {"type": "string"}}})",
       "'anyOf' at #"},
      {R"({"type": "object", "properties": {"x": {"type": "object", "not": {}}}})", "'not'"},
  };
  for (const auto& [schema, expected] : cases) {
    Json tools =
        Json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", Json::parse(schema)}}}}});
    auto g = tool_call_grammar(tools, ToolCallFormat::kQwenXml, false);
    ASSERT_TRUE(std::holds_alternative<ApiError>(g)) << schema;
    EXPECT_EQ(std::get<ApiError>(g).param, "tools[0].function.parameters");
    EXPECT_NE(std::get<ApiError>(g).message.find(expected), std::string::npos) << std::get<ApiError>(g).message;
    // The JSON forms take the schemas whose only trouble is bare values.
    if (std::string_view(expected).find("'type'") != std::string_view::npos ||
        std::string_view(expected).find("mixes") != std::string_view::npos ||
        std::string_view(expected).find("'format'") != std::string_view::npos) {
      EXPECT_FALSE(std::holds_alternative<ApiError>(tool_call_grammar(tools, ToolCallFormat::kHermes, false)))
          << schema;
    }
  }
}

TEST(StructuredOutput, ToolParameterTypesForTheXmlCallForm) {
  const Json tools = Json::parse(R"([
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {
      "zip": {"type": "string"}, "n": {"type": ["null", "integer"]}, "any": {}, "flag": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "bare"}}])");
  const auto types = tool_parameter_types(tools);
  ASSERT_NE(types, nullptr);
  EXPECT_EQ(*types,
            (ToolParameterTypes{{"lookup", {{"zip", "string"}, {"n", "integer"}, {"flag", "boolean"}}}, {"bare", {}}}));
  // What the parser does with them: "75001" stays a string for a string parameter.
  OutputParserOptions o;
  o.parse_tool_calls = true;
  o.parameter_types = types;
  OutputParser parser(o);
  OutputDelta d;
  parser.push(
      "<tool_call>\n<function=lookup>\n<parameter=zip>\n75001\n</parameter>\n<parameter=n>\n7\n"
      "</parameter>\n</function>\n</tool_call>",
      d);
  parser.finish(d);
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, R"({"zip":"75001","n":7})");
}

}  // namespace
}  // namespace rill::server
