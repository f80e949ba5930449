#include "text/chat_template.h"

#include "text/jinja_builtins.h"
#include "text/jinja_interpreter.h"
#include "text/jinja_lexer.h"
#include "text/jinja_parser.h"

namespace rill {

Result<ChatTemplate> ChatTemplate::parse(std::string source) {
  auto tokens = jinja::tokenize(source);
  if (!tokens.ok()) return Error{"chat template syntax error: " + tokens.error().message};
  auto body = jinja::parse(std::move(tokens).value());
  if (!body.ok()) return Error{"chat template syntax error: " + body.error().message};
  return ChatTemplate(std::move(source), std::make_shared<const Body>(std::move(body).value()));
}

template <typename Json>
Result<std::string> ChatTemplate::render_impl(const Json& context, const ChatTemplateRenderOptions& options) const {
  if (!context.is_object()) return Error{"chat template error: the render context must be a JSON object"};
  auto globals = std::make_shared<jinja::Frame>(nullptr);
  jinja::install_globals(*globals);
  auto root = std::make_shared<jinja::Frame>(globals);
  for (const auto& [key, value] : context.items()) root->set(key, jinja::from_json(value));

  jinja::RenderLimits limits;
  limits.max_steps = options.max_steps;
  limits.max_call_depth = options.max_call_depth;
  limits.max_bytes = options.max_bytes;
  jinja::Interpreter interp(limits, options.fixed_now);
  auto out = interp.render(*body_, root);
  if (!out.ok()) {
    std::string where = interp.error_line() > 0 ? "line " + std::to_string(interp.error_line()) + ": " : "";
    return Error{"chat template error: " + where + out.error().message};
  }
  return std::move(out).value();
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context,
                                         const ChatTemplateRenderOptions& options) const {
  return render_impl(context, options);
}

Result<std::string> ChatTemplate::render(const nlohmann::json& context,
                                         const ChatTemplateRenderOptions& options) const {
  return render_impl(context, options);
}

}  // namespace rill
