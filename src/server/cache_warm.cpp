// POST /v1/cache/warm: {"prompt": "text" | [token ids]} or {"messages": [...]}
//   -> 200 {"object": "cache.warm", "tokens": M, "cached_tokens": N}
// 400 naming the field for bad input or a server without a disk tier.
#include "server/cache_warm.h"

#include <memory>
#include <utility>

#include "model/model.h"
#include "server/api_handlers.h"
#include "server/chat_stream.h"
#include "server/errors.h"
#include "server/field_reader.h"
#include "server/openai_common.h"
#include "text/tokenizer.h"

namespace rill::server {

Result<std::vector<int32_t>> cache_warm_text_ids(const Engine& engine, const std::string& text) {
  const Tokenizer* tok = engine.tokenizer();
  if (tok == nullptr) return Error{"prompt: this model has no tokenizer"};
  std::vector<int32_t> ids = tok->encode(text, /*add_special=*/true, /*parse_special=*/true);
  if (ids.empty() || text.empty()) return Error{"prompt: the prompt is empty"};
  return ids;
}

Result<std::vector<int32_t>> cache_warm_chat_ids(const ServerContext& ctx, const nlohmann::ordered_json& messages) {
  ChatInput in;
  in.messages = messages;
  in.add_generation_prompt = false;
  return render_chat_prompt(ctx, in, nullptr);
}

namespace {

// prompt: [id, ...], every id inside the vocabulary.
Result<std::vector<int32_t>> cache_warm_id_prompt(const Engine& engine, const nlohmann::ordered_json& prompt) {
  if (prompt.empty()) return Error{"prompt: the prompt is empty"};
  const int64_t n_vocab = engine.model().n_vocab();
  std::vector<int32_t> ids;
  ids.reserve(prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) {
    const auto& x = prompt[i];
    const std::optional<int64_t> id = json_integer(x);  // the integer rule (field_reader.h)
    if (!id || *id < 0 || *id >= n_vocab) {
      return Error{"prompt: element " + std::to_string(i) + " (" + x.dump() + ") is not a token id of this model (0.." +
                   std::to_string(n_vocab - 1) + ")"};
    }
    ids.push_back(static_cast<int32_t>(*id));
  }
  return ids;
}

}  // namespace

Status submit_cache_warm(Engine& engine, std::vector<int32_t> ids, std::function<void(Result<CacheWarmResult>)> done) {
  GenerationRequest r;
  r.prompt = std::move(ids);
  r.max_tokens = 1;
  r.sampling.temperature = 0.0f;
  r.persist_prefix = true;
  auto shared_done = std::make_shared<std::function<void(Result<CacheWarmResult>)>>(std::move(done));
  auto id = engine.submit(std::move(r), [shared_done](GenerationEvent&& ev) {
    if (!ev.finished) return;
    if (ev.finish_reason == FinishReason::kError || ev.finish_reason == FinishReason::kAborted) {
      (*shared_done)(Error{ev.error.empty() ? std::string("cache warm: the request was aborted") : ev.error});
      return;
    }
    (*shared_done)(CacheWarmResult{ev.usage.prompt_tokens, ev.usage.persisted_tokens});
  });
  if (!id.ok()) return id.error();
  return Status::Ok();
}

void handle_cache_warm(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res) {
  using openai::ojson;
  auto parsed = openai::parse_body(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(*res, *e);
  const ojson& body = std::get<ojson>(parsed);
  const bool has_prompt = body.contains("prompt") && !body["prompt"].is_null();
  const bool has_messages = body.contains("messages") && !body["messages"].is_null();
  if (has_prompt == has_messages) {
    return send_error(*res,
                      field_error(has_prompt ? "messages" : "prompt",
                                  "send exactly one of prompt (a string or token ids) or messages (chat messages)"));
  }
  if (!ctx.engine.stats().disk_tier.enabled) {
    return send_error(*res, ApiError(400, "this server has no disk cache tier: start rill serve with --cache-dir"));
  }
  Result<std::vector<int32_t>> ids = Error{""};
  if (has_prompt && body["prompt"].is_array()) {
    ids = cache_warm_id_prompt(ctx.engine, body["prompt"]);
  } else if (has_prompt) {
    if (!body["prompt"].is_string()) {
      return send_error(*res, field_error("prompt", "expected a string or an array of token ids"));
    }
    ids = cache_warm_text_ids(ctx.engine, body["prompt"].get<std::string>());
  } else {
    ids = cache_warm_chat_ids(ctx, body["messages"]);
  }
  if (!ids.ok()) return send_error(*res, api_error_from(ids.error()));
  const int64_t room = max_sequence_tokens(ctx.engine) - static_cast<int64_t>(ids->size());
  if (room < 1) {
    return send_error(*res, api_error_from(Error{std::string(has_prompt ? "prompt" : "messages") + ": the prompt (" +
                                                 std::to_string(ids->size()) + " tokens) does not fit the context of " +
                                                 std::to_string(max_sequence_tokens(ctx.engine)) + " tokens"}));
  }
  Status st = submit_cache_warm(ctx.engine, std::move(ids).value(), [res](Result<CacheWarmResult> r) {
    if (!r.ok()) return send_error(*res, ApiError(500, r.error().message, "server_error"));
    ojson reply = {{"object", "cache.warm"}, {"tokens", r->tokens}, {"cached_tokens", r->cached_tokens}};
    res->send(200, "application/json", reply.dump(), {});
  });
  if (!st.ok()) send_error(*res, api_error_from(st.error()));
}

}  // namespace rill::server
