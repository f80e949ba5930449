#pragma once
// The path every chat-style API shares (OpenAI chat, Responses, Anthropic
// Messages): messages in the OpenAI shape -> the model's chat template ->
// token ids -> the engine -> OutputParser -> deltas and a final result.
// Each API adapter converts its own request to a ChatInput and the callbacks'
// output to its own wire format.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "rill/engine.h"
#include "server/errors.h"
#include "server/server_context.h"
#include "server/structured_output.h"
#include "text/output_parser.h"

namespace rill::server {

struct ChatInput {
  // OpenAI chat messages: {role: system|developer|user|assistant|tool,
  // content: string | [{type: "text", text}] | null, tool_calls?, tool_call_id?, name?}.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null or OpenAI tools [{type: function, function: {...}}]
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // e.g. enable_thinking
  GenerationRequest generation;                                               // everything but the prompt
  // tool_choice "required" / a named function / Anthropic any / tool (then
  // `tools` holds only that one): the output is forced to be tool calls
  // (structured_output.h), one when !parallel_tool_calls. Wins over `constraint`.
  bool tools_required = false;
  bool parallel_tool_calls = true;
  OutputConstraint constraint;  // response_format, grammar, regex, choice
  // False for a prefix meant to be continued (cache warm-up): the template
  // renders the messages only, without the assistant turn's opening.
  bool add_generation_prompt = true;
  // Thinking asked for through an API's own switch (Anthropic `thinking`,
  // chat reasoning_effort, Responses reasoning.effort): `param` names it in
  // the 400 a model without a thinking block gets; `budget` is the most
  // tokens the block may take (-1: unbounded), enforced by the engine.
  struct ThinkingRequest {
    std::string param;
    int32_t budget = -1;
  };
  std::optional<ThinkingRequest> thinking;
  // Chat reasoning_effort / Responses reasoning.effort as given (`param`
  // names the field): the template sees it as `reasoning_effort` unless
  // template_kwargs sets that. A harmony template (gpt-oss) writes it into
  // its system message ("Reasoning: low"), so there it must be low, medium
  // or high (else a 400 naming `param`) and it replaces the thinking budget
  // the effort asked for (`thinking` with the same param).
  struct ReasoningEffort {
    std::string param, value;
  };
  std::optional<ReasoningEffort> reasoning_effort;
};

// The thinking budget a reasoning effort stands for: none and minimal ask
// for no thinking (nullopt), low 1,024 tokens, medium 4,096, high and xhigh
// no bound. `effort` is one the API accepted.
std::optional<int32_t> thinking_budget_for_effort(const std::string& effort);

// The model's thinking block as the engine follows it: a chat template that
// writes <think> and a tokenizer with one token each for <think> and
// </think> (Qwen3, DeepSeek-R1, SmolLM3). Untracked (close -1) otherwise.
GenerationRequest::Thinking model_thinking_tokens(const ServerContext& ctx);

struct ChatResult {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;
  // "stop", "length", "tool_calls", "abort" or "error".
  std::string finish_reason;
  std::string error;                  // finish_reason "error"
  std::string stop_string;            // the stop string that ended it, "" when none
  std::optional<int32_t> stop_token;  // the EOS / stop token that ended it (last of token_ids)
  Usage usage;
  std::vector<int32_t> token_ids;             // every generated id, the EOS / stop token included
  std::vector<SampledToken> logprobs;         // when requested; one per id of token_ids
  std::vector<SampledToken> prompt_logprobs;  // GenerationRequest::prompt_logprobs: prompt tokens 1..n-1
};

struct ChatCallbacks {
  // A parsed delta and the engine event it came from (token ids, logprobs),
  // for every event, the last one included (its delta holds what the parser
  // released at the end). Called on the engine's event dispatcher thread; may be empty of text
  // (e.g. held back).
  std::function<void(const OutputDelta&, const GenerationEvent&)> on_delta;
  // Exactly once, last (after the last on_delta).
  std::function<void(const ChatResult&)> on_done;
};

// Renders messages with the model's template (add_generation_prompt) and
// tokenizes. Validates message shapes (400 naming e.g. "messages[2].role").
// *starts_in_reasoning tells whether the rendered prompt ends inside <think>.
// Error messages start with the offending field ("messages[1].content: ..."
// ; api_error_from() turns that into an ApiError with `param`).
// Context given to the template: messages (content flattened to a string,
// text parts joined by "\n"; role developer -> system; assistant
// tool_calls[].function.arguments parsed into objects; null content -> ""),
// tools (null when absent or empty), add_generation_prompt, bos_token,
// eos_token, then every template_kwargs entry. A model without a template
// gets ChatML.
//
// Tools the template does not render (its text is the same with and
// without them; ChatML never renders them) are described in a system
// message instead (appended to the first system message, or a new one
// first), with rill's generic call format (structured_output.h:
// kGeneric), and earlier assistant tool_calls become that format's text in
// the assistant's content. *tools_native tells which happened. A template
// that renders tools but drops earlier calls (Granite 3.3) gets them as its
// format's text in the content too.
Result<std::vector<int32_t>> render_chat_prompt(const ServerContext& ctx, const ChatInput& in,
                                                bool* starts_in_reasoning, bool* tools_native = nullptr);

// A 400 (or `status`) ApiError from an Error whose message starts with
// "<field>: " (the field, e.g. "messages[0].role", becomes `param`).
ApiError api_error_from(const Error& e, int status = 400);

// A tokenized prompt with the way to parse what the model writes.
struct ChatPrompt {
  std::vector<int32_t> ids;
  OutputParserOptions parser;
  // The reply's text keeps special tokens (GenerationRequest::skip_special_tokens
  // false): the parser reads markers that are special tokens (harmony, tool calls).
  bool keep_special_tokens = false;
  // End-of-generation ids that do not end this reply (harmony's <|end|>).
  std::vector<int32_t> not_eos;
  std::string param = "messages";  // named by "the prompt does not fit" errors
  // The output's grammar (forced tool calls or the constraint); null: free.
  // ChatStream::start puts it on each generation that has none.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // The model's thinking block and its budget (ChatInput::thinking); the
  // grammar applies after it. ChatStream::start puts it on each generation
  // that tracks none.
  GenerationRequest::Thinking thinking;
};
// render_chat_prompt + parser options (tool calls parsed when tools were
// passed) + the grammar: forced tool calls in the template's call format
// (kGeneric when the template renders no tools), else in.constraint.
// Errors are ApiErrors (400 naming the field: a schema keyword the
// converter refuses names tools[i].function.parameters or the constraint's
// field).
std::variant<ChatPrompt, ApiError> prepare_chat_prompt(const ServerContext& ctx, const ChatInput& in);

// The most tokens a sequence may hold: the context, or the KV pool's share
// per layer group when that is smaller.
int64_t max_sequence_tokens(const Engine& engine);

// Fills unset sampling fields: server flags, then generation_config, then
// built-in defaults. Request values that are set win.
struct SamplingOverrides {
  std::optional<float> temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
};
SamplingParams resolve_sampling(const ServerContext& ctx, const SamplingOverrides& request);

// One running chat generation. Keep the shared_ptr while it runs; cancel()
// (e.g. on client disconnect) ends it with finish_reason "abort". The
// generation does not depend on the ChatStream object staying alive.
//
// generation.max_tokens <= 0 means "as many as fit": the context left after
// the prompt, capped by ServerOptions::default_max_tokens and max_tokens_cap
// (generation.prompt_only: none; the prompt only has to fit).
// A max_tokens that does not fit is a 400 naming "max_tokens"; a prompt that
// fills the context a 400 naming ChatPrompt::param. Metrics (TTFT, ITL) go
// to ctx.metrics when set.
class ChatStream {
 public:
  // Renders, submits and returns; errors are ApiErrors (400 for bad input).
  static std::variant<std::shared_ptr<ChatStream>, ApiError> start(ServerContext& ctx, ChatInput input,
                                                                   ChatCallbacks callbacks);
  // Submits an already prepared prompt (n choices share one render; raw
  // completions pass their ids with parsing off). generation.prompt is
  // replaced by prompt.ids.
  static std::variant<std::shared_ptr<ChatStream>, ApiError> start(ServerContext& ctx, const ChatPrompt& prompt,
                                                                   GenerationRequest generation,
                                                                   ChatCallbacks callbacks);
  void cancel();
  uint64_t request_id() const { return id_; }

 private:
  ServerContext* ctx_ = nullptr;
  uint64_t id_ = 0;
};

}  // namespace rill::server
