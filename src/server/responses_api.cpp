// OpenAI Responses: POST /v1/responses, GET and DELETE /v1/responses/{id}
// over the shared chat pipeline and the response store. Translation lives in
// server/responses_convert.*; this file owns one call's lifetime: resolve the
// previous_response_id chain, start, stream or reply, store, cancel on
// disconnect.
#include <chrono>
#include <mutex>
#include <string_view>

#include "server/api_handlers.h"
#include "server/chat_stream.h"
#include "server/metrics.h"
#include "server/response_store.h"
#include "server/responses_convert.h"

namespace rill::server {

namespace {

using Json = nlohmann::ordered_json;

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The {id} of /v1/responses/{id} and /v1/responses/{id}/input_items (with
// or without /v1).
std::string path_id(const HttpRequest& req) {
  constexpr std::string_view kItems = "/input_items";
  std::string_view p = req.path;
  if (p.size() > kItems.size() && p.substr(p.size() - kItems.size()) == kItems) p.remove_suffix(kItems.size());
  const size_t slash = p.find_last_of('/');
  return std::string(slash == std::string_view::npos ? p : p.substr(slash + 1));
}

ApiError not_found(const std::string& id, const std::string& param) {
  return ApiError(404, "Response with id '" + id + "' not found (unknown, deleted or expired).",
                  "invalid_request_error", param, param.empty() ? "" : "previous_response_not_found");
}

// One POST /v1/responses call. The engine's event dispatcher thread (callbacks) and the I/O
// thread (the handler, after start returns) both write; `mu` orders their
// frames, and whichever comes first opens the stream.
struct ResponsesCall {
  ResponsesCall(ServerContext& ctx, std::shared_ptr<Responder> res, bool streaming, bool store, Json skeleton,
                Json effective_input, std::string instructions)
      : ctx(ctx),
        res(std::move(res)),
        streaming(streaming),
        store(store),
        skeleton(std::move(skeleton)),
        effective_input(std::move(effective_input)),
        instructions(std::move(instructions)),
        encoder(streaming) {}

  // Requires mu held.
  void begin_stream() {
    if (!streaming || stream_started) return;
    stream_started = true;
    if (ctx.metrics != nullptr) ctx.metrics->stream_opened();
    res->start_stream("text/event-stream", {{"Cache-Control", "no-cache"}});
    res->write(encoder.created(skeleton));
  }

  // Requires mu held.
  void end_stream(std::string frames) {
    begin_stream();
    if (!frames.empty()) res->write(std::move(frames));
    // Closed first: the context may be gone once the reply has ended.
    if (ctx.metrics != nullptr) ctx.metrics->stream_closed();
    res->end();
  }

  void on_delta(const OutputDelta& delta, const GenerationEvent& event) {
    std::lock_guard lk(mu);
    // Tokens count as reasoning while the parser last produced reasoning
    // only (held-back text makes this exact only up to a marker's length).
    if (!delta.content.empty() || !delta.tool_calls.empty() || !delta.tool_call_deltas.empty()) {
      in_reasoning = false;
    } else if (!delta.reasoning.empty()) {
      in_reasoning = true;
    }
    if (in_reasoning) reasoning_tokens += int32_t(event.token_ids.size());
    if (delta.empty()) return;
    std::string frames = encoder.delta(delta);
    if (!streaming) return;
    begin_stream();
    if (!frames.empty()) res->write(std::move(frames));
  }

  void on_done(const ChatResult& result) {
    std::lock_guard lk(mu);
    done = true;
    stream.reset();  // the stream may hold these callbacks; break the cycle
    if (result.finish_reason == "error" || result.finish_reason == "abort") {
      const std::string message = result.finish_reason == "abort"
                                      ? "the generation was cancelled"
                                      : (result.error.empty() ? "generation failed" : result.error);
      if (streaming) {
        Json response = skeleton;
        return end_stream(encoder.failed(response, message, responses_usage(result.usage, reasoning_tokens)));
      }
      return send_error(*res, ApiError(500, message, "server_error", "", "server_error"));
    }
    Json response = skeleton;
    const std::string frames =
        encoder.finish(response, result.finish_reason == "length", responses_usage(result.usage, reasoning_tokens));
    // Stored before the reply goes out, so a follow-up sent as soon as the
    // client sees it finds it.
    if (store && ctx.responses != nullptr) {
      StoredResponse entry;
      entry.response = response;
      assign_item_ids(effective_input);
      entry.input_items = std::move(effective_input);
      entry.instructions = instructions;
      ctx.responses->put(response["id"].get<std::string>(), std::move(entry));
    }
    if (streaming) return end_stream(frames);
    res->send(200, "application/json", dump_responses_json(response));
  }

  ServerContext& ctx;
  std::shared_ptr<Responder> res;
  const bool streaming, store;
  const Json skeleton;  // the Response as of response.created

  std::mutex mu;         // guards everything below
  Json effective_input;  // the conversation before this output (moved into the store)
  std::string instructions;
  ResponsesEncoder encoder;
  std::shared_ptr<ChatStream> stream;  // kept alive until on_done
  int32_t reasoning_tokens = 0;
  bool in_reasoning = false, stream_started = false, done = false;
};

}  // namespace

void handle_responses_create(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res) {
  auto parsed = parse_responses_request(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(*res, *e);
  ResponsesRequest& request = std::get<ResponsesRequest>(parsed);

  // The conversation so far: the previous response's effective input and
  // output, then the new input; instructions carry over unless given.
  Json effective_input = Json::array();
  std::string instructions = request.instructions.value_or("");
  if (!request.previous_response_id.empty()) {
    std::shared_ptr<const StoredResponse> previous;
    if (ctx.responses != nullptr) previous = ctx.responses->get(request.previous_response_id);
    if (previous == nullptr) return send_error(*res, not_found(request.previous_response_id, "previous_response_id"));
    effective_input = previous->input_items;
    for (const Json& item : previous->response["output"]) effective_input.push_back(item);
    if (!request.instructions) instructions = previous->instructions;
  }
  for (Json& item : request.input_items) effective_input.push_back(std::move(item));

  if (effective_input.empty())
    return send_error(*res, ApiError(400, "input: must contain at least one item", "invalid_request_error", "input"));
  ChatInput chat;
  chat.messages = items_to_messages(instructions, effective_input);
  chat.tools = request.chat_tools;
  chat.tools_required = request.tools_required;
  chat.parallel_tool_calls = request.parallel_tool_calls;
  chat.constraint = request.constraint;
  if (request.enable_thinking) chat.template_kwargs["enable_thinking"] = *request.enable_thinking;
  if (request.thinking_budget) chat.thinking = ChatInput::ThinkingRequest{"reasoning.effort", *request.thinking_budget};
  if (request.reasoning.is_object() && request.reasoning["effort"].is_string()) {
    chat.reasoning_effort =
        ChatInput::ReasoningEffort{"reasoning.effort", request.reasoning["effort"].get<std::string>()};
  }
  auto prepared = prepare_chat_prompt(ctx, chat);
  if (auto* e = std::get_if<ApiError>(&prepared)) return send_error(*res, *e);
  ChatPrompt& prompt = std::get<ChatPrompt>(prepared);
  prompt.param = "input";
  GenerationRequest generation;
  generation.sampling = resolve_sampling(ctx, request.sampling);
  // Unset: as many as fit (ChatStream applies the server's default and cap).
  generation.max_tokens = request.max_output_tokens.value_or(0);
  generation.speculative = request.speculative;

  request.store = request.store && ctx.responses != nullptr;
  const std::string model = request.model.empty() ? ctx.options.model_id : request.model;
  Json skeleton =
      response_skeleton(request, random_id("resp_"), unix_seconds(), model, instructions, generation.sampling);
  auto call = std::make_shared<ResponsesCall>(ctx, res, request.stream, request.store, std::move(skeleton),
                                              std::move(effective_input), std::move(instructions));
  ChatCallbacks callbacks;
  callbacks.on_delta = [call](const OutputDelta& d, const GenerationEvent& ev) { call->on_delta(d, ev); };
  callbacks.on_done = [call](const ChatResult& r) { call->on_done(r); };

  auto started = ChatStream::start(ctx, prompt, std::move(generation), std::move(callbacks));
  if (auto* e = std::get_if<ApiError>(&started)) {
    if (e->param == "max_tokens") {  // ChatStream speaks chat-completions
      e->param = "max_output_tokens";
      if (e->message.rfind("max_tokens", 0) == 0) e->message.replace(0, 10, "max_output_tokens");
    }
    return send_error(*res, *e);
  }
  std::shared_ptr<ChatStream> stream = std::get<std::shared_ptr<ChatStream>>(std::move(started));
  {
    std::lock_guard lk(call->mu);
    if (!call->done) call->stream = stream;
    // response.created goes out now, not with the first token, so the
    // client sees the stream open during prefill.
    call->begin_stream();
  }
  std::weak_ptr<ChatStream> weak = stream;
  res->on_disconnect([weak] {
    if (auto s = weak.lock()) s->cancel();
  });
}

void handle_responses_get(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res) {
  const std::string id = path_id(req);
  std::shared_ptr<const StoredResponse> stored;
  if (ctx.responses != nullptr) stored = ctx.responses->get(id);
  if (stored == nullptr) return send_error(*res, not_found(id, ""));
  res->send(200, "application/json", dump_responses_json(stored->response));
}

void handle_responses_input_items(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res) {
  const std::string id = path_id(req);
  std::shared_ptr<const StoredResponse> stored;
  if (ctx.responses != nullptr) stored = ctx.responses->get(id);
  if (stored == nullptr) return send_error(*res, not_found(id, ""));
  auto page = input_items_page(stored->input_items, req.query);
  if (auto* e = std::get_if<ApiError>(&page)) return send_error(*res, *e);
  res->send(200, "application/json", dump_responses_json(std::get<Json>(page)));
}

void handle_responses_delete(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res) {
  const std::string id = path_id(req);
  if (ctx.responses == nullptr || !ctx.responses->erase(id)) return send_error(*res, not_found(id, ""));
  const Json body = {{"id", id}, {"object", "response.deleted"}, {"deleted", true}};
  res->send(200, "application/json", dump_responses_json(body));
}

}  // namespace rill::server
