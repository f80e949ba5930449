#include "server/chat_stream.h"

#include <algorithm>
#include <chrono>
#include <mutex>

#include "core/json_parse.h"
#include "model/model.h"
#include "server/metrics.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace rill::server {
namespace {

using Clock = std::chrono::steady_clock;
using ojson = nlohmann::ordered_json;

std::string field(std::string_view base, size_t i) {
  return std::string(base) + "[" + std::to_string(i) + "]";
}

Error bad(const std::string& param, const std::string& message) {
  return Error{param + ": " + message};
}

// Content as one string: a string as is, text parts joined by "\n", null "".
Result<std::string> flatten_content(const ojson& content, const std::string& param, bool allow_null) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) {
    if (allow_null) return std::string();
    return bad(param, "expected a string or an array of content parts, got null");
  }
  if (!content.is_array()) return bad(param, "expected a string or an array of content parts");
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const ojson& part = content[j];
    const std::string p = field(param, j);
    if (!part.is_object()) return bad(p, "expected an object {\"type\": \"text\", \"text\": ...}");
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) return bad(p + ".type", "expected a string");
    const std::string& t = type->get_ref<const std::string&>();
    if (t != "text" && t != "input_text" && t != "output_text") {
      return bad(p + ".type", "unsupported content type '" + t + "' (this model reads text only)");
    }
    auto txt = part.find("text");
    if (txt == part.end() || !txt->is_string()) return bad(p + ".text", "expected a string");
    if (j > 0) text += "\n";
    text += txt->get_ref<const std::string&>();
  }
  return text;
}

// Validates an assistant message's tool_calls and parses their arguments
// into objects (transformers' templates print them with tojson).
Result<ojson> convert_tool_calls(const ojson& calls, const std::string& param) {
  if (!calls.is_array()) return bad(param, "expected an array");
  ojson out = ojson::array();
  for (size_t j = 0; j < calls.size(); ++j) {
    const std::string p = field(param, j);
    if (!calls[j].is_object()) return bad(p, "expected an object");
    ojson call = calls[j];
    auto fn = call.find("function");
    if (fn == call.end() || !fn->is_object()) return bad(p + ".function", "expected an object");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) return bad(p + ".function.name", "expected a string");
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null()) {
      (*fn)["arguments"] = ojson::object();
    } else if (args->is_string()) {
      // Depth-limited like the body (json_body.h): the template walks it recursively.
      const std::string args_path = p + ".function.arguments";
      auto parsed = parse_json(args->get_ref<const std::string&>(), {args_path});
      if (auto* j = std::get_if<ojson>(&parsed)) {
        *args = std::move(*j);
      } else if (auto& e = std::get<JsonParseError>(parsed); e.kind == JsonParseError::Kind::kTooDeep) {
        return Error{e.message};
      }  // else not JSON: the template sees the text
    } else if (!args->is_object()) {
      return bad(p + ".function.arguments", "expected a JSON string");
    }
    if (!call.contains("type")) call["type"] = "function";
    out.push_back(std::move(call));
  }
  return out;
}

Result<ojson> convert_messages(const ojson& messages) {
  if (!messages.is_array()) return bad("messages", "expected an array of messages");
  if (messages.empty()) return bad("messages", "must contain at least one message");
  ojson out = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string p = field("messages", i);
    const ojson& m = messages[i];
    if (!m.is_object()) return bad(p, "expected an object with a role and content");
    auto role_it = m.find("role");
    if (role_it == m.end()) return bad(p + ".role", "field required");
    if (!role_it->is_string()) return bad(p + ".role", "expected a string");
    std::string role = role_it->get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return bad(p + ".role", "unknown role '" + role_it->get<std::string>() +
                                  "' (expected system, developer, user, assistant or tool)");
    }
    ojson msg = m;
    msg["role"] = role;
    const bool assistant = role == "assistant";
    auto content = m.find("content");
    if (content == m.end() && !assistant) return bad(p + ".content", "field required");
    RILL_ASSIGN_OR_RETURN(std::string text,
                          flatten_content(content == m.end() ? ojson() : *content, p + ".content", assistant));
    msg["content"] = std::move(text);
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (!assistant) return bad(p + ".tool_calls", "only assistant messages have tool_calls");
      RILL_ASSIGN_OR_RETURN(msg["tool_calls"], convert_tool_calls(*calls, p + ".tool_calls"));
    } else if (calls != m.end()) {
      msg.erase("tool_calls");
    }
    for (const char* key : {"name", "tool_call_id", "reasoning_content"}) {
      auto it = m.find(key);
      if (it != m.end() && !it->is_null() && !it->is_string()) return bad(p + "." + key, "expected a string");
    }
    out.push_back(std::move(msg));
  }
  return out;
}

// ChatML, for models that ship no template.
std::string render_chatml(const ojson& messages, bool add_generation_prompt) {
  std::string text;
  for (const ojson& m : messages) {
    text += "<|im_start|>" + m["role"].get<std::string>() + "\n" + m["content"].get<std::string>() + "<|im_end|>\n";
  }
  return add_generation_prompt ? text + "<|im_start|>assistant\n" : text;
}

bool ends_inside_think(std::string_view text) {
  while (!text.empty() && (text.back() == ' ' || text.back() == '\n' || text.back() == '\t' || text.back() == '\r')) {
    text.remove_suffix(1);
  }
  constexpr std::string_view kOpen = "<think>";
  return text.size() >= kOpen.size() && text.substr(text.size() - kOpen.size()) == kOpen;
}

std::string token_string(const Tokenizer& tok, std::optional<int32_t> id) {
  return id ? tok.token_to_piece(*id) : std::string();
}

const char* finish_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAborted:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "error";
}

// One generation's state, owned by the engine callback.
struct StreamState {
  StreamState(ServerContext& ctx, OutputParserOptions parser_options, ChatCallbacks callbacks)
      : ctx(ctx), parser(parser_options), callbacks(std::move(callbacks)) {}

  void on_event(GenerationEvent&& event) {
    observe_latency(event.token_ids.size());
    result.token_ids.insert(result.token_ids.end(), event.token_ids.begin(), event.token_ids.end());
    result.logprobs.insert(result.logprobs.end(), event.logprobs.begin(), event.logprobs.end());
    result.prompt_logprobs.insert(result.prompt_logprobs.end(), event.prompt_logprobs.begin(),
                                  event.prompt_logprobs.end());
    OutputDelta delta;
    parser.push(event.text, delta);
    if (event.finished) parser.finish(delta);
    result.content += delta.content;
    result.reasoning += delta.reasoning;
    result.tool_calls.insert(result.tool_calls.end(), delta.tool_calls.begin(), delta.tool_calls.end());
    if (callbacks.on_delta) callbacks.on_delta(delta, event);
    if (!event.finished) return;
    result.finish_reason = finish_name(event.finish_reason);
    if (event.finish_reason == FinishReason::kStop && parser.saw_tool_calls()) result.finish_reason = "tool_calls";
    result.error = event.error;
    result.stop_string = event.stop_string;
    result.stop_token = event.stop_token;
    result.usage = event.usage;
    if (callbacks.on_done) callbacks.on_done(result);
  }

  void observe_latency(size_t n_tokens) {
    if (n_tokens == 0) return;
    const Clock::time_point now = Clock::now();
    if (ctx.metrics != nullptr) {
      if (!got_token) {
        ctx.metrics->observe_ttft(std::chrono::duration<double>(now - submitted).count());
      } else {
        const double per_token = std::chrono::duration<double>(now - last_token).count() / double(n_tokens);
        for (size_t i = 0; i < n_tokens; ++i) ctx.metrics->observe_itl(per_token);
      }
    }
    got_token = true;
    last_token = now;
  }

  ServerContext& ctx;
  OutputParser parser;
  ChatCallbacks callbacks;
  ChatResult result;
  Clock::time_point submitted = Clock::now(), last_token;
  bool got_token = false;
};

}  // namespace

ApiError api_error_from(const Error& e, int status) {
  ApiError out;
  out.status = status;
  out.message = e.message;
  if (status >= 500) out.type = "server_error";
  const size_t colon = e.message.find(": ");
  if (colon != std::string::npos && colon > 0) {
    const std::string head = e.message.substr(0, colon);
    if (head.find(' ') == std::string::npos) out.param = head;
  }
  return out;
}

namespace {

Result<std::string> render_text(const ServerContext& ctx, const ChatInput& in, ojson messages, const ojson& tools) {
  const Tokenizer& tok = *ctx.engine.tokenizer();
  if (ctx.chat_template == nullptr) return render_chatml(messages, in.add_generation_prompt);
  ojson context = ojson::object();
  context["messages"] = std::move(messages);
  context["tools"] = tools;
  context["add_generation_prompt"] = in.add_generation_prompt;
  context["bos_token"] = token_string(tok, tok.bos_id());
  context["eos_token"] = token_string(tok, tok.eos_id());
  if (in.template_kwargs.is_object()) {
    for (auto it = in.template_kwargs.begin(); it != in.template_kwargs.end(); ++it) {
      if (it.key() != "messages") context[it.key()] = it.value();
    }
  }
  if (in.reasoning_effort && !context.contains("reasoning_effort")) {
    context["reasoning_effort"] = in.reasoning_effort->value;
  }
  return ctx.chat_template->render(context);
}

// Assistant turns' tool_calls written after their content as `calls_text`
// gives them (the template then sees no tool_calls); false when none had any.
bool calls_into_content(ojson& messages, std::string (*calls_text)(const ojson&)) {
  bool any = false;
  for (ojson& m : messages) {
    auto calls = m.find("tool_calls");
    if (m["role"] != "assistant" || calls == m.end()) continue;
    std::string content = m["content"].get<std::string>();
    if (!content.empty()) content += "\n";
    content += calls_text(*calls);
    m["content"] = std::move(content);
    m.erase("tool_calls");
    any = true;
  }
  return any;
}

// The messages with the tools described in a system message and earlier
// calls written as content, in the generic format.
ojson with_generic_tools(ojson messages, const ojson& tools) {
  const std::string description = generic_tools_prompt(tools);
  calls_into_content(messages, &generic_tool_calls_text);
  if (!messages.empty() && messages[0]["role"] == "system") {
    std::string content = messages[0]["content"].get<std::string>();
    messages[0]["content"] = content.empty() ? description : content + "\n\n" + description;
  } else {
    messages.insert(messages.begin(), ojson{{"role", "system"}, {"content", description}});
  }
  return messages;
}

}  // namespace

Result<std::vector<int32_t>> render_chat_prompt(const ServerContext& ctx, const ChatInput& in,
                                                bool* starts_in_reasoning, bool* tools_native) {
  const Tokenizer* tok = ctx.engine.tokenizer();
  if (tok == nullptr) return Error{"the model has no tokenizer: chat requests need one"};
  RILL_ASSIGN_OR_RETURN(ojson messages, convert_messages(in.messages));
  const bool has_tools = in.tools.is_array() && !in.tools.empty();
  const ojson tools = has_tools ? in.tools : ojson(nullptr);
  RILL_ASSIGN_OR_RETURN(std::string text, render_text(ctx, in, messages, tools));
  bool native = false;
  if (has_tools) {
    // A template that fails without tools reads them (Command R+'s tool-use template).
    auto without = render_text(ctx, in, messages, ojson(nullptr));
    native = !without.ok() || without.value() != text;
    if (!native) {
      RILL_ASSIGN_OR_RETURN(text, render_text(ctx, in, with_generic_tools(std::move(messages), tools), ojson(nullptr)));
    } else if (tool_call_format(ctx.chat_template, true) == ToolCallFormat::kGranite &&
               calls_into_content(messages, &granite_tool_calls_text)) {
      // Granite 3.3's template drops earlier calls: they go in as the text the model writes.
      RILL_ASSIGN_OR_RETURN(text, render_text(ctx, in, std::move(messages), tools));
    }
  }
  if (tools_native != nullptr) *tools_native = native;
  if (starts_in_reasoning != nullptr) *starts_in_reasoning = ends_inside_think(text);
  // As transformers' apply_chat_template: the template writes the special
  // tokens itself, so none are added here.
  return tok->encode(text, /*add_special=*/false, /*parse_special=*/true);
}

std::optional<int32_t> thinking_budget_for_effort(const std::string& effort) {
  if (effort == "none" || effort == "minimal") return std::nullopt;
  if (effort == "low") return 1024;
  if (effort == "medium") return 4096;
  return -1;
}

GenerationRequest::Thinking model_thinking_tokens(const ServerContext& ctx) {
  GenerationRequest::Thinking t;
  const Tokenizer* tok = ctx.engine.tokenizer();
  if (tok == nullptr || ctx.chat_template == nullptr ||
      ctx.chat_template->source().find("<think>") == std::string::npos) {
    return t;
  }
  const std::vector<int32_t> open = tok->encode("<think>", false, true);
  const std::vector<int32_t> close = tok->encode("</think>", false, true);
  if (open.size() != 1 || close.size() != 1 || open[0] == close[0]) return t;
  t.open = open[0];
  t.close = close[0];
  return t;
}

std::variant<ChatPrompt, ApiError> prepare_chat_prompt(const ServerContext& ctx, const ChatInput& in) {
  ChatPrompt prompt;
  // gpt-oss: the harmony format's channels carry reasoning, answer and calls.
  const bool harmony = ctx.chat_template != nullptr &&
                       tool_call_format_of_source(ctx.chat_template->source()) == ToolCallFormat::kHarmony;
  std::optional<ChatInput::ThinkingRequest> thinking = in.thinking;
  if (harmony && in.reasoning_effort) {
    // The template's "Reasoning: <effort>" line is harmony's control: no budget.
    const ChatInput::ReasoningEffort& effort = in.reasoning_effort.value();
    if (effort.value != "low" && effort.value != "medium" && effort.value != "high") {
      return ApiError(400,
                      effort.param + ": this model (gpt-oss, harmony) reasons at low, medium or high effort, got \"" +
                          effort.value + "\"",
                      "invalid_request_error", effort.param);
    }
    if (thinking && thinking->param == effort.param) thinking.reset();
  }
  prompt.thinking = model_thinking_tokens(ctx);
  if (thinking && !prompt.thinking.tracked()) {
    return ApiError(400,
                    thinking->param +
                        ": this model has no thinking mode (its chat template writes no <think> block with a "
                        "<think> / </think> token pair)",
                    "invalid_request_error", thinking->param);
  }
  bool starts_in_reasoning = false, tools_native = false;
  auto ids = render_chat_prompt(ctx, in, &starts_in_reasoning, &tools_native);
  if (!ids.ok()) {
    return api_error_from(ids.error(), ctx.engine.tokenizer() == nullptr ? 500 : 400);
  }
  prompt.ids = std::move(ids).value();
  prompt.parser.parse_reasoning = true;
  prompt.parser.starts_in_reasoning = starts_in_reasoning;
  prompt.thinking.starts_inside = starts_in_reasoning && prompt.thinking.tracked();
  if (thinking) prompt.thinking.budget = thinking->budget;
  prompt.parser.parse_tool_calls = in.tools.is_array() && !in.tools.empty();
  prompt.parser.harmony = harmony;
  if (harmony && ctx.engine.tokenizer() != nullptr) {
    // <|end|> closes a harmony message (the analysis before the answer),
    // not the reply, though the tokenizer counts it among the end-of-turn names.
    const std::vector<int32_t> end = ctx.engine.tokenizer()->encode("<|end|>", false, true);
    if (end.size() == 1) prompt.not_eos = end;
  }
  // The parser reads markers that are special tokens (harmony's, [TOOL_CALLS], <|python_tag|>, ...).
  prompt.keep_special_tokens = harmony || prompt.parser.parse_tool_calls;
  const ToolCallFormat format = tool_call_format(ctx.chat_template, tools_native);
  if (in.tools_required && prompt.parser.parse_tool_calls) {
    auto g = tool_call_grammar(in.tools, format, in.parallel_tool_calls, ctx.engine.tokenizer());
    if (auto* e = std::get_if<ApiError>(&g)) return std::move(*e);
    prompt.grammar = std::get<std::shared_ptr<const grammar::CompiledGrammar>>(std::move(g));
  } else if (!in.constraint.empty()) {
    bool names_tokens = false;
    auto g = compile_constraint(in.constraint, ctx.engine.tokenizer(), &names_tokens, harmony);
    if (names_tokens) prompt.keep_special_tokens = true;
    if (auto* e = std::get_if<ApiError>(&g)) return std::move(*e);
    prompt.grammar = std::get<std::shared_ptr<const grammar::CompiledGrammar>>(std::move(g));
  }
  // The XML call form writes bare values; the tools' types say which are strings.
  if (prompt.parser.parse_tool_calls) prompt.parser.parameter_types = tool_parameter_types(in.tools);
  return prompt;
}

int64_t max_sequence_tokens(const Engine& engine) {
  const Model& model = engine.model();
  int64_t n = model.n_ctx();
  int64_t n_attention_groups = 0;
  for (const LayerGroupSpec& g : model.kv_spec()) n_attention_groups += g.is_attention() ? 1 : 0;
  if (n_attention_groups > 0) {
    // Conservative: a sliding group is counted as if it held the whole sequence.
    const int64_t pool_tokens = int64_t(model.n_kv_blocks()) / n_attention_groups * model.kv_block_size();
    n = std::min(n, pool_tokens);
  }
  return n;
}

SamplingParams resolve_sampling(const ServerContext& ctx, const SamplingOverrides& request) {
  static const GenerationDefaults kNone;
  const GenerationDefaults& d = ctx.generation != nullptr ? *ctx.generation : kNone;
  const ServerOptions& o = ctx.options;
  SamplingParams p;
  // generation_config do_sample false: greedy unless someone asks otherwise.
  const float model_temperature = d.do_sample.value_or(true) ? d.temperature.value_or(1.0f) : 0.0f;
  p.temperature = request.temperature.value_or(o.temperature.value_or(model_temperature));
  p.top_p = request.top_p.value_or(o.top_p.value_or(d.top_p.value_or(1.0f)));
  p.top_k = request.top_k.value_or(o.top_k.value_or(d.top_k.value_or(0)));
  p.min_p = request.min_p.value_or(o.min_p.value_or(d.min_p.value_or(0.0f)));
  p.repetition_penalty =
      request.repetition_penalty.value_or(o.repetition_penalty.value_or(d.repetition_penalty.value_or(1.0f)));
  p.presence_penalty = request.presence_penalty.value_or(0.0f);
  p.frequency_penalty = request.frequency_penalty.value_or(0.0f);
  p.seed = request.seed;
  // top_p 0 keeps only the most likely token: greedy, as top_k 1 is.
  if (p.top_p <= 0.0f) {
    p.top_p = 1.0f;
    p.top_k = 1;
  }
  return p;
}

std::variant<std::shared_ptr<ChatStream>, ApiError> ChatStream::start(ServerContext& ctx, ChatInput input,
                                                                      ChatCallbacks callbacks) {
  auto prompt = prepare_chat_prompt(ctx, input);
  if (auto* e = std::get_if<ApiError>(&prompt)) return std::move(*e);
  return start(ctx, std::get<ChatPrompt>(prompt), std::move(input.generation), std::move(callbacks));
}

std::variant<std::shared_ptr<ChatStream>, ApiError> ChatStream::start(ServerContext& ctx, const ChatPrompt& prompt,
                                                                      GenerationRequest generation,
                                                                      ChatCallbacks callbacks) {
  const int64_t n_prompt = static_cast<int64_t>(prompt.ids.size());
  const int64_t room = max_sequence_tokens(ctx.engine) - n_prompt;
  if (n_prompt == 0) return api_error_from(Error{prompt.param + ": the prompt is empty"});
  if (room < (generation.prompt_only ? 0 : 1)) {
    ApiError e =
        api_error_from(Error{prompt.param + ": the prompt (" + std::to_string(n_prompt) + " tokens) " +
                             (generation.prompt_only ? "exceeds" : "leaves no room for output in") +
                             " the context of " + std::to_string(max_sequence_tokens(ctx.engine)) + " tokens"});
    e.code = "context_length_exceeded";
    return e;
  }
  const int32_t cap = ctx.options.max_tokens_cap;
  if (generation.prompt_only) {
    generation.max_tokens = 0;
  } else if (generation.max_tokens <= 0) {
    int64_t n = room;
    if (ctx.options.default_max_tokens > 0) n = std::min<int64_t>(n, ctx.options.default_max_tokens);
    if (cap > 0) n = std::min<int64_t>(n, cap);
    generation.max_tokens = static_cast<int32_t>(n);
  } else if (cap > 0 && generation.max_tokens > cap) {
    return api_error_from(Error{"max_tokens: must be at most " + std::to_string(cap) + " on this server"});
  } else if (generation.max_tokens > room) {
    ApiError e =
        api_error_from(Error{"max_tokens: the prompt (" + std::to_string(n_prompt) + " tokens) + max_tokens (" +
                             std::to_string(generation.max_tokens) + ") exceed the context of " +
                             std::to_string(max_sequence_tokens(ctx.engine)) + " tokens"});
    e.code = "context_length_exceeded";
    return e;
  }
  generation.prompt = prompt.ids;
  if (!generation.grammar) generation.grammar = prompt.grammar;
  if (prompt.keep_special_tokens) generation.skip_special_tokens = false;
  if (!prompt.not_eos.empty() && !generation.ignore_eos) {
    generation.ignore_eos = true;  // the other end-of-generation ids still end it:
    for (int32_t id : ctx.engine.eos_ids()) {
      if (std::find(prompt.not_eos.begin(), prompt.not_eos.end(), id) == prompt.not_eos.end()) {
        generation.stop_token_ids.push_back(id);
      }
    }
  }
  if (!generation.thinking.tracked()) generation.thinking = prompt.thinking;
  auto state = std::make_shared<StreamState>(ctx, prompt.parser, std::move(callbacks));
  auto id = ctx.engine.submit(std::move(generation), [state](GenerationEvent&& ev) { state->on_event(std::move(ev)); });
  if (!id.ok()) {
    const bool shutting_down = id.error().message.find("shutting down") != std::string::npos;
    ApiError e = api_error_from(id.error(), shutting_down ? 503 : 400);
    return e;
  }
  auto stream = std::make_shared<ChatStream>();
  stream->ctx_ = &ctx;
  stream->id_ = *id;
  return stream;
}

void ChatStream::cancel() {
  if (ctx_ != nullptr) ctx_->engine.cancel(id_);
}

}  // namespace rill::server
