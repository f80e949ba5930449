#pragma once
// Chat templates: the Jinja programs in tokenizer_config.json /
// GGUF tokenizer.chat_template that turn a conversation into prompt text.
//
// Rendering matches Hugging Face transformers byte for byte: jinja2's
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
// extensions=[loopcontrols]) with transformers' tojson (json.dumps,
// ensure_ascii=False, no HTML escaping), raise_exception and strftime_now.
// The interpreter (src/text/jinja_*) has no I/O and bounded cost: a step
// budget, a call-depth limit and a size ceiling turn runaway templates into
// Errors.
//
// Context: the variables the template sees, as transformers passes them:
//   {"messages": [{"role", "content" (string or [{"type":"text","text":...}]),
//                  "tool_calls", "tool_call_id", "name", "reasoning_content"}...],
//    "tools": [...] or null, "add_generation_prompt": bool,
//    "bos_token": "...", "eos_token": "...", ...extra kwargs (enable_thinking, ...)}
// A key that is absent is Undefined in the template; a JSON null is None.
// Pass nlohmann::ordered_json to keep object key order (tool schemas are
// printed with tojson in the order the client sent them).
//
// Verified against jinja2 3.1 by tests/data/templates/*.json (real templates
// and ~190 feature snippets, tools/make_template_goldens.py). Known
// differences, none used by real chat templates: integers are 64-bit
// (overflow is an Error, Python has big ints); range() returns a list and
// dict.keys()/values()/items() return lists (Python prints range(0, 3),
// dict_keys([...])); escape/safe return plain strings (no Markup);
// generators print as "<generator object>" (Python adds an address);
// groupby, slice, random, striptags, urlize and friends are not provided.
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"

namespace rill {

namespace jinja {
struct Stmt;
}

struct ChatTemplateRenderOptions {
  // strftime_now() reads this instead of the local clock when set (tests,
  // reproducible prompts).
  std::optional<std::tm> fixed_now;
  int64_t max_steps = 10'000'000;       // expression/statement evaluations
  int max_call_depth = 100;             // nested macro calls and recursive loops
  size_t max_bytes = size_t(64) << 20;  // largest string or output
};

class ChatTemplate {
 public:
  // Errors: "chat template syntax error: line 3: ..."
  static Result<ChatTemplate> parse(std::string source);

  // Errors: "chat template error: line 7: <message>"; raise_exception(msg)
  // in the template yields "chat template error: line N: msg".
  Result<std::string> render(const nlohmann::ordered_json& context,
                             const ChatTemplateRenderOptions& options = {}) const;
  Result<std::string> render(const nlohmann::json& context, const ChatTemplateRenderOptions& options = {}) const;

  const std::string& source() const { return source_; }

 private:
  using Body = std::vector<std::unique_ptr<jinja::Stmt>>;
  ChatTemplate(std::string source, std::shared_ptr<const Body> body)
      : source_(std::move(source)), body_(std::move(body)) {}
  template <typename Json>
  Result<std::string> render_impl(const Json& context, const ChatTemplateRenderOptions& options) const;

  std::string source_;
  std::shared_ptr<const Body> body_;  // immutable after parse; copies share it
};

}  // namespace rill
