#pragma once
// OpenAI Responses <-> the shared chat pipeline (server/chat_stream.h), as
// pure functions: request JSON -> ResponsesRequest, input items -> chat
// messages, and the Response object / streaming event grammar built by one
// encoder (so a streamed response and its stored copy agree). Field names
// follow the official `openai` Python SDK (types/responses/*.py).
//
// Translation choices:
// - input: a string is one user message; items are message
//   {role: user|assistant|system|developer, content: string | [{type:
//   input_text|output_text, text}]}, function_call {call_id, name,
//   arguments}, function_call_output {call_id, output} and reasoning items.
//   They are normalized (content always a part array) before storing.
// - to chat messages: instructions first as a system message; developer ->
//   system; parts joined with "\n"; function_call items join the assistant
//   message right before them (or start one with content "") as tool_calls;
//   function_call_output -> role "tool" (tool_call_id = call_id, name of the
//   matching call); reasoning text goes to the next assistant message's
//   reasoning_content. Images and files are rejected (400).
// - tools: Responses function tools {type: function, name, description,
//   parameters} -> OpenAI chat tools; other tool types are rejected.
//   tool_choice "none" offers no tools, {type: function, name} only that
//   one; "auto" and "required" offer all (rill does not force a call).
// - reasoning.effort "none" / "minimal" set enable_thinking false, any other
//   effort true with the effort's thinking budget (low 1,024 tokens, medium
//   4,096, high / xhigh unbounded; a 400 naming reasoning.effort for a model
//   without thinking); without `reasoning` the template's default applies.
//   gpt-oss (harmony) takes low / medium / high as its template's
//   reasoning_effort instead (ChatInput::reasoning_effort).
// - rill extensions: top_k, min_p, repetition_penalty, seed.
#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "server/chat_stream.h"
#include "server/errors.h"
#include "server/structured_output.h"
#include "text/output_parser.h"

namespace rill::server {

struct ResponsesRequest {
  nlohmann::ordered_json input_items = nlohmann::ordered_json::array();  // normalized new input
  std::optional<std::string> instructions;                               // unset (absent or null): carried over
  std::string previous_response_id;                                      // "" when none
  std::string model;
  bool stream = false;
  bool store = true;
  std::optional<int32_t> max_output_tokens;
  SamplingOverrides sampling;
  nlohmann::ordered_json chat_tools;                               // null or OpenAI chat tools (after tool_choice)
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // as sent, echoed in the Response
  nlohmann::ordered_json tool_choice = "auto";                     // as sent, echoed
  nlohmann::ordered_json reasoning;                                // null or {effort, summary}, echoed
  std::optional<bool> enable_thinking;
  std::optional<int32_t> thinking_budget;  // reasoning.effort asked for thinking: its budget (-1: unbounded)
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
  bool parallel_tool_calls = true;
  bool speculative = true;                                  // rill: false opts out of the server's speculative decoding
  bool tools_required = false;                              // tool_choice "required" or a named function
  OutputConstraint constraint;                              // text.format json_object / json_schema
  nlohmann::ordered_json text_format = {{"type", "text"}};  // as sent, echoed
};

// Validates a request body. Errors are 400 invalid_request_error naming the
// field ("input[2].content[0].type: ...").
std::variant<ResponsesRequest, ApiError> parse_responses_request(const std::string& body);
std::variant<ResponsesRequest, ApiError> parse_responses_request(const nlohmann::ordered_json& body);

// Chat messages for a conversation: instructions ("" = none) then the items
// (normalized input items and Response output items).
nlohmann::ordered_json items_to_messages(const std::string& instructions, const nlohmann::ordered_json& items);

// The Response object without output and usage (status "in_progress"):
// what response.created carries and what the final object extends.
nlohmann::ordered_json response_skeleton(const ResponsesRequest& req, const std::string& id, int64_t created_at,
                                         const std::string& model, const std::string& instructions,
                                         const SamplingParams& sampling);

// Gives every item of a conversation an id where it has none ("msg_...",
// "fc_...", "fco_...", "rs_..." by type), so GET
// /v1/responses/{id}/input_items can name them and page by them. Ids stay
// what they are once given (the store keeps the items with them).
void assign_item_ids(nlohmann::ordered_json& items);

// One page of GET /v1/responses/{id}/input_items over the stored items
// (oldest first), as OpenAI's list: {object: "list", data, first_id,
// last_id, has_more}. `query` is the URL's query string, undecoded:
// limit (1-100, default 20), order (asc | desc, default desc), after /
// before (an item id of this list: the page starts after / ends before it
// in the chosen order). `include` is refused (no item here carries the
// extra data it names), as is any other parameter. Errors are 400s naming
// the parameter.
std::variant<nlohmann::ordered_json, ApiError> input_items_page(const nlohmann::ordered_json& items,
                                                                const std::string& query);

// {input_tokens, input_tokens_details {cached_tokens}, output_tokens,
//  output_tokens_details {reasoning_tokens}, total_tokens}. reasoning_tokens
// is the engine's count where it tracked the thinking block
// (Usage::reasoning_tokens), else `reasoning_tokens` (the caller's count of
// tokens the parser put in reasoning).
nlohmann::ordered_json responses_usage(const Usage& usage, int32_t reasoning_tokens);

// Builds the output items from parsed deltas and, when `emit_events`, the
// SSE frames of the Responses grammar: response.created / in_progress, then
// per item output_item.added, (content_part.added, *_text.delta*,
// *_text.done, content_part.done | function_call_arguments.delta / .done),
// output_item.done, then response.completed / incomplete. Reasoning goes to
// a reasoning item, content to a message item (a change of kind closes the
// open item); each tool call is a function_call item that streams: added
// (name, arguments "") when its name is read, function_call_arguments.delta
// per arguments piece, .done and output_item.done when it ends. Every frame
// has a sequence_number counting from 0. Not thread-safe.
class ResponsesEncoder {
 public:
  explicit ResponsesEncoder(bool emit_events) : emit_(emit_events) {}

  std::string created(const nlohmann::ordered_json& skeleton);  // created + in_progress
  std::string delta(const OutputDelta& delta);
  // Closes the open item (an empty message when there is no message and no
  // call, so output_text is "" rather than missing), fills `response`
  // (a copy of the skeleton) with status, incomplete_details, output and
  // usage, and returns the closing frames with response.completed or
  // response.incomplete. `incomplete`: the token limit ended it.
  std::string finish(nlohmann::ordered_json& response, bool incomplete, const nlohmann::ordered_json& usage);
  // The generation failed (or the server is shutting down): closes the open
  // item as incomplete, fills `response` (a copy of the skeleton) with
  // status "failed", error {code: server_error, message}, the output so far
  // and usage, and returns the closing frames with response.failed, the
  // Responses stream's terminal failure event.
  std::string failed(nlohmann::ordered_json& response, const std::string& message, const nlohmann::ordered_json& usage);

  const nlohmann::ordered_json& output() const { return output_; }

 private:
  enum class Open { kNone, kReasoning, kMessage };
  std::string frame(const char* type, nlohmann::ordered_json body);
  std::string open(Open kind);
  std::string close(const char* status);
  std::string open_call(const ToolCallDelta& call);
  std::string call_arguments(const std::string& piece);
  std::string close_call(const char* status);  // the open function_call item, if any

  const bool emit_;
  int64_t sequence_ = 0;
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();
  Open open_ = Open::kNone;
  bool saw_message_ = false, saw_call_ = false;
  bool call_open_ = false;  // output_.back() is a function_call still streaming
};

// JSON dump that never throws (invalid UTF-8 is replaced).
std::string dump_responses_json(const nlohmann::ordered_json& j);

}  // namespace rill::server
