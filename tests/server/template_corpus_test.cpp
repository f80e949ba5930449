// All 57 vendors' chat templates in ../shared/templates, through rill's
// Jinja and held to jinja2 as transformers configures it
// (tools/make_template_corpus_goldens.py): rendered with tools, a tool call
// and its result, byte for byte; each template's tool-call format as the
// server detects it; and, for the formats the output parser reads, the text
// the template writes for one and two calls read back to those calls.
// Templates rill renders differently from jinja2 are listed below with the
// reason, and the test holds them to it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "server/structured_output.h"
#include "text/chat_template.h"
#include "text/output_parser.h"

namespace rill::server {
namespace {

using Json = nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::tm fixed_now() {  // the goldens' strftime_now clock: 2024-07-26 09:30:00
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 9;
  tm.tm_min = 30;
  const std::time_t t = timegm(&tm);
  gmtime_r(&t, &tm);
  return tm;
}

// The format each template's calls are written in, as tool_call_format
// names it ("generic": the template renders no tools, or writes calls in a
// syntax the output parser does not read, so forced calls use rill's JSON form).
const std::map<std::string, std::string> kExpectedFormat = {
    {"Apertus-8B-Instruct.jinja", "generic"},  // <|tools_prefix|>[{"name": {...}}]
    {"Apriel-1.6-15b-Thinker-fixed.jinja", "generic"},
    {"Bielik-11B-v3.0-Instruct.jinja", "hermes"},
    {"ByteDance-Seed-OSS.jinja", "generic"},  // <seed:tool_call>
    {"CohereForAI-c4ai-command-r-plus-tool_use.jinja", "command-r"},
    {"CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "command-r7b"},
    {"GLM-4.6.jinja", "glm"},
    {"GLM-4.7-Flash.jinja", "glm-compact"},
    {"GigaChat3-10B-A1.8B.jinja", "generic"},
    {"GigaChat3.1-10B-A1.8B.jinja", "generic"},
    {"HuggingFaceTB-SmolLM3-3B.jinja", "generic"},
    {"Kimi-K2-Instruct.jinja", "kimi-k2"},
    {"Kimi-K2-Thinking.jinja", "kimi-k2"},
    {"LFM2-8B-A1B.jinja", "generic"},
    {"LFM2.5-8B-A1B.jinja", "generic"},  // <|tool_call_start|>[f(x=1)]
    {"LFM2.5-Instruct.jinja", "generic"},
    {"MiMo-VL.jinja", "hermes"},
    {"MiniMax-M2.jinja", "generic"},  // <minimax:tool_call><invoke name=...>
    {"Mistral-Small-3.2-24B-Instruct-2506.jinja", "mistral-call-id"},
    {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "qwen-xml"},
    {"NVIDIA-Nemotron-Nano-v2.jinja", "generic"},  // <TOOLCALL>[...]
    {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "hermes"},
    {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "hermes"},
    {"Qwen-QwQ-32B.jinja", "hermes"},
    {"Qwen-Qwen2.5-7B-Instruct.jinja", "hermes"},
    {"Qwen-Qwen3-0.6B.jinja", "hermes"},
    {"Qwen3-Coder.jinja", "qwen-xml"},
    {"Qwen3.5-4B.jinja", "qwen-xml"},
    {"Reka-Edge.jinja", "hermes"},
    {"StepFun3.5-Flash.jinja", "qwen-xml"},
    {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "generic"},
    {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "generic"},
    {"deepseek-ai-DeepSeek-V3.1.jinja", "generic"},  // renders no tools; its calls are read back (kReadBack)
    {"deepseek-ai-DeepSeek-V3.2.jinja", "deepseek-dsml"},
    {"fireworks-ai-llama-3-firefunction-v2.jinja", "generic"},
    {"google-gemma-2-2b-it.jinja", "generic"},
    {"google-gemma-4-31B-it-interleaved.jinja", "gemma4"},
    {"google-gemma-4-31B-it.jinja", "gemma4"},
    {"ibm-granite-granite-3.3-2B-Instruct.jinja", "granite"},
    {"ibm-granite-granite-4.0.jinja", "hermes"},
    {"ibm-granite-granite-4.1.jinja", "hermes"},
    {"llama-cpp-deepseek-r1.jinja", "generic"},
    {"llama-cpp-rwkv-world.jinja", "generic"},
    {"meetkai-functionary-medium-v3.1.jinja", "generic"},  // <function=f>{...}</function>
    {"meetkai-functionary-medium-v3.2.jinja", "generic"},
    {"meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3-json"},
    {"meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3-json"},
    {"meta-llama-Llama-3.3-70B-Instruct.jinja", "llama3-json"},
    {"microsoft-Phi-3.5-mini-instruct.jinja", "generic"},
    {"mistralai-Ministral-3-14B-Reasoning-2512.jinja", "mistral-args"},
    {"mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral-json"},
    {"moonshotai-Kimi-K2.jinja", "kimi-k2"},
    {"openai-gpt-oss-120b.jinja", "harmony"},
    {"stepfun-ai-Step-3.5-Flash.jinja", "qwen-xml"},
    {"unsloth-Apriel-1.5.jinja", "generic"},  // <tool_calls>[...] list
    {"unsloth-mistral-Devstral-Small-2507.jinja", "mistral-args"},
    {"upstage-Solar-Open-100B.jinja", "generic"},
};

// Templates whose own call syntax the parser reads although the server
// forces rill's generic form for them (the template renders no tools).
const std::set<std::string> kReadBack = {"deepseek-ai-DeepSeek-V3.1.jinja"};

// Templates that render tools but drop an assistant turn's tool_calls: the
// call syntax is the vendor's documented one (Granite 3.3: <|tool_call|>[...]).
const std::set<std::string> kWritesNoCalls = {"ibm-granite-granite-3.3-2B-Instruct.jinja"};

// Renders where rill differs from jinja2: {template/case: a piece of rill's
// error that names the construct}. Every entry is checked to still fail so.
const std::map<std::string, std::string> kRenderGaps = {};

class TemplateCorpus : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::ifstream in(std::string(RILL_TEST_DATA) + "/templates/corpus.json");
    ASSERT_TRUE(in.good());
    goldens_ = new Json(Json::parse(in));
  }
  static void TearDownTestSuite() {
    delete goldens_;
    goldens_ = nullptr;
  }
  static Json* goldens_;
};
Json* TemplateCorpus::goldens_ = nullptr;

TEST_F(TemplateCorpus, CoversEveryTemplateInTheSharedDirectory) {
  std::vector<std::string> on_disk;
  for (const auto& e : std::filesystem::directory_iterator(std::string(RILL_SHARED_DIR) + "/templates")) {
    if (e.path().extension() == ".jinja") on_disk.push_back(e.path().filename().string());
  }
  std::sort(on_disk.begin(), on_disk.end());
  std::vector<std::string> in_goldens;
  for (const Json& g : *goldens_) in_goldens.push_back(g["template"].get<std::string>());
  EXPECT_EQ(on_disk, in_goldens) << "re-run tools/make_template_corpus_goldens.py";
  EXPECT_EQ(on_disk.size(), 57u);
  EXPECT_EQ(kExpectedFormat.size(), on_disk.size());
}

TEST_F(TemplateCorpus, RendersAsJinja2Does) {
  ChatTemplateRenderOptions options;
  options.fixed_now = fixed_now();
  int n_equal = 0, n_errors_agree = 0, n_gaps = 0;
  for (const Json& g : *goldens_) {
    const std::string name = g["template"];
    auto tmpl = ChatTemplate::parse(read_file(std::string(RILL_SHARED_DIR) + "/templates/" + name));
    for (const Json& c : g["cases"]) {
      const std::string id = name + "/" + c["name"].get<std::string>();
      SCOPED_TRACE(id);
      const auto gap = kRenderGaps.find(id);
      auto out = tmpl.ok() ? tmpl->render(c["context"], options) : Result<std::string>(tmpl.error());
      if (gap != kRenderGaps.end()) {
        ++n_gaps;
        ASSERT_FALSE(out.ok()) << "listed as a gap but renders now: drop it from kRenderGaps";
        EXPECT_NE(out.error().message.find(gap->second), std::string::npos) << out.error().message;
        continue;
      }
      if (c.contains("expected")) {
        ASSERT_TRUE(out.ok()) << out.error().message;
        EXPECT_EQ(out.value(), c["expected"].get<std::string>());
        n_equal += out.value() == c["expected"].get<std::string>();
        continue;
      }
      const std::string error = c["error"];
      ASSERT_FALSE(out.ok()) << "jinja2 raised " << error << "\nrill rendered:\n" << out.value();
      ++n_errors_agree;
      const std::string kRaised = "TemplateError: ";  // raise_exception(message)
      if (error.rfind(kRaised, 0) == 0) {
        EXPECT_NE(out.error().message.find(error.substr(kRaised.size())), std::string::npos) << out.error().message;
      }
    }
  }
  std::printf("templates: %d renders equal to jinja2, %d jinja2 errors matched, %d listed gaps\n", n_equal,
              n_errors_agree, n_gaps);
}

// The server's detection (tool_call_format: the template renders tools and
// prints these markers) and, where the parser reads the format, the
// template's own call text read back.
TEST_F(TemplateCorpus, ToolCallFormatsAreDetectedAndReadBack) {
  int n_read_back = 0;
  for (const Json& g : *goldens_) {
    const std::string name = g["template"];
    SCOPED_TRACE(name);
    auto tmpl = ChatTemplate::parse(read_file(std::string(RILL_SHARED_DIR) + "/templates/" + name));
    ASSERT_TRUE(tmpl.ok()) << tmpl.error().message;
    const Json* with = nullptr;
    const Json* without = nullptr;
    for (const Json& c : g["cases"]) {
      if (c["name"] == "tools") with = &c;
      if (c["name"] == "no_tools") without = &c;
    }
    ASSERT_TRUE(with != nullptr && without != nullptr);
    // A template that fails on the tools where it renders without them reads
    // them (Command R+ wants a description on every parameter).
    const bool renders_tools =
        without->contains("expected") && (!with->contains("expected") || (*with)["expected"] != (*without)["expected"]);
    const ToolCallFormat format = tool_call_format(&tmpl.value(), renders_tools);
    const auto expected = kExpectedFormat.find(name);
    ASSERT_NE(expected, kExpectedFormat.end());
    EXPECT_EQ(tool_call_format_name(format), expected->second);
    if (format == ToolCallFormat::kGeneric && !kReadBack.count(name)) continue;
    const Json& tools = (*with)["context"]["tools"];
    const Json calls = Json::parse(R"([["get_weather", {"city": "Paris", "days": 3}],
        ["search", {"query": "caf\u00e9 \"quoted\"", "filters": {"n": [1, 2.5, true, null]}}]])");
    for (size_t n_calls = 1; n_calls <= 2; ++n_calls) {
      const Json& call_text = g["call_texts"][n_calls - 1];
      if (call_text.is_null()) continue;  // the template refuses the turn (Llama 3.x: one call at a time)
      if (kWritesNoCalls.count(name)) {   // its vendor's call syntax: tests/text/output_parser_test.cpp
        EXPECT_EQ(call_text["text"], "");
        continue;
      }
      SCOPED_TRACE(call_text["text"].get<std::string>());
      const OutputParserOptions options{.parse_reasoning = true,
                                        .starts_in_reasoning = call_text["starts_in_reasoning"].get<bool>(),
                                        .parse_tool_calls = true,
                                        .parameter_types = tool_parameter_types(tools),
                                        .harmony = format == ToolCallFormat::kHarmony};
      const std::string text = call_text["text"];
      OutputParser parser(options);
      OutputDelta d;
      parser.push(text, d);
      parser.finish(d);
      EXPECT_EQ(d.content, "");
      ASSERT_EQ(d.tool_calls.size(), n_calls);
      for (size_t i = 0; i < n_calls; ++i) {
        EXPECT_EQ(d.tool_calls[i].name, calls[i][0].get<std::string>());
        EXPECT_EQ(Json::parse(d.tool_calls[i].arguments), calls[i][1]);
      }
      // Streamed a byte at a time: the same calls, their argument pieces adding up to them.
      OutputParser streamed(options);
      OutputDelta all;
      std::vector<std::string> pieces(n_calls);
      for (size_t b = 0; b <= text.size(); ++b) {
        OutputDelta step;
        if (b < text.size()) {
          streamed.push(std::string_view(text).substr(b, 1), step);
        } else {
          streamed.finish(step);
        }
        all.content += step.content;
        for (const ToolCallDelta& piece : step.tool_call_deltas) {
          ASSERT_LT(piece.index, n_calls);
          pieces[piece.index] += piece.arguments;
        }
        for (ToolCall& c : step.tool_calls) all.tool_calls.push_back(c);
      }
      EXPECT_EQ(all.content, "");
      ASSERT_EQ(all.tool_calls.size(), n_calls);
      for (size_t i = 0; i < n_calls; ++i) {
        EXPECT_EQ(all.tool_calls[i].name, d.tool_calls[i].name);
        EXPECT_EQ(all.tool_calls[i].arguments, d.tool_calls[i].arguments);
        EXPECT_EQ(pieces[i], d.tool_calls[i].arguments);
      }
      ++n_read_back;
    }
  }
  EXPECT_GE(n_read_back, 30);
}

}  // namespace
}  // namespace rill::server
