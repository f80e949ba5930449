#pragma once
// Anthropic Messages <-> the shared chat pipeline (server/chat_stream.h), as
// pure functions: request JSON -> ChatInput, ChatResult -> a Message object,
// and the streaming event grammar as an encoder that returns SSE frames.
// Field names follow the official `anthropic` Python SDK (types/*.py).
//
// Translation choices:
// - system (string | text blocks) becomes a leading system message; text
//   blocks of one message are joined with "\n".
// - assistant tool_use blocks become OpenAI tool_calls (arguments = the input
//   object as compact JSON text); user tool_result blocks become role "tool"
//   messages (tool_call_id = tool_use_id, name = the matching tool_use's name),
//   placed before the user's text of the same turn, since templates expect
//   tool results right after the assistant turn that called them. An
//   is_error result's text is prefixed with "Error: ".
// - thinking / redacted_thinking blocks in the history are dropped; image and
//   document blocks are rejected (400).
// - tool_choice: "none" offers no tools; "tool" offers only the named tool
//   and forces a call of it; "any" offers all and forces a call of one
//   (ChatInput::tools_required: a grammar over the call format, arguments
//   matching input_schema); "auto" leaves it to the model.
//   disable_parallel_tool_use: true allows one call.
// - thinking {type: enabled|adaptive} / {type: disabled} set the template's
//   enable_thinking; budget_tokens is accepted and ignored.
// - usage: Anthropic counts input_tokens as the prompt tokens NOT read from a
//   cache, with cache_read_input_tokens separate (the total prompt is their
//   sum), so input_tokens = prompt_tokens - cached_tokens and
//   cache_read_input_tokens = cached_tokens; rill never writes a cache on
//   request, so cache_creation_input_tokens is 0.
#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "server/chat_stream.h"
#include "server/errors.h"
#include "text/output_parser.h"

namespace rill::server {

struct AnthropicRequest {
  ChatInput chat;              // messages, tools, template_kwargs, generation (max_tokens, stop)
  SamplingOverrides sampling;  // temperature, top_p, top_k as sent
  std::string model;
  bool stream = false;
};

// Validates and translates a request body. `count_tokens`: the
// /v1/messages/count_tokens shape (no max_tokens, no sampling, no stream).
// Errors are 400 invalid_request_error whose message names the field
// ("messages[1].content[0].type: ...").
std::variant<AnthropicRequest, ApiError> parse_anthropic_request(const nlohmann::ordered_json& body, bool count_tokens);
// Parses the body text first ("invalid JSON: ...").
std::variant<AnthropicRequest, ApiError> parse_anthropic_request(const std::string& body, bool count_tokens);

// Random ids: "msg_" / "toolu_" + 24 base62 characters.
std::string new_anthropic_id(const char* prefix);

struct AnthropicStop {
  std::string reason;                   // end_turn | max_tokens | stop_sequence | tool_use
  std::optional<std::string> sequence;  // the matched stop sequence (stop_sequence only)
};
// From finish_reason, tool_calls and stop_string.
AnthropicStop anthropic_stop(const ChatResult& result);

nlohmann::ordered_json anthropic_usage(const Usage& usage);

// The non-streaming reply: a Message object. Content: a thinking block when
// there was reasoning, a text block when there was text or nothing else, then
// one tool_use block per call (input parsed; text that is not a JSON object
// becomes {}).
nlohmann::ordered_json anthropic_message(const std::string& id, const std::string& model, const ChatResult& result,
                                         const AnthropicStop& stop);

// The streaming grammar: message_start, then per content block
// content_block_start / content_block_delta* / content_block_stop, then
// message_delta and message_stop. Each call returns the SSE frames to write
// (possibly ""). Not thread-safe: one stream, one writer at a time.
class AnthropicStreamEncoder {
 public:
  AnthropicStreamEncoder(std::string id, std::string model) : id_(std::move(id)), model_(std::move(model)) {}

  // message_start: the message with empty content and `usage` as far as it
  // is known (the engine reports usage with its last event, so callers that
  // have no prompt count pass {}); message_delta carries the final usage.
  std::string start(const Usage& usage = {});
  // Reasoning goes to a thinking block, content to a text block (a change of
  // kind closes the open block); each tool call is a tool_use block that
  // streams: content_block_start (id, name, input {}) when its name is read,
  // input_json_delta partial_json per arguments piece, content_block_stop
  // when it ends.
  std::string delta(const OutputDelta& delta);
  // Closes the open block (an empty text block when nothing was streamed and
  // there were no tool calls, matching anthropic_message), then
  // message_delta (stop reason, full usage) and message_stop.
  std::string finish(const ChatResult& result, const AnthropicStop& stop);
  // An `error` event {type: error, error: {type: api_error, message}}.
  static std::string error(const std::string& message);

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };
  std::string open(Block kind);
  std::string close();

  std::string id_, model_;
  Block open_ = Block::kNone;
  int open_index_ = -1;  // index of the open block
  int n_blocks_ = 0;     // blocks started so far (the next block's index)
};

// JSON dump that never throws (invalid UTF-8 is replaced).
std::string dump_json(const nlohmann::ordered_json& j);

}  // namespace rill::server
