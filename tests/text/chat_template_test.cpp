// Real chat templates (SmolLM2, Llama-3, Qwen3, Gemma-3, Llama-3.2-Vision,
// gpt-oss harmony: tools/make_harmony_goldens.py)
// rendered over ~17 conversations each and compared byte for byte with
// Python jinja2 as transformers configures it (tools/make_template_goldens.py),
// plus the interface contracts: errors instead of crashes, resource limits.
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"

namespace rill {
namespace {

nlohmann::ordered_json load(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::ordered_json::parse(in);
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

class RealTemplates : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTemplates, MatchTransformersRendering) {
  const auto golden = load(std::string(RILL_TEST_DATA) + "/templates/" + GetParam() + ".json");
  auto tmpl = ChatTemplate::parse(golden["template"].get<std::string>());
  ASSERT_TRUE(tmpl.ok()) << tmpl.error().message;
  ChatTemplateRenderOptions options;
  options.fixed_now = fixed_now();
  ASSERT_GE(golden["cases"].size(), 8u);
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(GetParam() + " / " + c["name"].get<std::string>());
    auto out = tmpl->render(c["context"], options);
    if (c.contains("expected")) {
      ASSERT_TRUE(out.ok()) << out.error().message;
      EXPECT_EQ(out.value(), c["expected"].get<std::string>());
      continue;
    }
    const std::string error = c["error"];
    ASSERT_FALSE(out.ok()) << "jinja2 raised " << error << "\nrill rendered:\n" << out.value();
    const std::string kRaised = "TemplateError: ";  // raise_exception(message)
    if (error.rfind(kRaised, 0) == 0) {
      EXPECT_NE(out.error().message.find(error.substr(kRaised.size())), std::string::npos) << out.error().message;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ChatTemplate, RealTemplates,
                         ::testing::Values("smollm2", "llama3", "qwen3", "gemma3", "llama3_2_vision", "gpt_oss",
                                           "gemma4", "gemma4_interleaved"));

TEST(ChatTemplate, SmolLM2FromGgufMetadataText) {
  // The template exactly as stored in the default model's GGUF metadata.
  auto tmpl = ChatTemplate::parse(
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\n' }}{% endif %}");
  ASSERT_TRUE(tmpl.ok()) << tmpl.error().message;
  nlohmann::json context = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"add_generation_prompt", true}};
  auto out = tmpl->render(context);  // the nlohmann::json overload
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(out.value(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, SyntaxErrorsNameTheLine) {
  auto tmpl = ChatTemplate::parse("line one\n{% if x %}\nbody\n{% endfor %}");
  ASSERT_FALSE(tmpl.ok());
  EXPECT_NE(tmpl.error().message.find("syntax error"), std::string::npos) << tmpl.error().message;
  EXPECT_NE(tmpl.error().message.find("line 4"), std::string::npos) << tmpl.error().message;
}

TEST(ChatTemplate, RenderErrorsNameTheLine) {
  auto tmpl = ChatTemplate::parse("ok\n{{ messages[0].content }}\n{{ missing.attr }}");
  ASSERT_TRUE(tmpl.ok());
  auto out = tmpl->render(nlohmann::ordered_json{{"messages", {{{"content", "x"}}}}});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("line 3"), std::string::npos) << out.error().message;
  EXPECT_NE(out.error().message.find("'missing' is undefined"), std::string::npos) << out.error().message;
}

TEST(ChatTemplate, RaiseExceptionCarriesTheMessage) {
  auto tmpl = ChatTemplate::parse("{{ raise_exception('Conversation roles must alternate') }}");
  ASSERT_TRUE(tmpl.ok());
  auto out = tmpl->render(nlohmann::ordered_json::object());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("Conversation roles must alternate"), std::string::npos);
}

TEST(ChatTemplate, StepLimitStopsRunawayLoops) {
  auto tmpl = ChatTemplate::parse("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}");
  ASSERT_TRUE(tmpl.ok());
  ChatTemplateRenderOptions options;
  options.max_steps = 20000;
  auto out = tmpl->render(nlohmann::ordered_json::object(), options);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("step limit"), std::string::npos) << out.error().message;
}

TEST(ChatTemplate, RecursionLimitStopsInfiniteMacros) {
  auto tmpl = ChatTemplate::parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_TRUE(tmpl.ok());
  auto out = tmpl->render(nlohmann::ordered_json::object());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("recursion"), std::string::npos) << out.error().message;
}

TEST(ChatTemplate, SizeLimitStopsExponentialStrings) {
  auto tmpl = ChatTemplate::parse(
      "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
      "{% endfor %}{{ ns.s | length }}");
  ASSERT_TRUE(tmpl.ok());
  ChatTemplateRenderOptions options;
  options.max_bytes = size_t(1) << 20;
  auto out = tmpl->render(nlohmann::ordered_json::object(), options);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("limit"), std::string::npos) << out.error().message;
}

TEST(ChatTemplate, SelfReferencingNamespaceIsSafe) {
  auto tmpl = ChatTemplate::parse("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}");
  ASSERT_TRUE(tmpl.ok());
  auto out = tmpl->render(nlohmann::ordered_json::object());
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(out.value(), "<Namespace {'me': <Namespace {...}>}>");
}

TEST(ChatTemplate, ToolSchemaKeepsClientKeyOrder) {
  auto tmpl = ChatTemplate::parse("{{ tools[0] | tojson }}");
  ASSERT_TRUE(tmpl.ok());
  const auto context = nlohmann::ordered_json::parse(R"({"tools": [{"z": 1, "a": {"y": "é", "b": null}}]})");
  auto out = tmpl->render(context);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(out.value(), R"({"z": 1, "a": {"y": "é", "b": null}})");
}

TEST(ChatTemplate, StrftimeNowUsesTheLocalClockByDefault) {
  auto tmpl = ChatTemplate::parse("{{ strftime_now('%Y') }}");
  ASSERT_TRUE(tmpl.ok());
  auto out = tmpl->render(nlohmann::ordered_json::object());
  ASSERT_TRUE(out.ok());
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  EXPECT_EQ(out.value(), std::to_string(tm.tm_year + 1900));
}

TEST(ChatTemplate, CopiesShareTheParsedTemplate) {
  auto tmpl = ChatTemplate::parse("{{ x }}");
  ASSERT_TRUE(tmpl.ok());
  const ChatTemplate copy = tmpl.value();
  auto out = copy.render(nlohmann::ordered_json{{"x", 5}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out.value(), "5");
  EXPECT_EQ(copy.source(), "{{ x }}");
}

}  // namespace
}  // namespace rill
