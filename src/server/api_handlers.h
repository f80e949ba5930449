#pragma once
// The API routes (registered by server/app.cpp). Each handler validates its
// request (400 naming the field, in the API's error shape), then either
// replies at once or streams; it never blocks the I/O thread.
#include <memory>

#include "server/http.h"
#include "server/server_context.h"

namespace rill::server {

// OpenAI (server/openai_chat.cpp, server/openai_completions.cpp)
void handle_chat_completions(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res);
void handle_completions(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res);
// OpenAI Responses (server/responses_api.cpp): POST /v1/responses,
// GET /v1/responses/{id}, DELETE /v1/responses/{id} (id = the path's last part).
void handle_responses_create(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res);
void handle_responses_get(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res);
void handle_responses_delete(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res);
void handle_responses_input_items(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res);
// Anthropic (server/anthropic_api.cpp)
void handle_messages(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res);
void handle_count_tokens(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res);
// Embeddings (server/embeddings.cpp): POST /v1/embeddings.
void handle_embeddings(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res);
// Prefix-cache warm-up (server/cache_warm.cpp): POST /v1/cache/warm.
void handle_cache_warm(ServerContext& ctx, const HttpRequest& req, std::shared_ptr<Responder> res);

}  // namespace rill::server
