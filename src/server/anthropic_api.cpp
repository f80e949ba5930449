// Anthropic Messages: POST /v1/messages and /v1/messages/count_tokens over
// the shared chat pipeline. Translation lives in server/anthropic_convert.*;
// this file owns one call's lifetime: start, stream or reply, cancel on
// disconnect.
#include <mutex>

#include "server/anthropic_convert.h"
#include "server/api_handlers.h"
#include "server/chat_stream.h"
#include "server/metrics.h"

namespace rill::server {

namespace {

// One /v1/messages call. The engine's event dispatcher thread (callbacks) and the I/O thread
// (the handler, after start returns) both write; `mu` orders their frames,
// and whichever comes first sends message_start.
struct MessagesCall {
  MessagesCall(ServerContext& ctx, std::shared_ptr<Responder> res, std::string model, bool streaming,
               int32_t n_prompt_tokens)
      : ctx(ctx),
        res(std::move(res)),
        id(new_anthropic_id("msg_")),
        model(std::move(model)),
        streaming(streaming),
        n_prompt_tokens(n_prompt_tokens),
        encoder(id, this->model) {}

  // Requires mu held.
  void begin_stream() {
    if (!streaming || stream_started) return;
    stream_started = true;
    if (ctx.metrics != nullptr) ctx.metrics->stream_opened();
    res->start_stream("text/event-stream", {{"Cache-Control", "no-cache"}});
    // The cache hits are known only at the end; message_delta corrects both.
    Usage known;
    known.prompt_tokens = n_prompt_tokens;
    res->write(encoder.start(known));
  }

  void on_delta(const OutputDelta& delta) {
    if (!streaming) return;
    std::lock_guard lk(mu);
    begin_stream();
    std::string frames = encoder.delta(delta);
    if (!frames.empty()) res->write(std::move(frames));
  }

  void on_done(const ChatResult& result) {
    std::lock_guard lk(mu);
    const AnthropicStop stop = anthropic_stop(result);
    if (streaming) {
      begin_stream();
      if (result.finish_reason == "error") {
        res->write(AnthropicStreamEncoder::error(result.error.empty() ? "generation failed" : result.error));
      } else if (result.finish_reason != "abort") {
        res->write(encoder.finish(result, stop));
      }
      // Closed first: the context may be gone once the reply has ended.
      if (ctx.metrics != nullptr) ctx.metrics->stream_closed();
      res->end();
      return;
    }
    if (result.finish_reason == "error" || result.finish_reason == "abort") {
      ApiError e;
      e.status = 500;
      e.type = "api_error";
      e.message = result.finish_reason == "abort" ? "the generation was cancelled"
                                                  : (result.error.empty() ? "generation failed" : result.error);
      send_anthropic_error(*res, e);
      return;
    }
    res->send(200, "application/json", dump_json(anthropic_message(id, model, result, stop)));
  }

  ServerContext& ctx;
  std::shared_ptr<Responder> res;
  const std::string id, model;
  const bool streaming;
  const int32_t n_prompt_tokens;

  std::mutex mu;  // guards everything below
  AnthropicStreamEncoder encoder;
  bool stream_started = false;
};

}  // namespace

void handle_messages(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res) {
  auto parsed = parse_anthropic_request(req.body, /*count_tokens=*/false);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_anthropic_error(*res, *e);
  AnthropicRequest& request = std::get<AnthropicRequest>(parsed);
  request.chat.generation.sampling = resolve_sampling(ctx, request.sampling);

  auto prompt = prepare_chat_prompt(ctx, request.chat);
  if (auto* e = std::get_if<ApiError>(&prompt)) return send_anthropic_error(*res, *e);
  const ChatPrompt& chat_prompt = std::get<ChatPrompt>(prompt);

  const std::string model = request.model.empty() ? ctx.options.model_id : request.model;
  auto call =
      std::make_shared<MessagesCall>(ctx, res, model, request.stream, static_cast<int32_t>(chat_prompt.ids.size()));
  ChatCallbacks callbacks;
  callbacks.on_delta = [call](const OutputDelta& d, const GenerationEvent&) { call->on_delta(d); };
  callbacks.on_done = [call](const ChatResult& r) { call->on_done(r); };

  auto started = ChatStream::start(ctx, chat_prompt, std::move(request.chat.generation), std::move(callbacks));
  if (auto* e = std::get_if<ApiError>(&started)) return send_anthropic_error(*res, *e);
  {
    std::lock_guard lk(call->mu);
    // Headers and message_start go out now, not with the first token, so the
    // client sees the stream open during prefill.
    call->begin_stream();
  }
  // The ChatStream is only a handle (the generation does not depend on it);
  // cancelling a finished request is a no-op.
  res->on_disconnect([stream = std::get<std::shared_ptr<ChatStream>>(std::move(started))] { stream->cancel(); });
}

void handle_count_tokens(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res) {
  auto parsed = parse_anthropic_request(req.body, /*count_tokens=*/true);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_anthropic_error(*res, *e);
  const AnthropicRequest& request = std::get<AnthropicRequest>(parsed);
  auto prompt = prepare_chat_prompt(ctx, request.chat);
  if (auto* e = std::get_if<ApiError>(&prompt)) return send_anthropic_error(*res, *e);
  nlohmann::ordered_json body = {{"input_tokens", std::get<ChatPrompt>(prompt).ids.size()}};
  res->send(200, "application/json", dump_json(body));
}

}  // namespace rill::server
