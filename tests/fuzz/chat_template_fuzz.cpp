// Parses and renders arbitrary template text against a fixed conversation.
// Must never crash, hang or leak: every failure is an Error, and the step,
// depth and size limits bound the work of any template.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json kContext = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi <b> & é 😀"},
      {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello", "reasoning_content": null,
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, true]}}}]},
      {"role": "tool", "content": "{\"ok\": true}", "tool_call_id": "c1"},
      {"role": "user", "content": [{"type": "text", "text": "list content"}, {"type": "image"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "enable_thinking": false,
    "bos_token": "<s>", "eos_token": "</s>", "n": 3, "f": -0.5, "s": "text"
  })");
  return kContext;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  auto tmpl = rill::ChatTemplate::parse(std::string(reinterpret_cast<const char*>(data), size));
  if (!tmpl.ok()) return 0;
  rill::ChatTemplateRenderOptions options;
  options.max_steps = 100000;  // keeps each input fast; the real default is 10M
  options.max_bytes = size_t(1) << 20;
  options.fixed_now = std::tm{};
  auto out = tmpl->render(context(), options);
  (void)out;
  return 0;
}
