#pragma once
// The path every chat-style API shares (OpenAI chat, Responses, Anthropic
// Messages): messages in the OpenAI shape -> the model's chat template ->
// token ids -> the engine -> OutputParser -> deltas and a final result.
// Each API adapter converts its own request to a ChatInput and the callbacks'
// output to its own wire format.
#include <functional>
#include <memory>
#include <optional>
#include <variant>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "rill/engine.h"
#include "server/errors.h"
#include "server/server_context.h"
#include "text/output_parser.h"

namespace rill::server {

struct ChatInput {
  // OpenAI chat messages: {role: system|developer|user|assistant|tool,
  // content: string | [{type: "text", text}] | null, tool_calls?, tool_call_id?, name?}.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;            // null or OpenAI tools [{type: function, function: {...}}]
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // e.g. enable_thinking
  GenerationRequest generation;            // everything but the prompt
};

struct ChatResult {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;
  // "stop", "length", "tool_calls", "abort" or "error".
  std::string finish_reason;
  std::string error;  // finish_reason "error"
  Usage usage;
  std::vector<int32_t> token_ids;
  std::vector<SampledToken> logprobs;  // when requested
};

struct ChatCallbacks {
  // A parsed delta and the engine event it came from (token ids, logprobs).
  // Called on the engine thread; may be empty of text (e.g. held back).
  std::function<void(const OutputDelta&, const GenerationEvent&)> on_delta;
  // Exactly once, last.
  std::function<void(const ChatResult&)> on_done;
};

// Renders messages with the model's template (add_generation_prompt) and
// tokenizes. Validates message shapes (400 naming e.g. "messages[2].role").
// *starts_in_reasoning tells whether the rendered prompt ends inside <think>.
Result<std::vector<int32_t>> render_chat_prompt(const ServerContext& ctx, const ChatInput& in,
                                                bool* starts_in_reasoning);

// Fills unset sampling fields: server flags, then generation_config, then
// built-in defaults. Request values that are set win.
struct SamplingOverrides {
  std::optional<float> temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
};
SamplingParams resolve_sampling(const ServerContext& ctx, const SamplingOverrides& request);

// One running chat generation. Keep the shared_ptr while it runs; cancel()
// (e.g. on client disconnect) ends it with finish_reason "abort".
class ChatStream {
 public:
  // Renders, submits and returns; errors are ApiErrors (400 for bad input).
  static std::variant<std::shared_ptr<ChatStream>, ApiError> start(ServerContext& ctx, ChatInput input,
                                                                   ChatCallbacks callbacks);
  void cancel();
  uint64_t request_id() const { return id_; }

 private:
  ServerContext* ctx_ = nullptr;
  uint64_t id_ = 0;
};

}  // namespace rill::server
